"""The statements every API request and every create runs are kept prepared by PostgreSQL
(scheduler_project/foundation/postgresql/base.py): the key lookup and a create's inserts are parsed and
planned once per connection, not per request. Nothing else is prepared (the dispatch statements
must not be: a plan cached on a nearly empty queue table goes stale), `prepare_threshold=none`
turns it off, and a column added by a migration while statements are prepared fails no request."""

import psycopg
import pytest
from django.db import connection, connections

from schedules.models import Schedule
from tests.api.conftest import schedule_body

pytestmark = [
    pytest.mark.postgresql_only("PostgreSQL's prepared statements"),
    pytest.mark.django_db(transaction=True),
]


def prepared() -> list[tuple[str, int, int]]:
    """This session's prepared statements: (start of the text, generic plans, custom plans)."""
    with connection.cursor() as cur:
        cur.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return sorted((statement.lstrip()[:40], generic, custom) for statement, generic, custom in cur.fetchall())


def create(api, target, n: int) -> None:
    for i in range(n):
        response = api.post("/api/v1/schedules", schedule_body(target, name=f"s{i}"), format="json")
        assert response.status_code == 201, response.content


def test_the_key_lookup_and_a_creates_inserts_are_prepared_and_nothing_else(api, target):
    create(api, target, 6)  # psycopg prepares a statement on the run after its 5th by default
    names = [text for text, _, _ in prepared()]
    assert len(names) == 2, names
    assert names[0].startswith("WITH found AS") and names[1].startswith("WITH new_version AS"), names
    create(api, target, 4)
    for text, generic, custom in prepared():
        # Each later run executes the prepared statement (PostgreSQL plans a custom plan for the
        # first five, then keeps a generic one when it is no worse).
        assert generic + custom == 5, (text, generic, custom)
    assert Schedule.objects.count() == 10


def test_prepare_threshold_none_prepares_nothing(api, target):
    options = {**connection.settings_dict["OPTIONS"], "prepare_threshold": None}
    wrapper = type(connections["default"])({**connection.settings_dict, "OPTIONS": options})
    new = wrapper.get_new_connection(wrapper.get_connection_params())
    try:
        assert new.prepare_threshold is None  # DATABASE_URL's ?prepare_threshold=none gets to psycopg
    finally:
        new.close()
    connection.ensure_connection()
    connection.connection.prepare_threshold = None
    try:
        create(api, target, 7)
        assert prepared() == []
    finally:
        connection.close()  # the next test gets psycopg's default again


def test_a_column_added_while_statements_are_prepared_fails_no_request(api, target):
    create(api, target, 6)
    assert len(prepared()) == 2
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as migration:
        migration.execute("ALTER TABLE schedules_schedule ADD COLUMN probe integer NOT NULL DEFAULT 0")
        migration.execute("ALTER TABLE schedules_apikey ADD COLUMN probe text")
        migration.execute("ALTER TABLE schedules_auditentry ADD COLUMN probe text")
        try:
            response = api.post("/api/v1/schedules", schedule_body(target, name="after"), format="json")
            assert response.status_code == 201, response.content
            assert Schedule.objects.filter(id=response.json()["id"], current__name="after").exists()
        finally:
            connection.close()
            for table in ("schedules_schedule", "schedules_apikey", "schedules_auditentry"):
                migration.execute(f"ALTER TABLE {table} DROP COLUMN probe")
