"""A pg_auto_failover formation on this machine, owned by one test: a monitor, a primary and a
synchronous standby, each its own `pg_autoctl` service with its own port and data folder under
one temporary directory, torn down with it.

Needs the Debian packages `pg-auto-failover-cli` and `postgresql-<major>-auto-failover`.
`pg_autoctl` refuses to run as root, so as root its services run as the `postgres` user.

Failover detection is tuned down from the production defaults (health checks every 5 s,
a node unhealthy after 20 s, 30 s for a lost primary to demote itself) to about a second each,
so a SIGKILLed primary is replaced within seconds and the suite stays short (bench/README.md has
the measured times; docs/failure-model.md says what the defaults give in production).
"""

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Monitor settings (milliseconds). primary_demote_timeout is how long the monitor waits for a
# lost primary to stop accepting writes before it lets the standby take them; it must stay
# above what the keeper needs to notice it is cut off, which on one machine is immediate.
FAST_MONITOR = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 2000,
    "pgautofailover.primary_demote_timeout": 3000,
    "pgautofailover.startup_grace_period": 2000,
}


def pg_bindir() -> Path:
    """The PostgreSQL whose pgautofailover extension is installed."""
    for lib in sorted(glob.glob("/usr/lib/postgresql/*/lib/pgautofailover.so"), reverse=True):
        return Path(lib).parent.parent / "bin"
    raise RuntimeError(
        "pg_auto_failover is not installed: apt-get install pg-auto-failover-cli postgresql-15-auto-failover"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    port: int
    pgdata: Path
    popen: subprocess.Popen | None = None
    log: Path | None = None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class AutoFailoverCluster:
    def __init__(self, *, dbname: str = "scheduler", monitor_settings: dict | None = None, standbys: int = 1):
        if shutil.which("pg_autoctl") is None:
            raise RuntimeError("pg_autoctl is missing: apt-get install pg-auto-failover-cli postgresql-15-auto-failover")
        self.bindir = pg_bindir()
        self.dbname = dbname
        self.monitor_settings = FAST_MONITOR if monitor_settings is None else monitor_settings
        self.root = Path(tempfile.mkdtemp(prefix="sched-pgaf-"))
        self.as_root = os.geteuid() == 0
        if self.as_root:
            pw = pwd.getpwnam("postgres")
            self.uid, self.gid = pw.pw_uid, pw.pw_gid
            os.chown(self.root, self.uid, self.gid)
        self.env = {
            "PATH": f"{self.bindir}:/usr/bin:/bin",
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            # pg_autoctl keeps its configuration, state and pid files under these.
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_DATA_HOME": str(self.root / "share"),
            "XDG_RUNTIME_DIR": str(self.root / "run"),
        }
        self.monitor = Node("monitor", free_port(), self.root / "monitor")
        self.nodes = [Node(f"node{i}", free_port(), self.root / f"node{i}") for i in range(1, standbys + 2)]

    # -- processes --------------------------------------------------------------------------

    def _popen(self, argv, log: Path) -> subprocess.Popen:
        out = open(log, "ab")
        try:
            kwargs = self._as_postgres()
            # A session of its own: killing the group kills the keeper and its PostgreSQL together,
            # as a machine that loses power would.
            return subprocess.Popen(argv, env=self.env, cwd=self.root, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, **kwargs)
        finally:
            out.close()

    def _run(self, node: Node, create_args: list | None) -> None:
        node.log = self.root / f"{node.name}.log"
        argv = ["pg_autoctl", *(create_args or ["run"]), "--pgdata", str(node.pgdata)]
        if create_args:
            argv.append("--run")
        node.popen = self._popen(argv, node.log)

    def start(self, timeout: float = 120.0) -> "AutoFailoverCluster":
        for d in ("config", "share", "run"):
            (self.root / d).mkdir()
            if self.as_root:
                os.chown(self.root / d, self.uid, self.gid)
        common = ["--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", str(self.bindir / "pg_ctl")]
        self._run(self.monitor, ["create", "monitor", "--pgport", str(self.monitor.port), *common])
        self._wait(lambda: self._monitor_ready(), timeout, "the monitor to accept connections")
        with self.monitor_connection() as c:
            for name, value in self.monitor_settings.items():
                c.execute(f"ALTER SYSTEM SET {name} = {int(value)}")
            c.execute("SELECT pg_reload_conf()")
        for i, node in enumerate(self.nodes):
            self._run(node, ["create", "postgres", "--pgport", str(node.port), "--name", node.name,
                             "--dbname", self.dbname, "--monitor", self.monitor_uri, *common])
            # The first node must be the primary before the second clones it.
            want = ["single"] if i == 0 else None
            self._wait(lambda: self.settled(want, nodes=i + 1), timeout, f"{node.name} to join")
            if i == 0:
                # pg_basebackup asks for a spread checkpoint, paced over most of
                # checkpoint_timeout, and CREATE DATABASE has just dirtied thousands of buffers.
                # Flushed now, the standby's clone starts at once.
                import psycopg

                with psycopg.connect(self.node_url(node), autocommit=True) as c:
                    c.execute("CHECKPOINT")
        return self

    def stop(self) -> None:
        for node in [*self.nodes, self.monitor]:
            if node.alive():
                # SIGQUIT: pg_autoctl stops its PostgreSQL in immediate mode, which also frees its
                # shared memory (a SIGKILL of everything would leave the segments behind).
                node.popen.send_signal(signal.SIGQUIT)
        for node in [*self.nodes, self.monitor]:
            if node.popen is None:
                continue
            try:
                node.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            self._killpg(node)
        shutil.rmtree(self.root, ignore_errors=True)

    def _killpg(self, node: Node) -> None:
        try:
            os.killpg(node.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        node.popen.wait()
        # Until the last backend is gone: one still holding the shared memory makes the restarted
        # node's crash recovery for pg_rewind fail ("shared memory block is still in use"), and
        # pg_auto_failover then falls back to a full clone.
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                os.killpg(node.popen.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    # -- faults -----------------------------------------------------------------------------

    def kill(self, node: Node) -> None:
        """SIGKILL the node's keeper and every PostgreSQL process of it at once."""
        self._killpg(node)

    def restart(self, node: Node) -> None:
        """Start a node's service again, as its supervisor would; the monitor has it rejoin as a
        standby (pg_rewind) if the other node was promoted meanwhile."""
        self._run(node, None)

    def number_sync_standbys(self) -> int:
        """How many standbys a commit waits for: the formation's setting, which pg_auto_failover
        raises to one by itself once a second standby joins."""
        with self.monitor_connection() as c:
            return c.execute("SELECT number_sync_standbys FROM pgautofailover.formation"
                             " WHERE formationid = 'default'").fetchone()[0]

    def _as_postgres(self) -> dict:
        return {"user": self.uid, "group": self.gid, "extra_groups": []} if self.as_root else {}

    def switchover(self) -> subprocess.Popen:
        """Start a planned switchover (it returns when the formation is settled again)."""
        return self._popen(["pg_autoctl", "perform", "switchover", "--pgdata", str(self.monitor.pgdata),
                            "--formation", "default", "--wait", "120"], self.root / "switchover.log")

    # -- state ------------------------------------------------------------------------------

    @property
    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover?sslmode=disable"

    def url(self, **query) -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        q = "&".join(f"{k}={v}" for k, v in {"target_session_attrs": "read-write", **query}.items())
        return f"postgres://postgres@{hosts}/{self.dbname}?{q}"

    def node_url(self, node: Node) -> str:
        return f"postgres://postgres@127.0.0.1:{node.port}/{self.dbname}"

    def monitor_connection(self):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.monitor.port, user="postgres",
                               dbname="pg_auto_failover", autocommit=True, connect_timeout=3)

    def _monitor_ready(self) -> bool:
        try:
            with self.monitor_connection() as c:
                return c.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pgautofailover'").fetchone()[0] == 1
        except Exception:
            return False

    def states(self) -> dict:
        """{node name: (reported state, goal state)} as the monitor sees them."""
        with self.monitor_connection() as c:
            rows = c.execute("SELECT nodename, reportedstate, goalstate FROM pgautofailover.node").fetchall()
        return {name: (str(reported), str(goal)) for name, reported, goal in rows}

    def settled(self, want: list | None = None, nodes: int | None = None) -> bool:
        """Every node where the monitor wants it: one primary, the other nodes (all of them unless
        `nodes` says how many are registered yet) its secondaries (`want` overrides the expected
        states, e.g. ["single"] for a lone first node)."""
        try:
            states = self.states()
        except Exception:
            return False
        reported = {r for r, g in states.values() if r == g}
        if len(reported) != len(set(states.values())) or any(r != g for r, g in states.values()):
            return False
        count = len(self.nodes) if nodes is None else nodes
        return sorted(r for r, _ in states.values()) == sorted(want or ["primary", *["secondary"] * (count - 1)])

    def synchronous(self) -> bool:
        """Settled, and the primary's commits wait for the standby: PostgreSQL lists a standby in
        `synchronous_standby_names` and streams to it as `sync` or `quorum`. This is
        the precondition of the failover promise; pg_auto_failover drops it (`wait_primary`)
        whenever the standby looks unhealthy, which a busy host makes happen."""
        import psycopg

        if not self.settled():
            return False
        try:
            with psycopg.connect(self.node_url(self.primary()), autocommit=True, connect_timeout=2) as c:
                names = c.execute("SHOW synchronous_standby_names").fetchone()[0]
                rows = c.execute(
                    "SELECT sync_state, state FROM pg_stat_replication").fetchall()
        except Exception:
            return False
        return bool(names.strip()) and any(sync in {"sync", "quorum"} and state == "streaming"
                                           for sync, state in rows)

    def wait_synchronous(self, timeout: float, what: str) -> float:
        return self._wait(self.synchronous, timeout, what)

    def state_changes(self, since) -> list[tuple]:
        """The monitor's own record of node state changes since `since` (a datetime):
        (time, node, reported state, goal state, description)."""
        with self.monitor_connection() as c:
            return c.execute(
                "SELECT eventtime, nodename, reportedstate::text, goalstate::text, description"
                " FROM pgautofailover.event WHERE eventtime >= %s ORDER BY eventid", [since]).fetchall()

    def primary(self) -> Node:
        states = self.states()
        for node in self.nodes:
            if states.get(node.name, ("", ""))[0] in {"primary", "wait_primary", "single"}:
                return node
        raise RuntimeError(f"no primary: {states}")

    def writable(self, node: Node) -> bool:
        """The node takes writes: the monitor has it as primary (in stop_replication it is
        promoted but still holds writes back until the old primary is known to be gone), and
        PostgreSQL agrees."""
        import psycopg

        try:
            if self.states().get(node.name, ("", ""))[0] not in {"wait_primary", "primary"}:
                return False
            with psycopg.connect(self.node_url(node), autocommit=True, connect_timeout=2) as c:
                return not c.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        except Exception:
            return False

    def wait_settled(self, timeout: float, what: str) -> float:
        """Until one primary and one synchronous secondary. A node that rejoins by a full clone
        (pg_basebackup: when pg_rewind cannot be used) waits for a spread checkpoint on the
        primary, paced over most of checkpoint_timeout; a CHECKPOINT makes the one in progress
        finish at once, so one is asked for every few seconds while waiting."""
        last = [time.monotonic()]

        def ok():
            if self.settled():
                return True
            if time.monotonic() - last[0] > 3:
                last[0] = time.monotonic()
                try:
                    import psycopg

                    with psycopg.connect(self.node_url(self.primary()), autocommit=True, connect_timeout=2) as c:
                        c.execute("CHECKPOINT")
                except Exception:
                    pass
            return False

        return self._wait(ok, timeout, what)

    def _wait(self, ok, timeout: float, what: str) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if ok():
                return time.monotonic() - started
            time.sleep(0.1)
        raise TimeoutError(f"waited {timeout:.0f}s for {what}; states: {self._safe_states()}\n{self.tail_logs()}")

    def wait(self, ok, timeout: float, what: str) -> float:
        return self._wait(ok, timeout, what)

    def _safe_states(self):
        try:
            return self.states()
        except Exception as exc:
            return f"monitor unreachable: {exc}"

    def tail_logs(self, lines: int = 15) -> str:
        out = []
        for node in [self.monitor, *self.nodes]:
            if node.log and node.log.exists():
                text = node.log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {node.name} ---\n" + "\n".join(text))
        return "\n".join(out)
