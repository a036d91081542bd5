"""Two index writes fewer per run (issue 31): the outbox's (event_id, created_at) unique index and
the occurrences' version_id index are dropped.

- outbox_event_id_unique: event ids are random UUIDs, unique by their random bits; the index (on
  the pair, since a partitioned table's unique indexes carry the partition key) checked nothing
  more and cost a random-position insert and a uniqueness probe per event, two per run dispatched
  and one per run made.
- runs_occurrence version_id: versions are never deleted and nothing looks occurrences up by
  version (Run.version has no index for the same reason); one write per run made.

Dropping an index is a catalog change (a moment's lock on the table), whatever its size. Run
backwards, both are made again (on PostgreSQL's partitioned tables as plain builds on the parent).
"""

from django.db import migrations, models


def _occurrence_version_index(cur) -> str | None:
    """The name Django gave the occurrence version_id index (hashed), if it is there."""
    cur.execute("""SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
                   JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
                   WHERE x.indrelid = 'runs_occurrence'::regclass AND x.indnatts = 1 AND a.attname = 'version_id'
                     AND NOT x.indisunique""")
    row = cur.fetchone()
    return row[0] if row else None


def forwards(apps, schema_editor):
    conn = schema_editor.connection
    if conn.vendor != "postgresql":
        return  # the operations below
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE runs_outboxevent DROP CONSTRAINT IF EXISTS outbox_event_id_unique")
        name = _occurrence_version_index(cur)
        if name:
            cur.execute(f'DROP INDEX "{name}"')


def backwards(apps, schema_editor):
    conn = schema_editor.connection
    if conn.vendor != "postgresql":
        return
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE runs_outboxevent ADD CONSTRAINT outbox_event_id_unique UNIQUE (event_id, created_at)")
        if not _occurrence_version_index(cur):
            cur.execute("CREATE INDEX runs_occurrence_version_id_af599233 ON runs_occurrence (version_id)")


class OffPostgreSQL(migrations.operations.base.Operation):
    """`operation` on the state everywhere, and on the database everywhere but PostgreSQL, where
    forwards/backwards above do it on the partitioned tables."""

    reversible = True

    def __init__(self, operation):
        self.operation = operation

    def deconstruct(self):
        return self.__class__.__name__, [self.operation], {}

    def state_forwards(self, app_label, state):
        self.operation.state_forwards(app_label, state)

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            self.operation.database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            self.operation.database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self):
        return self.operation.describe()


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0010_recent_state_count"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
        OffPostgreSQL(migrations.RemoveConstraint(model_name="outboxevent", name="outbox_event_id_unique")),
        OffPostgreSQL(migrations.AlterField(
            model_name="occurrence",
            name="version",
            field=models.ForeignKey(db_index=False, on_delete=models.deletion.PROTECT, related_name="occurrences",
                                    to="schedules.scheduleversion"),
        )),
    ]
