"""Forecast fold: what folding the deltas into the kept summary costs, the whole summary rewritten
(as the fold did before) against only the keys the deltas touch (as it does now), interleaved.

    .venv/bin/python bench/forecast_fold.py [--groups 300000] [--moves 20000] [--rounds 3]

The summary is loaded with --groups rows, each its own key (a fleet of rate() schedules with
their own anchors and seconds has about a key per schedule: the soak's 300,000 schedules kept
300,045), and --moves scanner-style advances as deltas (-1 for the key a schedule left, +1 for the
one it entered). Each round runs one fold of each kind in a transaction that is rolled back, and
prints its time and the WAL it wrote; both must leave the same summary (checked once).

Database: scheduler_bench_forecast_fold (dropped and made again).
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

# The fold as it was before: every summary row deleted and the summary inserted again.
REWRITE_SQL = """
WITH d AS (DELETE FROM dispatch_forecastdelta RETURNING {cols}, n),
     g AS (DELETE FROM dispatch_forecastgroup RETURNING {cols}, n)
INSERT INTO dispatch_forecastgroup ({cols}, n)
SELECT {cols}, sum(n) FROM (SELECT * FROM d UNION ALL SELECT * FROM g) x
GROUP BY {cols} HAVING sum(n) <> 0
"""

LOAD_GROUPS_SQL = """
INSERT INTO dispatch_forecastgroup ({cols}, n)
SELECT '00000000-0000-4000-8000-000000000001'::uuid, 'rate(10 minutes)', 'UTC', 'skip', 'first', NULL,
       now() - (i || ' seconds')::interval, now() + (i || ' seconds')::interval, 0, 0, 'http://t.example', 1
FROM generate_series(1, %(groups)s) i
"""

# Schedule i moves from its key to the one 600 s later (a new key: its next run).
LOAD_DELTAS_SQL = """
INSERT INTO dispatch_forecastdelta ({cols}, n)
SELECT '00000000-0000-4000-8000-000000000001'::uuid, 'rate(10 minutes)', 'UTC', 'skip', 'first', NULL,
       now() - (i || ' seconds')::interval, now() + ((i + m) || ' seconds')::interval, 0, 0, 'http://t.example', d
FROM generate_series(1, %(moves)s) i, (VALUES (0, -1), (600, 1)) v(m, d)
"""


def one(sql: str) -> tuple[float, int, list]:
    """Time and WAL bytes of one fold, rolled back; the summary it left (for the check)."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn()")
        lsn = cur.fetchone()[0]
        t = time.perf_counter()
        cur.execute(sql)
        took = time.perf_counter() - t
        cur.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", [lsn])
        wal = int(cur.fetchone()[0])
        cur.execute("SELECT next_run_at, anchored, n FROM dispatch_forecastgroup ORDER BY 1, 2")
        left = cur.fetchall()
        transaction.set_rollback(True)
    return took, wal, left


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=300_000)
    ap.add_argument("--moves", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    C.setup_database("scheduler_bench_forecast_fold")
    from dispatch import forecast_store

    cols = forecast_store.COLS
    C.sql(LOAD_GROUPS_SQL.format(cols=cols), {"groups": args.groups}, fetch=False)
    C.sql(LOAD_DELTAS_SQL.format(cols=cols), {"moves": args.moves}, fetch=False)
    C.vacuum_analyze("dispatch_forecastgroup", "dispatch_forecastdelta")
    print(C.machine_line(C.server_version()))
    print(f"summary {args.groups:,} keys, {2 * args.moves:,} deltas ({args.moves:,} moves); load average "
          + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    kinds = {"whole summary rewritten (before)": REWRITE_SQL.format(cols=cols),
             "touched keys only (now)": forecast_store._FOLD_POSTGRES}
    times = {k: [] for k in kinds}
    wals = {k: [] for k in kinds}
    left = {}
    for r in range(args.rounds):
        for name, sql in (kinds.items() if r % 2 == 0 else reversed(kinds.items())):
            took, wal, left[name] = one(sql)
            times[name].append(took)
            wals[name].append(wal)
            print(f"  round {r + 1} {name:34s} {took:7.3f} s  WAL {wal / 1e6:7.1f} MB")
    same = len({tuple(v) for v in left.values()}) == 1
    print(f"\nsame summary after either fold: {same}")
    base = "whole summary rewritten (before)"
    for name in kinds:
        t, w = C.median(times[name]), C.median(wals[name])
        print(f"  {name:34s} median {t:7.3f} s ({t / C.median(times[base]):.2f}x), WAL {w / 1e6:7.1f} MB "
              f"({w / C.median(wals[base]):.2f}x)")
    print("load average at the end " + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
