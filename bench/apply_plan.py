"""Schedule sets (issue 30): the time to plan, and to apply, a set of 10,000 schedules through
runs.schedule_apply (what POST /api/v1/schedules/apply and `manage.py apply_schedules` call).

    .venv/bin/python bench/apply_plan.py [--schedules 10000] [--repeats 3]

Measured with perf_counter in this process against the bench database, each a median of --repeats:
- parse: the set's items checked as the API's create bodies (scheduler_project.web.schedule_set);
- plan, all new: the dry run of the set on an empty tenant (every item validated, the create check);
- apply, all new: the set created (one transaction; creates in batches of 1,000);
- plan, all unchanged: the dry run of the same set again (every item diffed against its version);
- plan, 1% edited: the dry run with every 100th item's expression changed.
Goal (issue 30): a plan of 10,000 schedules in well under a minute.

Database: scheduler_bench_apply (dropped and made again).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def items(n, *, edit_every=0):
    out = []
    for i in range(n):
        expression = f"{i % 60} {i % 24} * * *"
        if edit_every and i % edit_every == 0:
            expression = f"{(i + 1) % 60} {i % 24} * * *"
        out.append({"name": f"job-{i:05d}", "expression": expression, "timeZone": "Europe/Paris",
                    "target": {"url": f"http://127.0.0.1:9/hook/{i}"}, "payload": {"n": i},
                    "retryPolicy": {"maxAttempts": 3}})
    return out


def timed(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return C.median(times), times, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--database", default="scheduler_bench_apply")
    args = ap.parse_args()
    print(C.machine_line(), flush=True)
    C.setup_database(args.database)
    from django.conf import settings

    from runs.schedule_apply import apply_set
    from scheduler_project.web.schedule_set import declared_items
    from schedules.models import Schedule, Tenant
    from schedules.services import Actor

    settings.SCHEDULER_TARGET_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.SCHEDULER_MAX_APPLY_SCHEDULES = max(settings.SCHEDULER_MAX_APPLY_SCHEDULES, args.schedules)
    C.load_tenant("apply", "http://127.0.0.1:9/")
    Tenant.objects.filter(slug="apply").update(max_schedules=args.schedules + 1)
    by = Actor("system:bench")

    def tenant():
        return Tenant.objects.get(slug="apply")  # fresh each time: nothing cached from the last pass

    n = args.schedules
    raw, edited_raw = items(n), items(n, edit_every=100)
    rows = []
    med, times, declared = timed(lambda: declared_items(raw), args.repeats)
    rows.append(("parse", med, times))
    med, times, plan = timed(lambda: apply_set(tenant(), declared, dry_run=True, by=by), args.repeats)
    rows.append(("plan, all new", med, times))
    assert plan.counts()["create"] == n
    t = time.perf_counter()
    plan = apply_set(tenant(), declared, by=by)
    rows.append(("apply, all new", time.perf_counter() - t, None))
    assert plan.applied and Schedule.objects.filter(managed_name__isnull=False).count() == n
    C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
    med, times, plan = timed(lambda: apply_set(tenant(), declared, dry_run=True, by=by), args.repeats)
    rows.append(("plan, all unchanged", med, times))
    assert plan.counts()["unchanged"] == n
    edited = declared_items(edited_raw)
    med, times, plan = timed(lambda: apply_set(tenant(), edited, dry_run=True, by=by), args.repeats)
    rows.append(("plan, 1% edited", med, times))
    assert plan.counts()["edit"] == len(range(0, n, 100))
    t = time.perf_counter()
    plan = apply_set(tenant(), edited, by=by)
    rows.append(("apply, 1% edited", time.perf_counter() - t, None))
    print(f"\nschedule set of {n} schedules (median of {args.repeats} where several):")
    for label, med, times in rows:
        extra = f"  (runs: {', '.join(f'{x:.2f}' for x in times)} s)" if times else "  (once)"
        print(f"  {label:22s} {med:7.2f} s  {n / med:8.0f} schedules/s{extra}")


if __name__ == "__main__":
    main()
