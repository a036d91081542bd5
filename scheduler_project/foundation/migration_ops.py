"""Migration operations that keep a busy database writable while they run."""

from django.db import migrations


def _build(schema_editor, model, index, *, create: bool) -> None:
    """CREATE or DROP INDEX CONCURRENTLY on PostgreSQL; the plain statement elsewhere."""
    if schema_editor.connection.vendor == "postgresql":
        sql = index.create_sql if create else index.remove_sql
        schema_editor.execute(sql(model, schema_editor, concurrently=True))
    elif create:
        schema_editor.add_index(model, index)
    else:
        schema_editor.remove_index(model, index)


class AddIndexConcurrently(migrations.AddIndex):
    """CREATE INDEX CONCURRENTLY on PostgreSQL (a plain build would block every loop's writes to
    the table for as long as it takes on hundreds of millions of rows); a plain index elsewhere.
    The migration using it must set `atomic = False`."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _build(schema_editor, model, self.index, create=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _build(schema_editor, model, self.index, create=False)


class RemoveIndexConcurrently(migrations.RemoveIndex):
    """DROP INDEX CONCURRENTLY on PostgreSQL (a plain drop waits for, and then blocks, every
    reader and writer of the table); a plain drop elsewhere. The migration must set `atomic = False`."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _build(schema_editor, model, index, create=False)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _build(schema_editor, model, index, create=True)
