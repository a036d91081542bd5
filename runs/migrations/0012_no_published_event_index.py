"""One index write fewer per event (issue 31): `outbox_published_idx` is dropped.

It served one reader, the relay's pruning of published events in publication order. On
PostgreSQL that pruning is gone: published events leave with their partition of the outbox when
retention swaps it out (runs.retention), so deleting them row by row first only cost a delete, its
WAL and a vacuum per event, and this index an entry on every event written (two or three a run,
most of them written already published). On SQLite the relay still prunes, in id order along the
primary key.

Dropping an index is a catalog change (a moment's lock on the table), whatever its size. Run
backwards, it is made again (on PostgreSQL as a plain build on the partitioned parent).
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0011_leaner_dispatch_writes"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_published_idx"),
    ]
