"""Dead runs in list order: the portal's dead-letter queue, the sample its groups count, and the
runs list filtered to dead read these instead of walking a tenant's whole recent history.

Online on PostgreSQL: the partitioned index is made on the parent alone, each partition's index is
built with CREATE INDEX CONCURRENTLY (writes go on) and attached, after which the parent's index is
valid. Both are partial (dead runs only), so each build reads its partition once and writes little.
A migration interrupted half-way is finished by running it again. Elsewhere, ordinary indexes.
"""

from django.db import migrations, models
from django.db.models import Q

INDEXES = [
    models.Index(fields=["tenant", "-scheduled_time", "-id"], name="run_dead_time_idx", condition=Q(state="dead")),
    models.Index(fields=["-scheduled_time", "-id"], name="run_dead_all_time_idx", condition=Q(state="dead")),
]
COLUMNS = {
    "run_dead_time_idx": "(tenant_id, scheduled_time DESC, id DESC)",
    "run_dead_all_time_idx": "(scheduled_time DESC, id DESC)",
}


def _partitioned(cur) -> bool:
    cur.execute("SELECT relkind FROM pg_class WHERE oid = 'runs_run'::regclass")
    return cur.fetchone()[0] == "p"


def _partitions(cur) -> list[str]:
    cur.execute("""SELECT c.relname FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
                   WHERE h.inhparent = 'runs_run'::regclass ORDER BY c.relname""")
    return [r[0] for r in cur.fetchall()]


def _attached(cur, parent_index: str, partition: str) -> bool:
    cur.execute("""SELECT 1 FROM pg_inherits h JOIN pg_index x ON x.indexrelid = h.inhrelid
                   WHERE h.inhparent = %s::regclass AND x.indrelid = %s::regclass""", [parent_index, partition])
    return cur.fetchone() is not None


def forwards(apps, schema_editor):
    conn = schema_editor.connection
    Run = apps.get_model("runs", "Run")
    if conn.vendor != "postgresql":
        for index in INDEXES:
            schema_editor.add_index(Run, index)
        return
    from runs.partitions import q

    with conn.cursor() as cur:
        if not _partitioned(cur):
            for index in INDEXES:
                schema_editor.add_index(Run, index)
            return
        for name, cols in COLUMNS.items():
            cur.execute(f"CREATE INDEX IF NOT EXISTS {q(name)} ON ONLY runs_run {cols} WHERE state = 'dead'")
            for part in _partitions(cur):
                if _attached(cur, name, part):
                    continue  # made with the partition after the parent's index existed, or by an earlier try
                suffix = part[len("runs_run_"):] if part.startswith("runs_run_") else part
                child = f"{name[:62 - len(suffix)]}_{suffix}"
                # An earlier try interrupted mid-build leaves an invalid index under this name.
                cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(child)}")
                cur.execute(f"CREATE INDEX CONCURRENTLY {q(child)} ON {q(part)} {cols} WHERE state = 'dead'")
                cur.execute(f"ALTER INDEX {q(name)} ATTACH PARTITION {q(child)}")


def backwards(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    for index in INDEXES:
        schema_editor.remove_index(Run, index)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("runs", "0008_retention_policy_range"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="run", index=index) for index in INDEXES],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
