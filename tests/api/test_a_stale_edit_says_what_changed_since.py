"""Issue 26, finding 7 (the API's side): a PATCH with a stale expectedVersion answers 409 with,
field by field, what differs between the version the client expected and the current one, so the
client re-applies its change on purpose instead of overwriting a colleague's."""

from runs.actions import edit_schedule
from tests.helpers import ACTOR, utc


def test_a_stale_expected_version_answers_what_changed_since(api, schedule):
    edit_schedule(schedule, expected_version=1, changes={"expression": "30 2 * * SUN"}, by=ACTOR)
    edit_schedule(schedule, expected_version=2, changes={"expression": "45 3 * * SUN", "target_method": "PUT",
                                                         "start_at": utc(2030, 1, 1)}, by=ACTOR)
    resp = api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": 2, "expression": "30 2 * * SUN"},
                     format="json")
    assert resp.status_code == 409
    body = resp.json()
    assert body["currentVersion"] == 3 and body["expectedVersion"] == 2
    assert body["changedSince"] == {
        "expression": {"expected": "30 2 * * SUN", "current": "45 3 * * SUN"},
        "target.method": {"expected": "POST", "current": "PUT"},
        "startAt": {"expected": None, "current": "2030-01-01T00:00:00Z"},
    }
    assert schedule.versions.count() == 3  # nothing was written


def test_a_version_the_schedule_never_had_has_no_changes_to_tell(api, schedule):
    resp = api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": 7, "name": "x"}, format="json")
    assert resp.status_code == 409
    assert resp.json()["currentVersion"] == 1 and resp.json()["changedSince"] is None


def documented_edit(api):
    """docs/api.md's edit() as a client copies it, over the test client."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "def edit(" in b]
    code = code[:code.index("\nedit(")]  # the definition, not the example calls

    class Answer:
        def __init__(self, resp):
            self.resp, self.status_code = resp, resp.status_code

        def json(self):
            return self.resp.json()

        def raise_for_status(self):
            assert self.status_code < 400, self.resp.json()

    class Session:
        def patch(self, url, json, timeout):
            return Answer(api.patch(url, json, format="json"))

    namespace = {"s": Session(), "API": ""}
    exec(code, namespace)
    return namespace["edit"]


def test_the_documented_edit_applies_on_top_of_other_fields_and_stops_on_the_same_field(api, schedule):
    import pytest

    edit = documented_edit(api)
    edit_schedule(schedule, expected_version=1, changes={"name": "theirs"}, by=ACTOR)
    body = edit(schedule.id, 1, expression="30 2 * * SUN", target={"timeoutSeconds": 20})
    assert body["version"] == 3 and body["name"] == "theirs" and body["expression"] == "30 2 * * SUN"
    with pytest.raises(RuntimeError, match="expression"):
        edit(schedule.id, 2, expression="45 3 * * SUN")
    assert schedule.versions.count() == 3
