"""What the schedule table's indexes cost the scanner's advance (issue 32's list indexes): the
scanner's own statement (runs.store.postgres.ADVANCE_SCHEDULES_SQL, ScheduleAdvance, as
schedule_advance_many sends it) over N schedules in batches, with the index set before migration
schedules/0013 ("before": the tenant foreign key's index, (tenant, -created_at), (owner,
-created_at)) and as migrated ("after": (-created_at, -id), (tenant, -created_at, -id), (owner,
-created_at, -id), no foreign-key index), in interleaved rounds in one command. Every advance moves
next_run_at, an indexed column (schedule_due_idx), so none is a HOT update and each writes one entry
into every index of the row. Printed per round and as medians: the PostgreSQL backend's CPU per
schedule (from /proc), WAL bytes per schedule, and after/before.

    .venv/bin/python bench/schedule_index_ab.py [--schedules 200000] [--advance 100000] [--batch 500] [--rounds 5]

Database: scheduler_bench_schedule_index_ab (dropped and made again).
"""

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

AFTER = ["schedule_list_idx", "schedule_tenant_list_idx", "schedule_owner_list_idx"]
BEFORE = [
    ("schedules_schedule_tenant_id_43ce440f", "CREATE INDEX {} ON schedules_schedule (tenant_id)"),
    ("schedule_tenant_created_idx", "CREATE INDEX {} ON schedules_schedule (tenant_id, created_at DESC)"),
    ("schedule_owner_created_idx",
     "CREATE INDEX {} ON schedules_schedule (owner_id, created_at DESC) WHERE owner_id IS NOT NULL"),
]


def index_set(which: str, defs: dict) -> None:
    """Make the schema's schedule indexes those of `which` ("before" or "after")."""
    present = {r[0] for r in C.sql("SELECT indexname FROM pg_indexes WHERE tablename = 'schedules_schedule'")}
    want_before = which == "before"
    for name, ddl in BEFORE:
        if want_before and name not in present:
            C.sql(ddl.format(name), fetch=False)
        if not want_before and name in present:
            C.sql(f'DROP INDEX "{name}"', fetch=False)
    for name in AFTER:
        if want_before and name in present:
            C.sql(f'DROP INDEX "{name}"', fetch=False)
        if not want_before and name not in present:
            C.sql(defs[name], fetch=False)


def one_round(ids, batch, backend) -> dict:
    from django.db import connection

    from runs.store.postgres import ADVANCE_SCHEDULES_SQL

    C.vacuum_analyze("schedules_schedule")
    wal0 = C.sql("SELECT pg_current_wal_lsn()")[0][0]
    pg0, t0 = C.proc_cpu(backend), time.perf_counter()
    with connection.cursor() as cur:
        for i in range(0, len(ids), batch):
            part = ids[i:i + batch]
            cur.execute("SELECT s.id, s.next_run_at FROM schedules_schedule s WHERE s.id = ANY(%s::uuid[])", [part])
            rows = cur.fetchall()
            cur.execute(ADVANCE_SCHEDULES_SQL, {
                "ids": [str(r[0]) for r in rows], "next": [r[1] + timedelta(minutes=1) for r in rows],
                "status": ["active"] * len(rows), "completed": [None] * len(rows), "errors": [""] * len(rows),
            })
    wall = time.perf_counter() - t0
    pg = C.proc_cpu(backend) - pg0
    wal = C.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [wal0])[0][0]
    n = len(ids)
    return {"cpu_us": pg / n * 1e6, "wall_us": wall / n * 1e6, "wal_b": float(wal) / n}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=200_000)
    ap.add_argument("--advance", type=int, default=100_000, help="schedules advanced per round")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(C.machine_line(), flush=True)
    C.setup_database("scheduler_bench_schedule_index_ab")
    defs = {r[0]: r[1] for r in C.sql("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'schedules_schedule'")}
    t = C.load_tenant("ab", "http://127.0.0.1:9/")
    s = C.load_schedules("ab", t, a.schedules, target_url="http://127.0.0.1:9/x", expression="rate(1 hour)",
                         next_run_at="now() + interval '1 day'")
    # Created over a year, as a fleet made by its services over time is (a bulk load's one created_at
    # would put every entry of the list indexes in id order, a shape no deployment has).
    C.sql("UPDATE schedules_schedule SET created_at = now() - random() * interval '365 days'", fetch=False)
    ids = [str(r[0]) for r in C.sql(f"SELECT id FROM schedules_schedule WHERE name LIKE 'ab-%%' ORDER BY random() "
                                    f"LIMIT {a.advance}")]
    backend = C.sql("SELECT pg_backend_pid()")[0][0]
    print(f"{s.count:,} schedules created over a year; each round advances {len(ids):,} of them in batches of {a.batch}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    got = {"before": [], "after": []}
    for r in range(a.rounds):
        for which in ("before", "after"):
            index_set(which, defs)
            f = one_round(ids, a.batch, backend)
            got[which].append(f)
            print(f"  round {r + 1} {which:6s}: PostgreSQL CPU {f['cpu_us']:6.1f} us, wall {f['wall_us']:6.1f} us, "
                  f"WAL {f['wal_b']:6.0f} B per schedule", flush=True)
    med = {w: {k: C.median([f[k] for f in fs]) for k in ("cpu_us", "wall_us", "wal_b")} for w, fs in got.items()}
    per = ", ".join(f"{af['cpu_us'] / bf['cpu_us']:.2f}" for bf, af in zip(got["before"], got["after"]))
    print(f"\nScheduleAdvance per schedule, median of {a.rounds}: before {med['before']['cpu_us']:.1f} us CPU, "
          f"{med['before']['wal_b']:.0f} B WAL; after {med['after']['cpu_us']:.1f} us CPU, {med['after']['wal_b']:.0f} B WAL")
    print(f"after / before: CPU {med['after']['cpu_us'] / med['before']['cpu_us']:.2f}x (per round: {per}), "
          f"WAL {med['after']['wal_b'] / med['before']['wal_b']:.2f}x; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    index_set("after", defs)


if __name__ == "__main__":
    main()
