"""Schedule sets (POST /api/v1/schedules/apply, manage.py apply_schedules): a 500-schedule file
applied twice (the second time nothing changes), then 3 edits, 2 new and 5 removed with prune,
whose dry-run plan is what the apply then does, version for version and audit entry for audit
entry; the same through the API; a bad file changes nothing and names its error; adoption; and
two concurrent applies that do not make a schedule twice."""

import json
import threading
from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db import connection

from runs.schedule_apply import Action, apply_set
from scheduler_project.web.schedule_set import declared_from_files, declared_items
from schedules.models import AuditEntry, Schedule, ScheduleStatus, ScheduleVersion
from tests.helpers import ACTOR, at_once, make_schedule

pytestmark = pytest.mark.django_db
URL = "/api/v1/schedules/apply"


def item(to, i, **over):
    body = {"name": f"job-{i:04d}", "expression": f"{i % 60} * * * *", "timeZone": "UTC",
            "target": {"url": f"{to.url}/hook/{i}"}, "payload": {"n": i}}
    body.update(over)
    return body


def write(tmp_path, name, items):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"schedules": items}) if name.endswith(".yaml") else json.dumps(items))
    return str(path)


def apply_cmd(tenant, *files, dry_run=False, prune=False):
    out = StringIO()
    args = [tenant.slug, *files] + (["--dry-run"] if dry_run else []) + (["--prune"] if prune else [])
    call_command("apply_schedules", *args, stdout=out)
    return out.getvalue()


def snapshot(tenant):
    """Every schedule's row as it is, every version and every audit entry of the tenant."""
    return (sorted(Schedule.objects.filter(tenant=tenant).values_list("id", "version", "status", "enabled",
                                                                    "managed_name", "updated_at")),
            ScheduleVersion.objects.filter(schedule__tenant=tenant).count(),
            AuditEntry.objects.filter(tenant=tenant).count())


def plan_shape(plan_json):
    """What a plan says it does, without the versions it reaches (a dry run cannot know the ids of
    schedules it has not made)."""
    return sorted((s["action"], s["name"], json.dumps(s.get("changes", {}), sort_keys=True))
                  for s in plan_json["plan"])


def cycle_sets(target):
    first = [item(target, i) for i in range(500)]
    second = [dict(x) for x in first[5:]]  # job-0000..0004 removed
    second[0] = item(target, 5, expression="*/7 * * * *")
    second[1] = item(target, 6, payload={"n": 6, "new": True})
    second[2] = item(target, 7, target={"url": f"{target.url}/moved", "method": "PUT"})
    second += [item(target, 1000), item(target, 1001)]
    return first, second


def check_second_apply(tenant, before, plan_json):
    """3 edits (version 2 each, one edit entry each), 2 creates, 5 archives, one apply entry; the
    rest of the tenant as it was."""
    assert plan_json["summary"] == {"create": 2, "adopt": 0, "edit": 3, "unchanged": 492, "archive": 5}
    edits = {s["name"]: s for s in plan_json["plan"] if s["action"] == "edit"}
    assert set(edits) == {"job-0005", "job-0006", "job-0007"}
    assert edits["job-0005"]["changes"] == {"expression": ["5 * * * *", "*/7 * * * *"]}
    assert edits["job-0007"]["changes"] == {"target.url": [f"{_url(tenant)}/hook/7", f"{_url(tenant)}/moved"],
                                            "target.method": ["POST", "PUT"]}
    for name in edits:
        s = Schedule.objects.select_related("current").get(tenant=tenant, managed_name=name)
        assert s.version == 2 == edits[name]["version"]
        assert AuditEntry.objects.filter(action="schedule.edit", object_id=str(s.id)).count() == 1
    archived = Schedule.objects.filter(tenant=tenant, managed_name__in=[f"job-{i:04d}" for i in range(5)])
    assert {s.status for s in archived} == {ScheduleStatus.ARCHIVED} and archived.count() == 5
    created = Schedule.objects.filter(tenant=tenant, managed_name__in=["job-1000", "job-1001"])
    assert created.count() == 2 and {s.version for s in created} == {1}
    schedules, versions, entries = snapshot(tenant)
    assert versions == before[1] + 3 + 2
    new = AuditEntry.objects.filter(tenant=tenant).order_by("id")[before[2]:]
    assert sorted(e.action for e in new) == sorted(["schedule.edit"] * 3 + ["schedule.create"] * 2
                                                   + ["schedule.archive"] * 5 + ["schedule.apply"])
    touched = {s.id for s in archived} | {s.id for s in created} | {
        Schedule.objects.get(tenant=tenant, managed_name=n).id for n in edits}
    assert [row for row in schedules if row[0] not in touched] == [row for row in before[0] if row[0] not in touched]


def _url(tenant):
    return tenant.allowed_prefixes()[0].rstrip("/")


def test_a_500_schedule_file_applied_twice_then_edited_new_and_pruned_through_the_command(tenant, target, tmp_path):
    bystander = make_schedule(tenant, target.url + "/hook/other", name="job-0001")  # not managed: left alone
    first, second = cycle_sets(target)
    out = apply_cmd(tenant, write(tmp_path, "jobs.yaml", first))
    assert "Applied: 500 create" in out
    assert Schedule.objects.filter(tenant=tenant, managed_name__isnull=False).count() == 500
    assert AuditEntry.objects.filter(tenant=tenant, action="schedule.apply").count() == 1
    before = snapshot(tenant)

    out = apply_cmd(tenant, write(tmp_path, "jobs.yaml", first))
    assert "No changes: the schedules match the set (500 unchanged)." in out
    assert snapshot(tenant) == before

    second_file = write(tmp_path, "jobs2.json", second)
    dry = apply_set(tenant, declared_from_files([second_file]), prune=True, dry_run=True, by=ACTOR).as_json()
    out = apply_cmd(tenant, second_file, dry_run=True, prune=True)
    assert "Plan: 2 to create, 0 to adopt, 3 to edit, 5 to archive, 492 unchanged." in out
    assert '  ~ edit      job-0005' in out and '        expression: "5 * * * *" -> "*/7 * * * *"' in out
    assert "  - archive   job-0000" in out and "  + create    job-1000" in out
    assert snapshot(tenant) == before  # dry runs change nothing

    done = apply_set(tenant, declared_from_files([second_file]), prune=True, by=ACTOR).as_json()
    assert done["applied"] and not dry["applied"]
    assert plan_shape(done) == plan_shape(dry)
    check_second_apply(tenant, before, done)
    bystander.refresh_from_db()
    assert (bystander.version, bystander.status, bystander.managed_name) == (1, ScheduleStatus.ACTIVE, None)
    after = snapshot(tenant)
    assert "No changes" in apply_cmd(tenant, second_file, prune=True)
    assert snapshot(tenant) == after


def test_the_same_cycle_through_the_api(api, tenant, target):
    first, second = cycle_sets(target)
    resp = api.post(URL, {"schedules": first}, format="json")
    assert resp.status_code == 200, resp.content[:500]
    assert resp.json()["summary"]["create"] == 500 and resp.json()["applied"]
    before = snapshot(tenant)
    again = api.post(URL, {"schedules": first}, format="json").json()
    assert (again["changed"], again["applied"], again["summary"]["unchanged"]) == (False, False, 500)
    assert snapshot(tenant) == before

    dry = api.post(URL, {"schedules": second, "prune": True, "dryRun": True}, format="json").json()
    assert snapshot(tenant) == before and not dry["applied"] and dry["changed"]
    done = api.post(URL, {"schedules": second, "prune": True}, format="json").json()
    assert plan_shape(done) == plan_shape(dry)
    check_second_apply(tenant, before, done)


def test_without_prune_a_schedule_left_out_is_kept_and_listed(api, tenant, target):
    api.post(URL, {"schedules": [item(target, 1), item(target, 2)]}, format="json")
    body = api.post(URL, {"schedules": [item(target, 1)]}, format="json").json()
    assert body["notDeclared"] == ["job-0002"] and not body["changed"]
    assert Schedule.objects.get(managed_name="job-0002").status == ScheduleStatus.ACTIVE


def test_a_bad_file_changes_nothing_and_names_the_file_the_schedule_and_the_field(tenant, target, tmp_path):
    apply_cmd(tenant, write(tmp_path, "a.yaml", [item(target, i) for i in range(3)]))
    before = snapshot(tenant)
    good = write(tmp_path, "good.yaml", [item(target, 0, expression="*/9 * * * *"), item(target, 7)])
    bad = write(tmp_path, "bad.json", [item(target, 8), {**item(target, 9), "target": {"url": "http://elsewhere.example/x"}},
                                        item(target, 10, timeZone="Mars/Olympus")])
    with pytest.raises(CommandError) as e:
        apply_cmd(tenant, good, bad, prune=True)
    text = str(e.value)
    assert "nothing was changed" in text
    assert f'{bad}: schedules[1].target: schedule "job-0009": http://elsewhere.example/x is not on this ' in text
    assert f'{bad}: schedules[2].timeZone: schedule "job-0010"' in text
    assert snapshot(tenant) == before

    broken = tmp_path / "broken.yaml"
    broken.write_text("schedules:\n  - name: [unclosed\n")
    with pytest.raises(CommandError, match="broken.yaml: not valid YAML"):
        apply_cmd(tenant, str(broken))
    dup = write(tmp_path, "dup.yaml", [item(target, 1)])
    with pytest.raises(CommandError, match=r'schedules\[0\]\.name: schedule "job-0001": this name is declared twice'):
        apply_cmd(tenant, dup, dup)
    unknown = write(tmp_path, "unknown.yaml", [{**item(target, 1), "colour": "red"}])
    with pytest.raises(CommandError, match=r'unknown.yaml: schedules\[0\]\.colour: schedule "job-0001"'):
        apply_cmd(tenant, unknown)
    assert snapshot(tenant) == before


def test_a_bad_set_through_the_api_is_a_400_that_names_the_item_and_changes_nothing(api, tenant, target):
    before = snapshot(tenant)
    # Items the create's serializer refuses are reported first, all of them...
    resp = api.post(URL, {"schedules": [item(target, 1), {"expression": "* * * * *"}, {"name": "x"}]}, format="json")
    assert resp.status_code == 400
    errors = resp.json()["errors"]
    assert "schedules[1].name" in errors and "schedules[1].timeZone" in errors
    assert errors["schedules[2].expression"] == ['schedule "x": This field is required.']
    # ...then what the service checks (the rule, the allowlist, quotas), for every item too.
    resp = api.post(URL, {"schedules": [item(target, 1), item(target, 2, expression="61 * * * *"),
                                        item(target, 3, timeZone="Nowhere/Else")]}, format="json")
    assert resp.status_code == 400
    errors = resp.json()["errors"]
    assert errors["schedules[1].expression"][0].startswith('schedule "job-0002": ')
    assert errors["schedules[2].timeZone"][0].startswith('schedule "job-0003": ')
    assert snapshot(tenant) == before


def test_an_existing_schedule_is_adopted_only_when_an_item_names_its_id(api, tenant, target):
    old = make_schedule(tenant, target.url + "/hook/1", name="legacy", expression="1 * * * *", tz="UTC")
    plain = api.post(URL, {"schedules": [item(target, 1, name="legacy")]}, format="json").json()
    made = Schedule.objects.get(tenant=tenant, managed_name="legacy")
    assert plain["summary"]["create"] == 1 and made.id != old.id  # same display name: not taken over
    old2 = make_schedule(tenant, target.url + "/hook/2", name="other", expression="2 * * * *", tz="UTC")
    body = api.post(URL, {"schedules": [item(target, 1, name="legacy"),
                                        item(target, 2, name="adopted", adopt=str(old2.id))]}, format="json").json()
    step = next(s for s in body["plan"] if s["name"] == "adopted")
    assert step["action"] == "adopt" and step["id"] == str(old2.id)
    assert step["changes"] == {"name": ["other", "adopted"], "payload": [{}, {"n": 2}]}
    old2.refresh_from_db()
    assert (old2.managed_name, old2.version) == ("adopted", 2)
    again = api.post(URL, {"schedules": [item(target, 1, name="legacy"),
                                         item(target, 2, name="adopted", adopt=str(old2.id))]}, format="json").json()
    assert not again["changed"]
    assert api.get(f"/api/v1/schedules/{old2.id}").json()["managedName"] == "adopted"
    assert api.get(f"/api/v1/schedules/{old.id}").json()["managedName"] is None
    taken = api.post(URL, {"schedules": [item(target, 3, name="again", adopt=str(old2.id))]}, format="json")
    assert taken.status_code == 400
    assert taken.json()["errors"]["schedules[0].adopt"] == [
        f'schedule "again": schedule {old2.id} is already managed as "adopted"']


def test_enabled_is_managed_only_when_given(api, tenant, target):
    api.post(URL, {"schedules": [item(target, 1)]}, format="json")
    s = Schedule.objects.get(managed_name="job-0001")
    api.patch(f"/api/v1/schedules/{s.id}", {"expectedVersion": 1, "enabled": False}, format="json")
    assert not api.post(URL, {"schedules": [item(target, 1)]}, format="json").json()["changed"]
    body = api.post(URL, {"schedules": [item(target, 1, enabled=True)]}, format="json").json()
    assert body["plan"][0]["changes"] == {"enabled": [False, True]}
    s.refresh_from_db()
    assert s.enabled and s.version == 1


def test_a_sets_spread_is_applied_compared_and_left_out_means_the_tenants_default(api, tenant, target):
    # Daily rules, so a 600 s window fits; the spread is a versioned field like the others.
    daily = dict(expression="0 3 * * *")
    body = api.post(URL, {"schedules": [item(target, 1, spreadSeconds=600, **daily),
                                        item(target, 2, **daily)]}, format="json").json()
    assert body["summary"]["create"] == 2
    one, two = (Schedule.objects.select_related("current").get(managed_name=n) for n in ("job-0001", "job-0002"))
    assert (one.current.spread_seconds, two.current.spread_seconds) == (600, 0)
    again = api.post(URL, {"schedules": [item(target, 1, spreadSeconds=600, **daily),
                                         item(target, 2, **daily)]}, format="json").json()
    assert not again["changed"]
    edit = api.post(URL, {"schedules": [item(target, 1, spreadSeconds=300, **daily), item(target, 2, **daily)]},
                    format="json").json()
    assert [s["changes"] for s in edit["plan"] if s["action"] == "edit"] == [{"spreadSeconds": [600, 300]}]
    # A tenant default for new schedules: a set leaving the spread out means it for every item.
    type(tenant).objects.filter(id=tenant.id).update(default_spread_seconds=120)
    later = api.post(URL, {"schedules": [item(target, 1, spreadSeconds=300, **daily), item(target, 2, **daily)]},
                     format="json").json()
    assert [s["changes"] for s in later["plan"] if s["action"] == "edit"] == [{"spreadSeconds": [0, 120]}]
    # A default that does not fit a rule (every minute) gives that item none, and is no change.
    minutely = api.post(URL, {"schedules": [item(target, 3, expression="* * * * *")]}, format="json").json()
    assert minutely["summary"]["create"] == 1
    assert Schedule.objects.select_related("current").get(managed_name="job-0003").current.spread_seconds == 0
    assert not api.post(URL, {"schedules": [item(target, 3, expression="* * * * *")]}, format="json").json()["changed"]


def test_declared_items_take_the_single_creates_fields():
    (d,) = declared_items([{"name": "a", "expression": "0 * * * *", "timeZone": "UTC",
                            "target": {"url": "http://x.example/", "timeoutSeconds": 5}}])
    assert (d.name, d.fields["target_timeout_seconds"], d.enabled, d.adopt) == ("a", 5, None, None)
    assert {str(a) for a in Action} == {"create", "adopt", "edit", "unchanged", "archive"}


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_applies_do_not_make_a_schedule_twice(tenant, target):
    declared = declared_items([item(target, i) for i in range(30)])
    plans = at_once(lambda: apply_set(tenant, declared, by=ACTOR).counts())
    assert Schedule.objects.filter(tenant=tenant, managed_name__isnull=False).count() == 30
    assert sorted(p["create"] for p in plans) == [0, 30]
    assert sorted(p["unchanged"] for p in plans) == [0, 30]
