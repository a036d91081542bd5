"""Every named statement of the PostgreSQL store (`-- name: RunClaimDue` on its first line) is
whole: EXPLAIN takes it as written, with parameters of the types the store passes, so none depends
on text assembled at the call site and each can be pasted into psql. A statement added without a
name, or a name used twice, fails here too. The values the statements spell out (states, event
kinds, the evidence object, an event's published time) are checked against the Python they
stand for."""

import json
import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection

from runs.decisions import EVIDENCE
from runs.models import TERMINAL_STATES, EventKind, RunState
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


def parameters(name: str, floor=None) -> dict:
    """Values of the types the store binds (see the calls in runs/store/postgres.py)."""
    now = db_now()
    some = str(uuid.uuid4())
    params = {"now": now, "stamp": now, "until": now + timedelta(seconds=30), "lo": now - timedelta(hours=1),
              "hi": now + timedelta(hours=1), "floor": floor or now - timedelta(days=1), "ceiling": now, "max_tenants": 10,
              "limits": [10], "hosts": ["h:80"], "keys": ["k"], "space": 1, "full": json.dumps({some: ["h:80"]}), "tenants": [some], "limit": 10, "lease": 30,
              "shift": 0, "worker": "w", "ids": "{%s}" % some, "gens": [1], "rows": "[]", "kinds": ["run.leased"],
              "payloads": ["{}"], "runs": [some], "gate": pg.SCAN_GATE, **pg.share_params(_Holding())}
    if name == "ScheduleAdvance":
        params.update(ids=[some], next=[now], status=["active"], completed=[None], errors=[""])
    return params


class _Holding:
    tenant_cap = 5
    host_cap = 5
    tenants: dict = {}
    hosts: dict = {}


def test_the_hot_statements_are_named():
    assert EXPECTED <= set(named_statements()), sorted(EXPECTED - set(named_statements()))


@pytest.mark.parametrize("floor", [None, pg.NO_FLOOR], ids=["floor", "no-floor"])
@pytest.mark.parametrize("name", sorted(named_statements()))
def test_each_named_statement_explains_as_written(name, floor):
    text = named_statements()[name]
    with connection.cursor() as cur:
        cur.cursor.execute("EXPLAIN " + text, parameters(name, floor), prepare=False)
        plan = [row[0] for row in cur.cursor.fetchall()]
    assert plan and "cost=" in plan[0], plan


def _code(text: str) -> str:
    """The statement without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def test_every_state_and_event_kind_written_in_a_statement_is_a_member_of_its_enum():
    # Written as literals so that each statement can be pasted whole and a plain `state = 'ready'`
    # matches the partial indexes' predicates; a renamed enum value must not leave one behind.
    states, kinds = {s.value for s in RunState}, {k.value for k in EventKind}
    seen = set()
    for name, text in named_statements().items():
        code = _code(text)
        compared = re.findall(r"state(?: \|\| '')? = '([^']*)'", code)
        listed = [v for group in re.findall(r"state IN \(([^)]*)\)", code) for v in re.findall(r"'([^']*)'", group)]
        written = re.findall(r"'state', '([^']*)'", code)
        for value in compared + listed + written:
            assert value in states, (name, value)
        for value in re.findall(r"'(run\.[a-z_]+)'", code):
            assert value in kinds, (name, value)
        seen |= set(compared + listed + written)
    assert {RunState.READY, RunState.LEASED} <= seen  # the patterns above still find them


def test_the_terminal_states_in_the_complete_statement_are_the_terminal_states():
    (listed,) = re.findall(r"v\.s IN \(([^)]*)\)", pg.COMPLETE_SQL)
    assert set(re.findall(r"'([^']*)'", listed)) == {str(s) for s in TERMINAL_STATES}


def test_the_evidence_written_by_sql_is_the_evidence_python_writes():
    # runs.decisions.EVIDENCE: (key, attribute, empty is null); the JSON rows' columns per attribute.
    column = {"outcome": "o", "http_status": "h", "error_class": "c", "error": "m", "latency_ms": "l"}
    expected = ", ".join(f"'{key}', " + (f"NULLIF(v.{column[attr]}, '')" if empty_is_null else f"v.{column[attr]}")
                         for key, attr, empty_is_null in EVIDENCE)
    for text in (pg.COMPLETE_SQL, pg.KEEP_LATE_SQL):
        code = _code(text)
        start = code.index("jsonb_build_object('outcome'") + len("jsonb_build_object(")
        depth, end = 1, start
        while depth:
            depth += {"(": 1, ")": -1}.get(code[end], 0)
            end += 1
        assert " ".join(code[start:end - 1].split()) == expected


def test_an_events_published_time_is_decided_the_same_way_in_every_statement_that_writes_events():
    spelled = re.compile(r"\(SELECT CASE WHEN tn\.notification_url = '' THEN (\S+) END FROM schedules_tenant tn "
                         r"WHERE tn\.id = (\S+)\)")
    writers = {name for name, text in named_statements().items() if "INSERT INTO runs_outboxevent" in text}
    assert writers == {"RunClaim", "RunClaimDue", "RunComplete", "RunMaterialise", "OutboxInsertEvents"}
    for name in writers:
        (found,) = [m.groups() for m in spelled.finditer(named_statements()[name])]
        assert found[0] in ("%(now)s", "statement_timestamp()"), (name, found)
