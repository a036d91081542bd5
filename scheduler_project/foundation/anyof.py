"""`field__anyof=[...]`: the `IN` lookup, sent to PostgreSQL as one array parameter.

A loop that reads a batch's rows by key (thousands of keys) pays for `IN (%s, %s, ...)` per key
twice over in Python: Django prepares and quotes each placeholder's value, and psycopg splits a
query text of thousands of placeholders before it sends it. `= ANY(%s)` with the keys as one
array (psycopg dumps a list of UUIDs, ints or strings as an array of that type) reads the same
rows by the same index. On other engines it is the `IN` lookup itself.

Registered on every field when this module is imported: import it where the lookup is used.
"""

from django.db.models import Field, ForeignObject
from django.db.models.lookups import In


class AnyOf(In):
    lookup_name = "anyof"

    def as_postgresql(self, compiler, connection):
        if not self.rhs_is_direct_value():
            return super().as_sql(compiler, connection)  # a subquery: as `IN (SELECT ...)`
        values = list(dict.fromkeys(v for v in self.rhs if v is not None))
        if not values:
            # As `IN ()` does: nothing matches (Django's In raises EmptyResultSet for it).
            return super().as_sql(compiler, connection)
        lhs, lhs_params = self.process_lhs(compiler, connection)
        field = self.lhs.output_field
        values = [field.get_db_prep_value(v, connection, prepared=True) for v in values]
        return f"{lhs} = ANY(%s)", [*lhs_params, values]


# Related fields look up only what is registered on them (their `IN` is Django's RelatedIn).
Field.register_lookup(AnyOf)
ForeignObject.register_lookup(AnyOf)
