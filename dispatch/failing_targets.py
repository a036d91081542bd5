"""The dashboard's "targets failing most": target URLs with the most failed or unknown attempts
in the last hour, with their attempt totals for a failure rate, summed from the per-minute target
rows the activity loop keeps (dispatch.models.TargetMinute).

Cost: the rows of the last hour for the viewer's tenants (or the all-tenants rows), one per
target URL and minute that had an attempt, by the prefix of `target_minute_unique`; whatever the
size of the history and however many attempts that hour held. The figures trail the attempts by
as long as the activity loop does (it counts an attempt once nothing older can still appear).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Max, Sum

from dispatch.activity import minute_of
from dispatch.models import ALL_TENANTS, TargetMinute

WINDOW = timedelta(hours=1)


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
    tenants = [ALL_TENANTS] if tenant_ids is None else list(tenant_ids)
    rows = (
        TargetMinute.objects.filter(tenant_id__in=tenants, minute__gt=minute_of(now - WINDOW), minute__lte=now)
        .values("target_url")
        .annotate(failed_sum=Sum("failed"), attempts_sum=Sum("attempts"), last=Max("last_failed_at"))
        .filter(failed_sum__gt=0)
        .order_by("-failed_sum", "target_url")[:limit]
    )
    return [FailingTarget(r["target_url"], r["failed_sum"], r["attempts_sum"], r["last"]) for r in rows]
