"""Whether the database's commits wait for a standby: the precondition of the failover promise
(docs/failure-model.md). pg_auto_failover turns synchronous replication off while its standby
looks unhealthy (the primary is then `wait_primary`), and a primary lost then loses its last
commits, so an operator must be able to see it: /metrics and the operator dashboard read this.

PostgreSQL shows replication only to roles with pg_read_all_stats (pg_monitor); for any other
role the standbys' columns read as null, and `visible` is then False.
"""

from dataclasses import dataclass

from django.conf import settings
from django.db import connection

# One row whatever the number of standbys (the aggregate of none is one row of zeros).
REPLICATION_STATUS_SQL = """
SELECT current_setting('synchronous_standby_names') AS synchronous_names,
       count(*) AS standbys,
       count(*) FILTER (WHERE sync_state IN ('sync', 'quorum') AND state = 'streaming') AS synchronous,
       coalesce(bool_and(sync_state IS NOT NULL), true) AS visible
  FROM pg_stat_replication
"""


@dataclass(frozen=True)
class ReplicationStatus:
    standbys: int  # standbys streaming from this server
    synchronous: int  # of which commits wait for (sync or quorum)
    synchronous_names: str  # synchronous_standby_names, as the server has it now
    visible: bool  # False: this role may not read the standbys' state (grant pg_monitor)
    expected: bool  # SCHEDULER_EXPECT_SYNCHRONOUS_STANDBY: the deployment promises a standby

    @property
    def degraded(self) -> bool:
        """Commits are acknowledged without a standby where one is expected, or a standby is
        connected but commits no longer wait for it."""
        if not self.visible:
            return self.expected
        return (self.expected and self.synchronous == 0) or (self.standbys > 0 and self.synchronous == 0)


def replication_status() -> ReplicationStatus | None:
    """None on a database without replication (the embedded SQLite one)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cur:
        cur.execute(REPLICATION_STATUS_SQL)
        names, standbys, synchronous, visible = cur.fetchone()
    return ReplicationStatus(standbys=standbys, synchronous=synchronous, synchronous_names=names,
                             visible=visible, expected=settings.SCHEDULER_EXPECT_SYNCHRONOUS_STANDBY)
