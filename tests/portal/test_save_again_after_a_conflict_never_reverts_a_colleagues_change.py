"""Issue 26, finding 7: after an edit conflict, "save again" silently reverted the other person's
change (the stale form posts every field). A stale form is now merged three ways: base = the
version it was loaded from, theirs = the current version, mine = what it posts. Only the fields
its editor changed are written; a field both changed is shown with both values and saved only
once its editor has chosen."""

from django.urls import reverse

from runs.actions import edit_schedule
from schedules.models import AuditEntry, Schedule
from tests.helpers import ACTOR


def loaded_form(client, schedule) -> dict:
    """What the edit form posts when saved unchanged: every field, as the page filled it."""
    resp = client.get(reverse("schedules-edit", args=[schedule.id]))
    assert resp.status_code == 200
    v = resp.context["v"]
    post = {name: "" if v.get(name) is None else str(v[name]) for name in (
        "name", "expression", "time_zone", "target_url", "target_method", "target_timeout_seconds", "max_attempts",
        "backoff_base_seconds", "backoff_max_seconds", "misfire_policy", "misfire_grace_seconds", "catchup_limit",
        "overlap_policy", "dst_skipped", "dst_repeated")}
    post.update(payload=v["payload"], target_headers=v["target_headers"], start_at=v["start_at_text"],
                end_at=v["end_at_text"], version=str(v["version"]))
    return post


def current(schedule):
    return Schedule.objects.select_related("current").get(id=schedule.id).current


def test_a_stale_form_saves_only_the_fields_its_editor_changed(operator, schedule):
    edit_schedule(schedule, expected_version=1, changes={"expression": "30 2 * * SUN"}, by=ACTOR)
    form = loaded_form(operator, schedule)  # version 2
    # A colleague changes the expression meanwhile ...
    edit_schedule(schedule, expected_version=2, changes={"expression": "45 3 * * SUN"}, by=ACTOR)
    # ... and this editor, from version 2's form, changes only the name.
    form["name"] = "weekly-report"
    resp = operator.post(reverse("schedules-edit", args=[schedule.id]), form, follow=True)
    assert resp.status_code == 200
    v = current(schedule)
    assert v.version == 4
    assert v.expression == "45 3 * * SUN", "the colleague's expression was reverted"
    assert v.name == "weekly-report"
    assert v.changes == {"name": ["nightly-report", "weekly-report"]}
    text = resp.content.decode()
    assert "only the fields you changed" in text and "Expression" in text


def test_a_field_both_changed_shows_both_values_and_saves_nothing_until_chosen(operator, schedule):
    form = loaded_form(operator, schedule)  # version 1, expression "0 2 * * *"
    edit_schedule(schedule, expected_version=1, changes={"expression": "45 3 * * SUN", "time_zone": "UTC"}, by=ACTOR)
    form["expression"] = "15 4 * * SUN"
    resp = operator.post(reverse("schedules-edit", args=[schedule.id]), form)
    assert resp.status_code == 409
    assert current(schedule).version == 2, "nothing may be saved while a field is in conflict"
    html = resp.content.decode()
    assert 'data-testid="conflicts"' in html
    assert "45 3 * * SUN" in html and "15 4 * * SUN" in html and "0 2 * * *" in html
    assert "Time zone" in html  # their other change is named, and kept in the form
    again = {k: v for k, v in resp.context["v"].items() if isinstance(v, (str, int)) and not k.endswith("_text")}
    assert resp.context["v"]["time_zone"] == "UTC" and resp.context["v"]["expression"] == "15 4 * * SUN"
    resolving = {**form, **{k: str(v) for k, v in again.items()}, "version": "2", "conflicts": "expression",
                 "start_at": "", "end_at": ""}

    # Saving again without a choice saves nothing and says why.
    resp = operator.post(reverse("schedules-edit", args=[schedule.id]), resolving)
    assert resp.status_code == 400 and current(schedule).version == 2
    assert "choose which value to keep" in resp.content.decode()

    # Keeping theirs writes nothing of the expression; the time zone stays UTC.
    resp = operator.post(reverse("schedules-edit", args=[schedule.id]), {**resolving, "keep_expression": "theirs"},
                         follow=True)
    assert resp.status_code == 200
    v = current(schedule)
    assert v.version == 2 and v.expression == "45 3 * * SUN" and v.time_zone == "UTC"


def test_choosing_mine_writes_mine_on_top_of_theirs(operator, schedule):
    form = loaded_form(operator, schedule)
    edit_schedule(schedule, expected_version=1, changes={"expression": "45 3 * * SUN", "name": "theirs"}, by=ACTOR)
    form["expression"] = "15 4 * * SUN"
    resp = operator.post(reverse("schedules-edit", args=[schedule.id]), form)
    assert resp.status_code == 409
    v = resp.context["v"]
    resolving = {**form, "expression": v["expression"], "name": v["name"], "version": "2", "conflicts": "expression",
                 "keep_expression": "mine"}
    resp = operator.post(reverse("schedules-edit", args=[schedule.id]), resolving, follow=True)
    assert resp.status_code == 200
    v = current(schedule)
    assert v.version == 3 and v.expression == "15 4 * * SUN" and v.name == "theirs"
    assert AuditEntry.objects.filter(object_id=str(schedule.id), action="schedule.edit").count() == 2


def test_the_same_change_on_both_sides_is_no_conflict(operator, schedule):
    form = loaded_form(operator, schedule)
    edit_schedule(schedule, expected_version=1, changes={"expression": "45 3 * * SUN"}, by=ACTOR)
    form["expression"] = "45 3 * * SUN"
    resp = operator.post(reverse("schedules-edit", args=[schedule.id]), form, follow=True)
    assert resp.status_code == 200 and current(schedule).version == 2
    assert "Nothing changed" in resp.content.decode()
