"""The durability-first formation (docs/failure-model.md): a primary and two standbys, commits
waiting for either (pg_auto_failover's number_sync_standbys = 1, which it sets by itself once a
second standby joins). Where the two-node formation turns synchronous replication off while its
one standby looks unhealthy, this one keeps every commit on a second node through the loss of
either standby; a primary lost after that loses nothing.

Uses its own formation (four PostgreSQL instances: a monitor and three data nodes)."""

import threading
import time

import psycopg
import pytest

from tests.faults.pgcluster import AutoFailoverCluster

pytestmark = [pytest.mark.faults]


class Ledger:
    """Inserts rows one commit at a time through the formation's multi-host URL and keeps the ids
    whose COMMIT returned: each of them was acknowledged, so each must survive a failover."""

    def __init__(self, url: str):
        self.url = url
        self.acknowledged: list[int] = []
        self.commit_seconds: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as c:
                    while not self.stop.is_set():
                        t = time.monotonic()
                        row = c.execute("INSERT INTO ledger DEFAULT VALUES RETURNING id").fetchone()
                        self.commit_seconds.append(time.monotonic() - t)
                        self.acknowledged.append(row[0])
                        time.sleep(0.01)
            except psycopg.Error:
                time.sleep(0.2)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)


def replication(cluster, node):
    with psycopg.connect(cluster.node_url(node), autocommit=True, connect_timeout=3) as c:
        return (c.execute("SHOW synchronous_standby_names").fetchone()[0],
                sorted(c.execute("SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'").fetchall()))


def test_with_two_standbys_a_lost_standby_keeps_commits_synchronous_and_a_failover_loses_none():
    cluster = AutoFailoverCluster(standbys=2, dbname="durability")
    try:
        cluster.start(timeout=180)
        assert cluster.number_sync_standbys() == 1
        cluster.wait_synchronous(60, "both standbys in the quorum")
        primary = cluster.primary()
        first, second = [n for n in cluster.nodes if n is not primary]
        names, streaming = replication(cluster, primary)
        assert names.startswith("ANY 1 (") and streaming == [("quorum",), ("quorum",)]
        with psycopg.connect(cluster.node_url(primary), autocommit=True) as c:
            c.execute("CREATE TABLE ledger (id bigserial PRIMARY KEY)")

        with Ledger(cluster.url()) as ledger:
            # One standby lost: commits still wait for the other, and never stop.
            cluster.kill(first)
            time.sleep(6)  # past the monitor's unhealthy timeout (tests/faults/pgcluster.py)
            assert cluster.states()[primary.name] == ("primary", "primary"), cluster.states()
            names, streaming = replication(cluster, primary)
            assert names.startswith("ANY 1 (") and streaming == [("quorum",)]
            during = len(ledger.acknowledged)
            time.sleep(2)
            assert len(ledger.acknowledged) > during, "commits stopped with one standby lost"

            cluster.restart(first)
            cluster.wait_settled(120, "the lost standby to rejoin")
            cluster.wait_synchronous(60, "both standbys in the quorum again")
            # The primary lost while commits flow: the standby promoted has every one of them.
            cluster.kill(primary)
            cluster.wait(lambda: any(cluster.writable(n) for n in (first, second)), 120, "a promotion")
            time.sleep(1)
        new = next(n for n in (first, second) if cluster.writable(n))
        with psycopg.connect(cluster.node_url(new), autocommit=True) as c:
            present = {r[0] for r in c.execute("SELECT id FROM ledger").fetchall()}
        missing = [i for i in ledger.acknowledged if i not in present]
        print(f"\nacknowledged={len(ledger.acknowledged)} missing={len(missing)} "
              f"commit p50={sorted(ledger.commit_seconds)[len(ledger.commit_seconds) // 2] * 1000:.1f} ms")
        assert len(ledger.acknowledged) > 100
        assert missing == []
    finally:
        cluster.stop()
