"""Prometheus metrics (served at /metrics by scheduler_project.web.health), computed from the database at scrape time.

Every figure is read from PostgreSQL when Prometheus scrapes (through runs.stats, the module the
portal dashboard uses, plus the loops' own rows: worker counters and shard leases), so any of
several gunicorn workers answers the same thing and nothing is lost when a process restarts.
Queries are the bounded, index-backed ones of runs.stats; a scrape costs a few milliseconds.
"""

from datetime import timedelta

from django.db.models import Sum
from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import CollectorRegistry

from dispatch import forecast
from dispatch.activity_figures import attempt_figures
from dispatch.models import ShardLease, WorkerStat
from runs import retention, stats
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.dbreplication import replication_status

LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
BATCH_BUCKETS = ("1", "10", "25", "50", "100", "250", "500", "1000", "+Inf")


def _gauge(name: str, doc: str, value) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


def _age(now, then) -> float:
    return (now - then).total_seconds() if then else 0.0


def _cumulative(sorted_values, bounds):
    out, i = [], 0
    for b in bounds:
        while i < len(sorted_values) and sorted_values[i] <= b:
            i += 1
        out.append((str(b), i))
    out.append(("+Inf", len(sorted_values)))
    return out


class SchedulerCollector:
    def collect(self):
        now = db_now()
        floor = stats.recent_attempt_floor()

        sample = stats.lag_samples(now=now, floor=floor)
        lags = sample.lags
        # A busy window is read one start in `stride`: the counts are scaled back to estimates.
        yield GaugeHistogramMetricFamily(
            "scheduler_start_lag_seconds",
            "Scheduled-to-start lag of first attempts started in the last 15 minutes "
            "(estimated from an even sample when there were many)",
            buckets=[(b, n * sample.stride) for b, n in _cumulative(lags, LAG_BUCKETS)],
            gsum_value=sum(lags) * sample.stride,
        )
        for q in (0.5, 0.99):
            yield _gauge(f"scheduler_start_lag_p{int(q * 100)}_seconds",
                         f"p{int(q * 100)} scheduled-to-start lag over the last 15 minutes",
                         stats.percentile(lags, q) or 0.0)

        od = stats.overdue(now=now)
        yield _gauge("scheduler_oldest_overdue_seconds", "Age of the oldest ready run past its eligibility",
                     od.age_seconds or 0.0)
        yield _gauge("scheduler_overdue_runs", "Ready runs past their eligibility (the backlog)", od.count)

        live = stats.live_counts()  # once, for both figures below
        st = stats.runs_by_state(now=now, live=live)
        g = GaugeMetricFamily("scheduler_runs", "Runs that are work or need a person, by state", labels=["state"])
        for state, n in st.live.items():
            g.add_metric([state], n)
        yield g
        g = GaugeMetricFamily("scheduler_runs_last_hour", "Runs scheduled in the last hour, by state", labels=["state"])
        for state, n in st.recent.items():
            g.add_metric([state], n)
        yield g

        dl = stats.dead_letter(now=now, size=live["dead"])
        yield _gauge("scheduler_dead_letter_size", "Runs in the dead-letter queue", dl.size)
        yield _gauge("scheduler_dead_letter_added_last_hour", "Runs that went dead in the last hour", dl.last_hour)

        af = attempt_figures(now=now)
        yield _gauge("scheduler_lease_expirations_last_hour", "Leases that expired in the last hour",
                     af.lease_expirations_last_hour)
        yield _gauge("scheduler_unknown_attempts_last_day", "Attempts whose outcome is unknown, last 24 h",
                     af.unknown_last_day)
        yield _gauge("scheduler_unknown_attempt_oldest_age_seconds",
                     "Age of the oldest unknown-outcome attempt of the last 24 h", _age(now, af.oldest_unknown_at))

        inflight = GaugeMetricFamily("scheduler_tenant_in_flight", "Leased runs per tenant", labels=["tenant"])
        backlog = GaugeMetricFamily("scheduler_tenant_backlog", "Ready, due runs per tenant", labels=["tenant"])
        for t in stats.per_tenant(now=now):
            inflight.add_metric([t.slug], t.in_flight)
            backlog.add_metric([t.slug], t.backlog)
        yield inflight
        yield backlog

        yield _gauge("scheduler_outbox_lag_seconds", "Age of the oldest unpublished outbox event",
                     _age(now, stats.oldest_unpublished_event_at()))

        yield from self.worker_metrics(now)
        yield from self.shard_metrics(now)
        yield from self.history_metrics(now)
        yield from self.replication_metrics()
        yield from self.forecast_metrics()

    def replication_metrics(self):
        """Whether commits wait for a standby (scheduler_project.foundation.dbreplication); nothing on SQLite."""
        rep = replication_status()
        if rep is None:
            return
        yield _gauge("scheduler_database_standbys", "Standbys streaming from the primary", rep.standbys)
        yield _gauge("scheduler_database_synchronous_standbys",
                     "Standbys whose acknowledgement a commit waits for (0 with a standby: commits can be lost "
                     "in a failover)", rep.synchronous)
        yield _gauge("scheduler_database_replication_visible",
                     "1 if this role may read the standbys' state (else grant pg_monitor)", int(rep.visible))
        yield _gauge("scheduler_database_replication_degraded",
                     "1 while commits are acknowledged without the synchronous standby the deployment expects",
                     int(rep.degraded))

    def forecast_metrics(self):
        """The next hour's busiest minute ahead (dispatch.forecast). A forecast reads up to
        EXACT_SCHEDULES schedules, far more than the rest of a scrape, so each process keeps its
        answer for FORECAST_TTL: the figure is a minute old at most, and scrapes stay cheap."""
        f = _cached_forecast()
        peak = f.peak()
        yield _gauge("scheduler_forecast_next_hour_peak_due",
                     "Runs becoming eligible in the busiest minute of the next hour (forecast; estimated when sampled)",
                     peak.due if peak else 0.0)
        yield _gauge("scheduler_forecast_sampled", "1 when the forecast was sampled rather than exact",
                     0.0 if f.exact else 1.0)
        yield _gauge("scheduler_forecast_warnings", "Minutes of the next hour the observed capacity would not "
                     "start within their misfire grace", len(f.warnings))

    def worker_metrics(self, now):
        totals = WorkerStat.objects.aggregate(
            claims=Sum("claims"), empty=Sum("empty_claims"), runs=Sum("claimed_runs"),
            abandoned=Sum("abandoned"), fenced=Sum("fenced_results"),
        )
        for name, key, doc in (
            ("scheduler_claims", "claims", "Claim transactions made by workers"),
            ("scheduler_empty_claims", "empty", "Claims that found nothing (idle or contention)"),
            ("scheduler_claimed_runs", "runs", "Runs claimed by workers"),
            ("scheduler_abandoned_calls", "abandoned", "Calls abandoned after a heartbeat found the lease lost"),
            ("scheduler_fenced_results", "fenced", "Results that arrived after their lease was lost (kept as evidence)"),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], totals[key] or 0)
            yield c
        buckets = {b: 0 for b in BATCH_BUCKETS}
        for row in WorkerStat.objects.values_list("batch_buckets", flat=True):
            for b in BATCH_BUCKETS:
                buckets[b] += int((row or {}).get(b, 0))
        yield HistogramMetricFamily(
            "scheduler_claim_batch_size", "Runs per non-empty claim",
            buckets=[(b, buckets[b]) for b in BATCH_BUCKETS], sum_value=totals["runs"] or 0,
        )
        yield _gauge("scheduler_workers", "Worker processes seen in the last minute",
                     WorkerStat.objects.filter(seen_at__gt=now - timedelta(minutes=1)).count())

    def shard_metrics(self, now):
        behind = GaugeMetricFamily("scheduler_shard_behind_seconds", "How far behind a scanner shard was after its last pass",
                                   labels=["shards", "shard", "holder"])
        age = GaugeMetricFamily("scheduler_shard_last_pass_age_seconds", "Seconds since a shard's last scanner pass",
                                labels=["shards", "shard", "holder"])
        for lease in ShardLease.objects.all():
            labels = [str(lease.shards), str(lease.shard), lease.holder if lease.lease_until > now else ""]
            behind.add_metric(labels, lease.behind_seconds)
            age.add_metric(labels, (now - lease.last_pass_at).total_seconds() if lease.last_pass_at else -1.0)
        yield behind
        yield age


    def history_metrics(self, now):
        """What history is kept and whether its maintenance keeps up (runs.retention.status)."""
        st = retention.status(now=now)
        keep = GaugeMetricFamily("scheduler_retention_days", "Days finished runs are kept by default, by class",
                                 labels=["class"])
        keep.add_metric(["finished"], st.finished_days)
        keep.add_metric(["dead"], st.dead_days)
        yield keep
        yield _gauge("scheduler_retention_overrides", "Tenants with their own retention policy", st.overrides)
        yield _gauge("scheduler_history_last_removal_age_seconds",
                     "Seconds since history was last removed by retention (-1: never)",
                     _age(now, st.last_removal_at) if st.last_removal_at else -1.0)
        if not st.partitioned:
            return
        yield _gauge("scheduler_history_next_removal_seconds",
                     "Seconds until the oldest partition is due for removal (negative: overdue, see the maintain log)",
                     (st.next_removal_at - now).total_seconds() if st.next_removal_at else 0.0)
        yield _gauge("scheduler_history_partitions_ahead_seconds",
                     "How far beyond now partitions exist (alert when below an hour: is `maintain` running?)",
                     (st.covered_until - now).total_seconds() if st.covered_until else 0.0)
        parts = GaugeMetricFamily("scheduler_history_partitions", "Partitions per history table", labels=["table"])
        size = GaugeMetricFamily("scheduler_history_bytes", "Bytes on disk per history table", labels=["table"])
        stray = GaugeMetricFamily("scheduler_history_unpartitioned_rows",
                                  "Rows written for times no partition covered (alert when above 0: run "
                                  "`manage.py partitions`)", labels=["table"])
        for table, n in st.partitions.items():
            parts.add_metric([table], n)
            size.add_metric([table], st.table_bytes.get(table, 0))
            stray.add_metric([table], st.unpartitioned_rows.get(table, 0))
        yield parts
        yield size
        yield stray


FORECAST_TTL = timedelta(seconds=60)
_forecast_cache: list = []  # [(taken at, Forecast)]


def _cached_forecast():
    now = db_now()
    if _forecast_cache and now - _forecast_cache[0][0] < FORECAST_TTL:
        return _forecast_cache[0][1]
    # The next hour is all the gauges read; a week of every-minute rules would make a scrape wait.
    f = forecast.forecast(now=now, span=forecast.TIERS[0][1])
    _forecast_cache[:] = [(now, f)]
    return f


def exposition() -> bytes:
    """The Prometheus text for one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerCollector())
    return generate_latest(registry)
