"""Dashboard and /metrics figures summed from the rows the activity loop keeps, so that none of
them reads the attempts, however many the last hours held:

- "targets failing most": target URLs with the most failed or unknown attempts in the last hour,
  with their attempt totals for a failure rate (dispatch.models.TargetMinute). Cost: the rows of
  the last hour for the viewer's tenants (or the all-tenants rows), one per target URL and minute
  that had an attempt, by the prefix of `target_minute_unique`.
- unknown outcomes in the last day and lease expirations in the last hour
  (dispatch.models.ActivityMinute). Cost: at most one row per tenant and minute of the day, by the
  prefix of `activity_minute_unique`.

The figures trail the attempts by as long as the activity loop does (it counts an attempt once
nothing older can still appear).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Max, Min, Q, Sum

from dispatch.activity import minute_of
from dispatch.models import ALL_TENANTS, ActivityMinute, TargetMinute

WINDOW = timedelta(hours=1)
UNKNOWN_WINDOW = timedelta(hours=24)


def _tenants(tenant_ids) -> list:
    return [ALL_TENANTS] if tenant_ids is None else list(tenant_ids)


@dataclass
class FailingTarget:
    target_url: str
    failed: int
    attempts: int
    last_failed_at: datetime | None

    @property
    def failure_rate(self) -> float:
        return self.failed / self.attempts if self.attempts else 0.0


def failing_targets(*, tenant_ids=None, now: datetime, limit: int = 5) -> list[FailingTarget]:
    """The `limit` target URLs with the most failures ending in the hour before `now` (the
    minute `now` falls in included), of `tenant_ids` (None: every tenant), most failures first."""
    rows = (
        TargetMinute.objects.filter(tenant_id__in=_tenants(tenant_ids), minute__gt=minute_of(now - WINDOW),
                                    minute__lte=now)
        .values("target_url")
        .annotate(failed_sum=Sum("failed"), attempts_sum=Sum("attempts"), last=Max("last_failed_at"))
        .filter(failed_sum__gt=0)
        .order_by("-failed_sum", "target_url")[:limit]
    )
    return [FailingTarget(r["target_url"], r["failed_sum"], r["attempts_sum"], r["last"]) for r in rows]


@dataclass
class AttemptFigures:
    lease_expirations_last_hour: int
    unknown_last_day: int
    oldest_unknown_at: datetime | None = None  # the minute the oldest of those ended in


def attempt_figures(*, tenant_ids=None, now: datetime) -> AttemptFigures:
    """Attempts whose target may or may not have acted (outcome unknown) that ended in the last
    day, the minute the oldest of them ended in, and lease expirations (the reconciler ends
    those attempts as unknown) in the last hour, of `tenant_ids` (None: every tenant)."""
    day = ActivityMinute.objects.filter(tenant_id__in=_tenants(tenant_ids), minute__gt=minute_of(now - UNKNOWN_WINDOW),
                                        minute__lte=now)
    agg = day.aggregate(unknown_sum=Sum("unknown"), oldest=Min("minute", filter=Q(unknown__gt=0)),
                        lease_sum=Sum("lease_expired", filter=Q(minute__gt=minute_of(now - WINDOW))))
    return AttemptFigures(lease_expirations_last_hour=agg["lease_sum"] or 0, unknown_last_day=agg["unknown_sum"] or 0,
                          oldest_unknown_at=agg["oldest"])
