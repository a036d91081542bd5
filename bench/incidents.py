"""The incidents loop at fleet scale (issue 29): what one `IncidentEvaluator.step()` costs as the
schedule count grows, whether it keeps up with a fleet dispatching 1,000,000 runs an hour, and
whether it ever holds up claiming or completing runs.

    .venv/bin/python bench/incidents.py [--sizes 100000,1000000,10000000] [--runs 20000]
        [--rounds 2] [--threads 3] [--reuse]

Loaded: one tenant with `--owners` owners (webhook channels: the incidents write notifications),
and its schedules in steps up to each of `--sizes` (bench.common.load_schedules_bulk: the rows
`create_schedule` makes for `rate(10 hours)` schedules created over the last ten hours, so the
fleet comes due at size / 10 runs an hour; at 10,000,000 that is 1,000,000 an hour). A sample
of them is checked against the time engine (next_run_at = the rule's first instant after the
anchor).

At each size:

(a) a backlog of the outbox as 1,000,000 runs an hour make it: `--runs` runs, each of a
    different schedule spread over the whole fleet (uuid keys: random places in every index),
    their run.created, run.leased and run.succeeded events; `--fail-share` of them are runs of
    a few failing schedules (run.leased and run.retry_scheduled for each of max_attempts
    attempts, then run.dead), so failure streaks grow, incidents open once a schedule has failed
    SCHEDULER_INCIDENT_FAILURES times and are added to afterwards. Events in the order a live
    fleet writes them. Printed: one full step (BATCH events) in time, SQL statements and rows
    read per table (pg_stat_user_tables: tuples read by sequential scans + fetched through
    indexes, around the step, this backend's counts flushed first), the median of `--passes`;
    the missed-start probe over PROBE_BATCH ready runs past their grace.
(b) events evaluated per second (BATCH / median step) against the arrival rate of that fleet's
    events at 1,000,000 runs an hour (events per run of the mix x 277.8 runs/s): the ratio.
(c) at the largest size (or every size with --interfere-all): `--threads` threads claim and
    complete ready runs with the product's runs.queue.claim / runs.queue.complete (each thread
    its own connection, batches of `--batch`, `--fail-share` failing), with and without the
    incidents loop (a process of its own stepping IncidentEvaluator, the missed-start probe and the
    dead-letter check on every step, harsher than the shipped five seconds) beside them, in
    interleaved rounds (ABBA). Printed: claim and complete latency p50/p99 and throughput per
    side and their ratio; lock waits seen by a sampler of pg_locks every 20 ms (any ungranted
    lock in the bench database, and whether the incidents loop's backend held what was waited
    for), and errors under lock_timeout on every claiming connection.

Database: scheduler_bench_<--database suffix> (dropped and made again unless --reuse).
"""

import argparse
import multiprocessing
import queue as queue_mod
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

TAG = "inc"
RUNS_PER_HOUR = 1_000_000
FAILING_SCHEDULES = 40
LOCK_TIMEOUT = "2s"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def schedule_count() -> int:
    return C.sql("SELECT count(*) FROM schedules_schedule")[0][0]


def reset_run_side() -> None:
    """Empty runs, events and everything the incidents loop wrote; the schedules stay."""
    C.sql("TRUNCATE runs_outboxevent, runs_attempt, runs_run, runs_occurrence, dispatch_notification, "
          "dispatch_incident, dispatch_failurestreak, dispatch_deadminute, dispatch_incidentcursor", fetch=False)
    C.sql("DELETE FROM schedules_auditentry WHERE actor = 'system:incidents'", fetch=False)


def load_runs(total: int, n: int, *, fail_every: int, at_sql: str, state: str, tenant_id: str, tag: str) -> None:
    """Runs 1..n (ids md5(tag:r:i)) of schedules spread over the whole fleet of `total`: run i is
    of schedule 1 + (i - 1) * stride, and every `fail_every`-th run of one of the last
    FAILING_SCHEDULES schedules (the failing ones, beyond every strided one). Each run's
    scheduled_time is `at_sql` less i ms (unique per schedule)."""
    from django.db import transaction

    from runs.models import Occurrence, OutboxEvent, Run
    from schedules.timeexpr import tzdata_version

    stride = max(1, (total - FAILING_SCHEDULES) // n)
    k = (f"(CASE WHEN mod(n, {fail_every}) = 0 THEN {total} - mod(n / {fail_every}, {FAILING_SCHEDULES}) "
         f"ELSE 1 + (n - 1) * {stride} END)")
    sid = f"md5('{TAG}:s:' || {k})::uuid"
    at = f"(({at_sql}) - make_interval(secs => n / 1000.0))"
    with transaction.atomic():
        C.insert_series(Occurrence, n, exprs={
            "id": C.uid(tag, "o"), "schedule_id": sid, "version_id": k, "scheduled_time": at,
            "local_wall_time": f"to_char({at} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS')",
            "local_time": f"to_char({at} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || '+00:00'"},
            values={"schedule_version": 1, "time_zone": "UTC", "tzdata_version": tzdata_version(), "kind": "scheduled"})
        C.insert_series(Run, n, exprs={
            "id": C.uid(tag, "r"), "occurrence_id": C.uid(tag, "o"), "tenant_id": f"'{tenant_id}'",
            "schedule_id": sid, "version_id": k, "scheduled_time": at,
            "next_eligible_at": at if state == "ready" else "NULL",
            "finished_at": "NULL" if state == "ready" else f"{at} + interval '1 minute'",
            "first_started_at": "NULL" if state == "ready" else at,
            "generation": "0" if state == "ready" else "1", "attempts_used": "0" if state == "ready" else "1"},
            values={"schedule_version": 1, "kind": "scheduled", "state": state, "max_attempts": 5})
        C.insert_series(OutboxEvent, n, exprs={
            "event_id": "gen_random_uuid()", "tenant_id": f"'{tenant_id}'", "run_id": C.uid(tag, "r"),
            "kind": "'run.created'", "created_at": "now() - interval '2 minutes'",
            "payload": f"jsonb_build_object('runId', {C.uid(tag, 'r')}::text, 'scheduleId', {sid}::text, "
                       f"'scheduleVersion', 1, 'state', 'ready')"})


def load_backlog(n: int, *, fail_every: int, tenant_id: str, tag: str, attempts: int = 5) -> int:
    """The transitions of runs 1..n after their run.created, as the fleet writes them: a
    succeeding run is leased then succeeded; a failing run is leased and retry_scheduled for
    each attempt but the last, then leased and dead. In order of when they happen (runs
    arriving at 1,000,000 an hour, a retry some seconds after its attempt). Returns how many."""
    last = 2 * attempts  # step j of a failing run: odd = leased (generation (j+1)/2), even = failed
    C.sql(f"""
        INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at,
                                      publish_attempts, last_error, published_at)
        SELECT gen_random_uuid(), '{tenant_id}'::uuid, r, kind,
               CASE WHEN kind = 'run.leased' THEN jsonb_build_object('runId', r::text, 'generation', g,
                                                   'workerId', 'bench', 'state', 'leased')
                    ELSE jsonb_build_object('runId', r::text, 'generation', g, 'state', st, 'nextEligibleAt', NULL,
                                            'outcome', CASE WHEN kind = 'run.succeeded' THEN 'succeeded' ELSE 'failed' END,
                                            'httpStatus', CASE WHEN kind = 'run.succeeded' THEN 200 ELSE 500 END,
                                            'errorClass', CASE WHEN kind = 'run.succeeded' THEN NULL ELSE 'http_status' END,
                                            'error', CASE WHEN kind = 'run.succeeded' THEN NULL ELSE 'HTTP 500' END,
                                            'latencyMs', 12) END,
               now() - interval '1 minute', 0, '', NULL
        FROM (
            SELECT md5('{tag}:r:' || i)::uuid AS r, i, j,
                   CASE WHEN mod(j, 2) = 1 THEN 'run.leased'
                        WHEN mod(i, {fail_every}) <> 0 THEN 'run.succeeded'
                        WHEN j = {last} THEN 'run.dead' ELSE 'run.retry_scheduled' END AS kind,
                   (j + 1) / 2 AS g,
                   CASE WHEN mod(i, {fail_every}) <> 0 THEN 'succeeded' WHEN j = {last} THEN 'dead' ELSE 'ready' END AS st
            FROM generate_series(1, {n}) AS i, generate_series(1, {last}) AS j
            WHERE mod(i, {fail_every}) = 0 OR j <= 2
        ) e
        ORDER BY i / {RUNS_PER_HOUR / 3600.0} + j * 2.0
    """, fetch=False)
    failing = n // fail_every
    return 2 * (n - failing) + last * failing


def rows_read() -> dict:
    """Rows read so far per table (sequential scans' tuples + tuples fetched through indexes),
    this backend's own counts flushed first (PostgreSQL 15 sends them at most once a second
    unless told)."""
    C.sql("SELECT pg_stat_force_next_flush()")
    return {r[0]: r[1] for r in C.sql("SELECT relname, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
                                      "FROM pg_stat_user_tables")}


def tables(reads: dict) -> str:
    return ", ".join(f"{t} {n}" for t, n in sorted(reads.items(), key=lambda kv: -kv[1]))


def read_since(before: dict) -> dict:
    after = rows_read()
    return {t: n - before.get(t, 0) for t, n in after.items() if n - before.get(t, 0)}


def measure_step(args, total: int, tenant_id: str) -> dict:
    """(a) and (b) at the current fleet size."""
    from django.conf import settings
    from django.db import connection, reset_queries

    from dispatch.incidents import BATCH, PROBE_BATCH, IncidentEvaluator, probe_missed
    from dispatch.models import Incident, Notification
    from scheduler_project.foundation.dbclock import db_now

    reset_run_side()
    fail_every = max(2, round(1 / args.fail_share))
    load_runs(total, args.runs, fail_every=fail_every, at_sql="date_trunc('second', now()) - interval '10 minutes'",
              state="succeeded", tenant_id=tenant_id, tag="b")
    evaluator = IncidentEvaluator()
    evaluator.step(probe=False)  # the cursor starts after what was loaded
    backlog = load_backlog(args.runs, fail_every=fail_every, tenant_id=tenant_id, tag="b")
    per_run = (backlog + args.runs) / args.runs  # with run.created
    C.vacuum_analyze("runs_outboxevent", "runs_run", "runs_occurrence")
    times, statements, reads = [], [], []
    settings.DEBUG = True  # count each step's statements
    try:
        while True:
            r0 = rows_read()
            reset_queries()
            started = time.perf_counter()
            full = evaluator.step(probe=False)
            times.append(time.perf_counter() - started)
            statements.append(len(connection.queries))
            reads.append(read_since(r0))
            if not full or len(times) >= args.passes:
                break
    finally:
        settings.DEBUG = False
    full_times = times if len(times) == 1 else times[:-1] if not full else times
    # The probe at its worst: PROBE_BATCH ready runs past their grace, each a missed start to open.
    reset_run_side()
    load_runs(total, PROBE_BATCH, fail_every=10 ** 9, at_sql="date_trunc('second', now()) - interval '1 hour'",
              state="ready", tenant_id=tenant_id, tag="p")
    C.vacuum_analyze("runs_run")
    r0 = rows_read()
    settings.DEBUG = True
    reset_queries()
    started = time.perf_counter()
    from django.db import transaction

    with transaction.atomic():
        probe_missed(db_now())
    probe = time.perf_counter() - started
    probe_statements = len(connection.queries)
    settings.DEBUG = False
    probe_reads = read_since(r0)
    med = statistics.median(full_times)
    arrival = RUNS_PER_HOUR / 3600 * per_run
    return {"size": total, "batch": BATCH, "times": times, "median": med, "statements": statements, "reads": reads,
            "events_per_s": BATCH / med, "arrival": arrival, "per_run": per_run, "backlog": backlog,
            "probe": probe, "probe_statements": probe_statements, "probe_reads": probe_reads,
            "probe_opened": Incident.objects.filter(rule="missed_start").count(),
            "notifications": Notification.objects.count()}


# --- (c) claiming and completing beside the incidents loop ------------------------------------


class LockSampler(threading.Thread):
    """Every 20 ms: ungranted locks in the bench database, who waits and who blocks."""

    def __init__(self, dbname):
        super().__init__(daemon=True)
        self.dbname, self.stop, self.samples, self.waits = dbname, threading.Event(), 0, []
        self.evaluator_pid = None

    def run(self):
        import psycopg

        with psycopg.connect(f"{C.PG_SERVER}/{self.dbname}", autocommit=True) as c:
            while not self.stop.is_set():
                rows = c.execute(
                    "SELECT l.pid, l.locktype, l.mode, l.relation::regclass::text, pg_blocking_pids(l.pid) "
                    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE NOT l.granted AND a.datname = current_database()").fetchall()
                self.samples += 1
                self.waits += rows
                time.sleep(0.02)


def claim_thread(idx, until, batch, out, errors, pids, every=0.0):
    """Claim and complete batches until `until` or no run is left; with `every`, one batch every
    `every` seconds (the threads together then dispatch at a set rate)."""
    from django.db import connection

    from runs import queue
    from runs.decisions import Holding

    with connection.cursor() as cur:
        cur.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        cur.execute("SELECT pg_backend_pid()")
        pids.append(cur.fetchone()[0])
    done, claims_t, completes_t = 0, [], []
    slot = time.monotonic() + idx * every / max(1, len(pids))
    try:
        while time.monotonic() < until:
            if every:
                slot += every
                time.sleep(max(0.0, slot - time.monotonic()))
            try:
                t = time.perf_counter()
                claims = queue.claim(f"bench-{idx}", batch, holding=Holding(batch, 1.0, 1.0))
                claims_t.append(time.perf_counter() - t)
                if not claims:
                    break
                # The failing schedules' runs fail (their streaks are the incidents' input).
                results = [queue.Result(claimed=c, outcome="failed" if failing(c) else "succeeded", retryable=True,
                                        http_status=500 if failing(c) else 200, error="HTTP 500" if failing(c) else "",
                                        latency_ms=1, remote_address="127.0.0.1", response_excerpt="{}")
                           for c in claims]
                t = time.perf_counter()
                queue.complete(results)
                completes_t.append(time.perf_counter() - t)
                done += len(claims)
            except Exception as e:  # a lock_timeout would land here: counted, then go on
                errors.append(repr(e)[:200])
                from django.db import connection as conn

                conn.close()
    finally:
        connection.close()
    out.append((done, claims_t, completes_t))


FAILING_IDS: set = set()


def failing(c) -> bool:
    return str(c.schedule_id) in FAILING_IDS


def evaluator_process(stop, steps, pid, error):
    """The incidents loop as a deployment runs it: a process of its own (forked with no open
    connection), stepping until told to stop."""
    from django.db import connection

    from dispatch.incidents import IncidentEvaluator

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid.value = cur.fetchone()[0]
    ev = IncidentEvaluator()
    try:
        while not stop.is_set():
            t = time.perf_counter()
            ev.step(probe=True)
            steps.put(time.perf_counter() - t)
    except Exception as e:
        error.put(repr(e)[:300])
    finally:
        connection.close()


def interfere_round(args, total, tenant_id, with_evaluator: bool, dbname: str, pace: float) -> dict:
    from django.db import connection

    from dispatch.incidents import IncidentEvaluator

    reset_run_side()
    fail_every = max(2, round(1 / args.fail_share))
    load_runs(total, args.claim_runs, fail_every=fail_every, at_sql="date_trunc('second', now()) - interval '5 seconds'",
              state="ready", tenant_id=tenant_id, tag="c")
    # Some runs long past their grace, as a stopped fleet leaves them: the probe has work.
    load_runs(total, 200, fail_every=10 ** 9, at_sql="date_trunc('second', now()) - interval '1 hour'",
              state="ready", tenant_id=tenant_id, tag="m")
    C.vacuum_analyze("runs_run", "runs_outboxevent", "runs_occurrence", "runs_attempt")
    IncidentEvaluator().step(probe=False)  # the cursor after the loaded run.created events
    connection.close()
    sampler = LockSampler(dbname)
    sampler.start()
    ctx = multiprocessing.get_context("fork")
    stop, steps, ev_pid, ev_error = ctx.Event(), ctx.Queue(), ctx.Value("i", 0), ctx.Queue()
    ev = None
    if with_evaluator:
        ev = ctx.Process(target=evaluator_process, args=(stop, steps, ev_pid, ev_error), daemon=True)
        ev.start()
        while not ev_pid.value:
            time.sleep(0.01)
    out, errors, pids = [], [], []
    until = time.monotonic() + args.round_seconds
    started = time.perf_counter()
    every = args.batch * args.threads / pace if pace else 0.0
    threads = [threading.Thread(target=claim_thread, args=(i, until, args.batch, out, errors, pids, every))
               for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    stop.set()
    ev_steps = []
    if ev:
        while ev.is_alive() or not steps.empty():
            try:
                ev_steps.append(steps.get(timeout=0.2))
            except queue_mod.Empty:
                pass
        ev.join()
    sampler.stop.set()
    sampler.join()
    done = sum(o[0] for o in out)
    claims = [x for o in out for x in o[1]]
    completes = [x for o in out for x in o[2]]
    ev_pid = ev_pid.value or None
    waits = [w for w in sampler.waits if w[0] in pids]
    by_eval = [w for w in waits if ev_pid in (w[4] or [])]
    evaluated = C.sql("SELECT watermark FROM dispatch_incidentcursor")[0][0] if with_evaluator else 0
    lo = C.sql("SELECT min(id) FROM runs_outboxevent")[0][0] or 0
    hi = C.sql("SELECT max(id) FROM runs_outboxevent")[0][0] or 0
    return {"with": with_evaluator, "pace": pace, "done": done, "wall": wall, "per_s": done / wall,
            "claim_p50": C.percentile(claims, 50), "claim_p99": C.percentile(claims, 99),
            "complete_p50": C.percentile(completes, 50), "complete_p99": C.percentile(completes, 99),
            "errors": errors, "samples": sampler.samples, "waits": waits, "by_eval": by_eval,
            "ev_steps": ev_steps, "ev_error": None if ev_error.empty() else ev_error.get(),
            "ev_behind": (hi - evaluated) if with_evaluator else None, "events": hi - lo + 1}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--runs", type=int, default=20_000, help="runs of the step backlog")
    ap.add_argument("--fail-share", type=float, default=0.02)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--owners", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2, help="ABBA pairs of the claim/complete rounds")
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--claim-runs", type=int, default=30_000)
    ap.add_argument("--round-seconds", type=float, default=25)
    ap.add_argument("--interfere-all", action="store_true", help="the claim/complete rounds at every size")
    ap.add_argument("--reuse", action="store_true", help="keep the database and the schedules already loaded")
    ap.add_argument("--database", default="scheduler_bench_incidents")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    print(C.machine_line(), flush=True)
    print(f"uptime: {uptime()}", flush=True)
    C.setup_database(args.database, fresh=not args.reuse)
    from django.conf import settings

    from dispatch.incidents import BATCH, PROBE_BATCH
    from schedules.models import Owner, Schedule, Tenant
    from schedules.services import rule_for

    settings.SCHEDULER_INCIDENT_SETTLE_SECONDS = 0
    tenant_row = Tenant.objects.filter(slug=TAG).first()
    if tenant_row is None:
        tenant = C.load_tenant(TAG, "http://127.0.0.1:9/")
        tenant_row = Tenant.objects.get(id=tenant.id)
        owners = [Owner.objects.create(tenant=tenant_row, slug=f"team-{i}", name=f"Team {i}",
                                       webhook_url=f"http://127.0.0.1:9/hook/{i}") for i in range(args.owners)]
        tenant_row.default_owner = owners[0]
        tenant_row.save(update_fields=["default_owner"])
    tenant_id = str(tenant_row.id)
    owner_ids = list(Owner.objects.filter(tenant_id=tenant_id).order_by("slug").values_list("id", flat=True))
    tenant = C.Tenant(tenant_id, TAG)
    steps, rounds = [], []
    for size in sizes:
        have = schedule_count()
        if have < size:
            print(f"\nloading schedules {have + 1:,}..{size:,} (load_schedules_bulk) ...", flush=True)
            got = C.load_schedules_bulk(TAG, tenant, size - have, first=have + 1, target_url="http://127.0.0.1:9/run",
                                        owner_ids=owner_ids, log=lambda m: print(m, flush=True))
            t = got["timings"]
            print("  " + ", ".join(f"{k} {v:.0f}s" for k, v in t.items())
                  + f"; {(size - have) / t['total']:,.0f} schedules/s, {t['total'] / (size - have) * 1e6:.0f} s per "
                  f"million; database {C.sql('SELECT pg_size_pretty(pg_database_size(current_database()))')[0][0]}",
                  flush=True)
        total = schedule_count()
        # The rows are the product's: a sample against the time engine.
        bad = 0
        sample = [r[0] for r in C.sql("SELECT id FROM schedules_schedule TABLESAMPLE SYSTEM (0.1) LIMIT 200")]
        for s in Schedule.objects.filter(id__in=sample).select_related("current"):
            if rule_for(s.current, s.anchor_at).next_after(s.anchor_at).at != s.next_run_at or s.current.version != s.version:
                bad += 1
        due = C.sql("SELECT count(*) FROM schedules_schedule WHERE enabled AND status = 'active' "
                    "AND next_run_at < now() + interval '1 hour'")[0][0]
        print(f"\n== {total:,} schedules (sample of up to 200 checked against the time engine: {bad} differ; "
              f"due in the next hour: {due:,}) -- uptime: {uptime()}", flush=True)
        r = measure_step(args, total, tenant_id)
        steps.append(r)
        print(f"  step of {r['batch']} events: {', '.join(f'{x * 1000:.0f}' for x in r['times'])} ms; "
              f"statements {r['statements']}", flush=True)
        for x in r["reads"]:
            print(f"    rows read: {sum(x.values())} ({tables(x)})", flush=True)
        print(f"  {r['events_per_s']:.0f} events/s vs {r['arrival']:.0f}/s arriving at 1,000,000 runs an hour "
              f"({r['per_run']:.2f} events per run): {r['events_per_s'] / r['arrival']:.2f}x", flush=True)
        print(f"  missed-start probe, {PROBE_BATCH} runs past grace: {r['probe'] * 1000:.0f} ms, "
              f"{r['probe_statements']} statements, {sum(r['probe_reads'].values())} rows read ({tables(r['probe_reads'])}), "
              f"{r['probe_opened']} incidents opened",
              flush=True)
        if size == sizes[-1] or args.interfere_all:
            FAILING_IDS.clear()
            FAILING_IDS.update(str(x[0]) for x in C.sql(
                f"SELECT md5('{TAG}:s:' || k)::uuid FROM generate_series({total - FAILING_SCHEDULES + 1}, {total}) k"))
            for i in range(args.rounds):
                for pace in (RUNS_PER_HOUR / 3600, 0):
                    for w in ((False, True) if i % 2 == 0 else (True, False)):
                        x = interfere_round(args, total, tenant_id, w, args.database, pace)
                        x["size"] = total
                        rounds.append(x)
                        print_round(len(rounds), x)
    print(f"\nuptime at the end: {uptime()}")
    print(f"\nsummary: one incidents step of {BATCH} events (median of its full passes), at 1,000,000 runs an hour")
    print("  schedules     step ms  statements  rows read   events/s  arriving/s  ratio  probe ms  probe rows")
    for r in steps:
        print(f"  {r['size']:>10,}  {r['median'] * 1000:>7.0f}  {statistics.median(r['statements']):>10.0f}  "
              f"{statistics.median(sum(x.values()) for x in r['reads']):>9.0f}  {r['events_per_s']:>9.0f}  "
              f"{r['arrival']:>10.0f}  {r['events_per_s'] / r['arrival']:>5.2f}  {r['probe'] * 1000:>8.0f}  "
              f"{sum(r['probe_reads'].values()):>10}")
    for pace in sorted({x["pace"] for x in rounds}, reverse=True):
        print(f"\nclaim + complete ({args.threads} threads, batches of {args.batch}, "
              f"{f'paced at {pace:.0f} runs/s' if pace else 'as fast as they can'}) at {rounds[-1]['size']:,} "
              f"schedules, medians of {args.rounds} rounds per side:")
        side = {w: [x for x in rounds if x["with"] == w and x["pace"] == pace] for w in (False, True)}
        for w in (False, True):
            xs = side[w]
            print(f"  {'with   ' if w else 'without'}: {C.median([x['per_s'] for x in xs]):.0f} runs/s, claim p50/p99 "
                  f"{C.median([x['claim_p50'] for x in xs]) * 1000:.1f}/{C.median([x['claim_p99'] for x in xs]) * 1000:.1f}"
                  f" ms, complete p50/p99 {C.median([x['complete_p50'] for x in xs]) * 1000:.1f}/"
                  f"{C.median([x['complete_p99'] for x in xs]) * 1000:.1f} ms")
        ratio = C.median([x["per_s"] for x in side[True]]) / C.median([x["per_s"] for x in side[False]])
        print(f"  throughput with / without: {ratio:.2f}x; claimers' lock waits with the loop: "
              f"{sum(len(x['waits']) for x in side[True])} ({sum(len(x['by_eval']) for x in side[True])} behind the "
              f"loop), without: {sum(len(x['waits']) for x in side[False])}; lock_timeout ({LOCK_TIMEOUT}) errors: "
              f"{sum(len(x['errors']) for x in side[True] + side[False])}")


def print_round(i, x) -> None:
    w = x["with"]
    print(f"  [{i}] {'paced' if x['pace'] else 'flat out'}, {'with   ' if w else 'without'} incidents loop: "
          f"{x['done']} runs in {x['wall']:.1f}s ({x['per_s']:.0f}/s); claim p50/p99 {x['claim_p50'] * 1000:.1f}/"
          f"{x['claim_p99'] * 1000:.1f} ms, complete p50/p99 {x['complete_p50'] * 1000:.1f}/"
          f"{x['complete_p99'] * 1000:.1f} ms; lock waits of claimers {len(x['waits'])} "
          f"(behind the loop {len(x['by_eval'])}) in {x['samples']} samples; errors {len(x['errors'])}"
          + (f"; loop steps {len(x['ev_steps'])} (median {statistics.median(x['ev_steps']) * 1000:.0f} ms), "
             f"events not yet evaluated at the end {x['ev_behind']} of {x['events']}" if w and x["ev_steps"] else "")
          + (f"; loop error {x['ev_error']}" if x["ev_error"] else ""), flush=True)
    for e in x["errors"][:3]:
        print(f"      error: {e}")
    for wt in x["waits"][:3]:
        print(f"      wait: {wt}")


if __name__ == "__main__":
    main()
