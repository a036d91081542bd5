"""Time-partitioned history on PostgreSQL (runs.partitions, docs/scaling.md "Time partitioning"),
retention policies, and the partition catalog.

The model changes (attempts carry their run's scheduled time; the unique constraints carry the
partition key; the run -> occurrence and attempt -> run foreign keys are no longer database
constraints) apply as ordinary schema changes on SQLite. On PostgreSQL the four history tables are
rebuilt as partitioned tables instead and the rows copied across, in this migration's transaction:

    downtime: the tables are locked while their rows are copied (docs/scaling.md gives the measured
    time per million runs); stop the loops and the web processes, migrate, start them again.

Partitions made: one per SCHEDULER_PARTITION_SECONDS from the older of now and the oldest row (at
most the retention back: runs SCHEDULER_RETENTION_DAYS, events SCHEDULER_OUTBOX_RETENTION_HOURS) up
to now plus the look-ahead; older rows go to the kept partition, which the first retention pass
rewrites with only what must stay; a catch-all above.
"""

import uuid
from datetime import datetime, timedelta, timezone

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import runs.models

TABLES = ("runs_occurrence", "runs_run", "runs_attempt", "runs_outboxevent")
OLD = "_pre0007"

# Everything the new tables carry besides the columns and checks LIKE copies: (sql, ...) per table,
# with the names Django's model state gives them.
INDEXES = {
    "runs_occurrence": [
        "ALTER TABLE runs_occurrence ADD CONSTRAINT runs_occurrence_pkey PRIMARY KEY (id, scheduled_time)",
        "ALTER TABLE runs_occurrence ADD CONSTRAINT occurrence_identity_unique UNIQUE (schedule_id, schedule_version, scheduled_time)",
        "CREATE INDEX runs_occurrence_version_id_af599233 ON runs_occurrence (version_id)",
    ],
    "runs_run": [
        "ALTER TABLE runs_run ADD CONSTRAINT runs_run_pkey PRIMARY KEY (id, scheduled_time)",
        "ALTER TABLE runs_run ADD CONSTRAINT run_one_per_occurrence UNIQUE (occurrence_id, scheduled_time)",
        "CREATE INDEX run_ready_idx ON runs_run (next_eligible_at) WHERE state = 'ready'",
        "CREATE INDEX run_ready_tenant_idx ON runs_run (tenant_id, next_eligible_at) WHERE state = 'ready'",
        "CREATE INDEX run_leased_idx ON runs_run (lease_until) WHERE state = 'leased'",
        "CREATE INDEX run_dead_idx ON runs_run (tenant_id, finished_at DESC) WHERE state = 'dead'",
        "CREATE INDEX run_schedule_time_idx ON runs_run (schedule_id, scheduled_time DESC, id DESC)",
        "CREATE INDEX run_tenant_time_idx ON runs_run (tenant_id, scheduled_time DESC, id DESC)",
        "CREATE INDEX run_retried_idx ON runs_run (retried_at) WHERE retried_at IS NOT NULL",
    ],
    "runs_attempt": [
        "ALTER TABLE runs_attempt ADD CONSTRAINT runs_attempt_pkey PRIMARY KEY (id, scheduled_time)",
        "ALTER TABLE runs_attempt ADD CONSTRAINT attempt_run_generation_unique UNIQUE (run_id, generation, scheduled_time)",
        "CREATE UNIQUE INDEX attempt_one_open_per_run ON runs_attempt (run_id, scheduled_time) WHERE outcome IS NULL",
    ],
    "runs_outboxevent": [
        "ALTER TABLE runs_outboxevent ADD CONSTRAINT runs_outboxevent_pkey PRIMARY KEY (id, created_at)",
        "ALTER TABLE runs_outboxevent ADD CONSTRAINT outbox_event_id_unique UNIQUE (event_id, created_at)",
        "CREATE INDEX outbox_unpublished_idx ON runs_outboxevent (id) WHERE published_at IS NULL",
        "CREATE INDEX outbox_published_idx ON runs_outboxevent (published_at) WHERE published_at IS NOT NULL",
        "CREATE INDEX outbox_relay_due_idx ON runs_outboxevent (next_attempt_at, id) WHERE published_at IS NULL",
        "CREATE INDEX runs_outboxevent_run_id_2aeed506 ON runs_outboxevent (run_id)",
    ],
}
FOREIGN_KEYS = [
    "ALTER TABLE runs_occurrence ADD CONSTRAINT runs_occurrence_schedule_id_ba4b33b4_fk_schedules_schedule_id "
    "FOREIGN KEY (schedule_id) REFERENCES schedules_schedule (id) DEFERRABLE INITIALLY DEFERRED",
    "ALTER TABLE runs_occurrence ADD CONSTRAINT runs_occurrence_version_id_af599233_fk_schedules "
    "FOREIGN KEY (version_id) REFERENCES schedules_scheduleversion (id) DEFERRABLE INITIALLY DEFERRED",
    "ALTER TABLE runs_run ADD CONSTRAINT runs_run_tenant_id_45914888_fk_schedules_tenant_id "
    "FOREIGN KEY (tenant_id) REFERENCES schedules_tenant (id) DEFERRABLE INITIALLY DEFERRED",
    "ALTER TABLE runs_run ADD CONSTRAINT runs_run_schedule_id_6c827442_fk_schedules_schedule_id "
    "FOREIGN KEY (schedule_id) REFERENCES schedules_schedule (id) DEFERRABLE INITIALLY DEFERRED",
    "ALTER TABLE runs_run ADD CONSTRAINT runs_run_version_id_a5ac8674_fk_schedules_scheduleversion_id "
    "FOREIGN KEY (version_id) REFERENCES schedules_scheduleversion (id) DEFERRABLE INITIALLY DEFERRED",
]
KEY = {"runs_occurrence": "scheduled_time", "runs_run": "scheduled_time", "runs_attempt": "scheduled_time",
       "runs_outboxevent": "created_at"}


def _setting(name):
    from runs.history_settings import get

    return get(name)


def _align(t, width):
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    return epoch + timedelta(seconds=((t - epoch).total_seconds() // width) * width)


def _iso(t):
    return "'" + t.astimezone(timezone.utc).isoformat() + "'"


def partition_postgresql(apps, schema_editor):
    cur = schema_editor.connection.cursor()
    width = _setting("SCHEDULER_PARTITION_SECONDS")
    ahead = max(width, _setting("SCHEDULER_PARTITION_AHEAD_SECONDS"))
    keep = {
        "runs": timedelta(days=_setting("SCHEDULER_RETENTION_DAYS")),
        "outbox": timedelta(hours=settings.SCHEDULER_OUTBOX_RETENTION_HOURS),
    }
    cur.execute("SELECT statement_timestamp()")
    now = cur.fetchone()[0]

    # 1. The old tables, their indexes and identity sequences step aside (index names are
    # schema-wide).
    for t in TABLES:
        cur.execute(f"ALTER TABLE {t} RENAME TO {t}{OLD}")
        cur.execute("SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                    "WHERE i.indrelid = %s::regclass", [t + OLD])
        for (name,) in cur.fetchall():
            cur.execute(f'ALTER INDEX "{name}" RENAME TO "{name[:55]}{OLD}"')
        cur.execute("SELECT pg_get_serial_sequence(%s, 'id')", [t + OLD])
        seq = cur.fetchone()[0]
        if seq:
            cur.execute(f"ALTER SEQUENCE {seq} RENAME TO {t}_id_seq{OLD}")

    # 2. The partitioned tables: the same columns and checks, the partition key in every unique
    # constraint, attempts with their run's scheduled time.
    for t in TABLES:
        extra = ", scheduled_time timestamp with time zone NOT NULL" if t == "runs_attempt" else ""
        cur.execute(f"CREATE TABLE {t} (LIKE {t}{OLD} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY"
                    f"{extra}) PARTITION BY RANGE ({KEY[t]})")
        for sql in INDEXES[t]:
            cur.execute(sql)
    for sql in FOREIGN_KEYS:
        cur.execute(sql)

    # 3. Partitions: kept below, regular ones over the rows still within their retention and up
    # to now + ahead, the catch-all above.
    for group, tables in (("runs", ("runs_occurrence", "runs_run", "runs_attempt")), ("outbox", ("runs_outboxevent",))):
        src = "runs_run" if group == "runs" else "runs_outboxevent"
        cur.execute(f"SELECT min({KEY[src]}) FROM {src}{OLD}")
        oldest = cur.fetchone()[0] or now
        start = _align(max(min(oldest, now), now - keep[group]), width)
        until = _align(now + timedelta(seconds=ahead), width) + timedelta(seconds=width)
        for t in tables:
            cur.execute(f"CREATE TABLE {t}_kept_1 PARTITION OF {t} FOR VALUES FROM (MINVALUE) TO ({_iso(start)})")
            lo = start
            while lo < until:
                hi = lo + timedelta(seconds=width)
                name = f"{t}_p{lo:%Y%m%dt%H%M%S}"
                cur.execute(f"CREATE TABLE {name} PARTITION OF {t} FOR VALUES FROM ({_iso(lo)}) TO ({_iso(hi)})")
                lo = hi
            cur.execute(f"CREATE TABLE {t}_future PARTITION OF {t} FOR VALUES FROM ({_iso(until)}) TO (MAXVALUE)")

    # 4. The rows. Attempts take their run's scheduled time.
    def cols(table):
        cur.execute("SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
                    "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped", [table])
        return cur.fetchone()[0]

    for t in ("runs_occurrence", "runs_run", "runs_outboxevent"):
        c = cols(t + OLD)
        cur.execute(f"INSERT INTO {t} ({c}) OVERRIDING SYSTEM VALUE SELECT {c} FROM {t}{OLD}")
    c = cols("runs_attempt" + OLD)
    cur.execute(f"INSERT INTO runs_attempt ({c}, scheduled_time) OVERRIDING SYSTEM VALUE "
                f"SELECT {', '.join('a.' + x.strip() for x in c.split(','))}, r.scheduled_time "
                f"FROM runs_attempt{OLD} a JOIN runs_run{OLD} r ON r.id = a.run_id")
    for t in ("runs_attempt", "runs_outboxevent"):
        cur.execute(f"SELECT setval(pg_get_serial_sequence('{t}', 'id'), "
                    f"GREATEST((SELECT max(id) FROM {t}), 1), (SELECT max(id) IS NOT NULL FROM {t}))")
    for t in reversed(TABLES):
        cur.execute(f"DROP TABLE {t}{OLD}")

    # 5. The catalog and the unseal function.
    from runs import partitions

    partitions.ensure_unseal_function(cur)
    for t in TABLES:
        cur.execute(partitions._LAYOUT_SQL, [t])
        for name, lo, hi in cur.fetchall():
            partitions.name_child_indexes(cur, name)
            role = "kept" if lo is None else "future" if hi is None else "live"
            cur.execute('INSERT INTO runs_historypartition (name, "table", lower, upper, role, sealed, created_at) '
                        "VALUES (%s, %s, %s, %s, %s, false, now())", [name, t, lo, hi, role])


def unpartition_postgresql(apps, schema_editor):
    raise RuntimeError("runs.0007 converts the history tables to partitioned tables; there is no way back")


def fill_attempt_times(apps, schema_editor):
    from django.db.models import OuterRef, Subquery

    Attempt = apps.get_model("runs", "Attempt")
    Run = apps.get_model("runs", "Run")
    Attempt.objects.update(scheduled_time=Subquery(Run.objects.filter(id=OuterRef("run_id")).values("scheduled_time")[:1]))


class OnEngine(migrations.operations.base.Operation):
    """`operations` as ordinary schema changes, except on PostgreSQL, where `postgresql` does the
    same to the database by its own means. Used inside SeparateDatabaseAndState, which keeps the
    model state."""

    reduces_to_sql = False
    reversible = True

    def __init__(self, operations, postgresql, postgresql_reverse):
        self.operations = operations
        self.postgresql = postgresql
        self.postgresql_reverse = postgresql_reverse

    def deconstruct(self):
        return self.__class__.__name__, [self.operations, self.postgresql, self.postgresql_reverse], {}

    def state_forwards(self, app_label, state):
        for op in self.operations:
            op.state_forwards(app_label, state)

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            self.postgresql(from_state.apps, schema_editor)
            return
        for op in self.operations:
            to = from_state.clone()
            op.state_forwards(app_label, to)
            op.database_forwards(app_label, schema_editor, from_state, to)
            from_state = to

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            self.postgresql_reverse(from_state.apps, schema_editor)
            return
        states = [to_state]
        for op in self.operations[:-1]:
            s = states[-1].clone()
            op.state_forwards(app_label, s)
            states.append(s)
        for op, before in reversed(list(zip(self.operations, states))):
            after = before.clone()
            op.state_forwards(app_label, after)
            op.database_backwards(app_label, schema_editor, after, before)

    def describe(self):
        return "history tables: schema changes (SQLite) or partitioned tables (PostgreSQL)"


MODEL_CHANGES = [
    migrations.RemoveConstraint(model_name="attempt", name="attempt_run_generation_unique"),
    migrations.RemoveConstraint(model_name="attempt", name="attempt_one_open_per_run"),
    migrations.AddField(model_name="attempt", name="scheduled_time", field=models.DateTimeField(null=True)),
    migrations.RunPython(fill_attempt_times, migrations.RunPython.noop),
    migrations.AlterField(model_name="attempt", name="scheduled_time", field=runs.models.RunTimeField()),
    migrations.AlterField(
        model_name="attempt",
        name="run",
        field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                related_name="attempts", to="runs.run"),
    ),
    migrations.AlterField(
        model_name="outboxevent", name="event_id", field=models.UUIDField(default=uuid.uuid4, editable=False),
    ),
    migrations.AlterField(
        model_name="run",
        name="occurrence",
        field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT,
                                related_name="run", to="runs.occurrence"),
    ),
    migrations.AddIndex(
        model_name="run",
        index=models.Index(condition=models.Q(("retried_at__isnull", False)), fields=["retried_at"], name="run_retried_idx"),
    ),
    migrations.AddConstraint(
        model_name="attempt",
        constraint=models.UniqueConstraint(fields=("run", "generation", "scheduled_time"), name="attempt_run_generation_unique"),
    ),
    migrations.AddConstraint(
        model_name="attempt",
        constraint=models.UniqueConstraint(condition=models.Q(("outcome__isnull", True)), fields=("run", "scheduled_time"),
                                           name="attempt_one_open_per_run"),
    ),
    migrations.AddConstraint(
        model_name="outboxevent",
        constraint=models.UniqueConstraint(fields=("event_id", "created_at"), name="outbox_event_id_unique"),
    ),
    migrations.AddConstraint(
        model_name="run",
        constraint=models.UniqueConstraint(fields=("occurrence", "scheduled_time"), name="run_one_per_occurrence"),
    ),
]
STATE_CHANGES = [op for op in MODEL_CHANGES if not isinstance(op, migrations.RunPython)]


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0006_run_updated_at_removed"),
        ("schedules", "0003_reconciler_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="HistoryPartition",
            fields=[
                ("name", models.CharField(max_length=63, primary_key=True, serialize=False)),
                ("table", models.CharField(max_length=63)),
                ("lower", models.DateTimeField(blank=True, null=True)),
                ("upper", models.DateTimeField(blank=True, null=True)),
                ("role", models.CharField(max_length=16)),
                ("sealed", models.BooleanField(default=False)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={"ordering": ["table", "lower"]},
        ),
        migrations.AddIndex(
            model_name="historypartition",
            index=models.Index(fields=["table", "sealed"], name="history_partition_live_idx"),
        ),
        migrations.CreateModel(
            name="HistoryRemoval",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("at", models.DateTimeField(auto_now_add=True)),
                ("what", models.CharField(max_length=200)),
                ("removed", models.JSONField(default=dict)),
                ("kept", models.JSONField(default=dict)),
                ("lock_ms", models.FloatField(blank=True, null=True)),
            ],
            options={"ordering": ["-at"]},
        ),
        migrations.AddIndex(
            model_name="historyremoval",
            index=models.Index(fields=["-at"], name="history_removal_at_idx"),
        ),
        migrations.CreateModel(
            name="RetentionPolicy",
            fields=[
                ("tenant", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                                                related_name="retention", serialize=False, to="schedules.tenant")),
                ("finished_days", models.PositiveIntegerField(blank=True, null=True)),
                ("dead_days", models.PositiveIntegerField(blank=True, null=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                ("updated_by", models.CharField(blank=True, default="", max_length=200)),
            ],
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=STATE_CHANGES,
            database_operations=[OnEngine(MODEL_CHANGES, partition_postgresql, unpartition_postgresql)],
        ),
    ]
