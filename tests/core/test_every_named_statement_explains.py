"""Every named statement of the PostgreSQL store (`-- name: RunClaimDue` on its first line) is
whole: EXPLAIN takes it as written, with parameters of the types the store passes, so none depends
on text assembled at the call site and each can be pasted into psql. A statement added without a
name, or a name used twice, fails here too."""

import json
import uuid
from datetime import timedelta

import pytest
from django.db import connection

from runs.store import postgres as pg
from scheduler_project.foundation.dbclock import db_now

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql_only("EXPLAIN of PostgreSQL statements")]

# The statements the hot paths run, by name: claim, complete, extend, materialise, events, advance.
EXPECTED = {"RunDueTenants", "RunDueCandidates", "RunClaim", "RunClaimDue", "RunExtendLeases", "RunComplete",
            "AttemptKeepLateResult", "RunMaterialise", "OutboxInsertEvents", "ScheduleAdvance"}


def named_statements() -> dict[str, str]:
    found: dict[str, str] = {}
    for value in vars(pg).values():
        for text in (value.values() if isinstance(value, dict) else [value]):
            if isinstance(text, str) and text.startswith("-- name:"):
                name = text.split("\n", 1)[0].split(":", 1)[1].strip()
                assert name not in found or found[name] == text, f"two statements named {name}"
                found[name] = text
    return found


def parameters(name: str) -> dict:
    """Values of the types the store binds (see the calls in runs/store/postgres.py)."""
    now = db_now()
    some = str(uuid.uuid4())
    params = {"now": now, "stamp": now, "until": now + timedelta(seconds=30), "lo": now - timedelta(hours=1),
              "hi": now + timedelta(hours=1), "floor": now - timedelta(days=1), "max_tenants": 10,
              "per_tenant": 10, "full": json.dumps({some: ["h:80"]}), "tenants": [some], "limit": 10, "lease": 30,
              "shift": 0, "worker": "w", "ids": "{%s}" % some, "gens": [1], "rows": "[]", "kinds": ["run.leased"],
              "payloads": ["{}"], "runs": [some], **pg.share_params(_Holding())}
    if name == "ScheduleAdvance":
        params.update(ids=[some], next=[now], status=["active"], completed=[None], errors=[""])
    return params


class _Holding:
    tenant_cap = 5
    host_cap = 5
    tenants: dict = {}
    hosts: dict = {}


def test_the_hot_statements_are_named():
    names = {n.removesuffix("AboveFloor") for n in named_statements()}
    assert EXPECTED <= names, sorted(EXPECTED - names)


@pytest.mark.parametrize("name", sorted(named_statements()))
def test_each_named_statement_explains_as_written(name):
    text = named_statements()[name]
    with connection.cursor() as cur:
        cur.cursor.execute("EXPLAIN " + text, parameters(name), prepare=False)
        plan = [row[0] for row in cur.cursor.fetchall()]
    assert plan and "cost=" in plan[0], plan
