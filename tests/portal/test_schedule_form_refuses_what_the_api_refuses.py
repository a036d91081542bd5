"""The portal's schedule form takes only what the API takes: each value the API's serializers
refuse is refused here too, with a message next to its field, a 400, and nothing stored; nothing is
cut to fit a column (a cut URL calls somewhere else). The bounds are the service's
(schedules.services.validate_fields), so every caller has them."""

import pytest
from django.urls import reverse

from schedules.models import Schedule, ScheduleVersion

pytestmark = pytest.mark.django_db


def form(target, tenant=None, **over):
    data = {"name": "n", "expression": "0 3 * * *", "time_zone": "UTC", "target_url": target.url + "/x",
            "target_method": "POST", "payload": "{}", "target_headers": "", "max_attempts": "5",
            "backoff_base_seconds": "1", "backoff_max_seconds": "300", "misfire_policy": "run_once",
            "misfire_grace_seconds": "60", "catchup_limit": "10", "overlap_policy": "allow",
            "dst_skipped": "next_valid", "dst_repeated": "earlier"}
    if tenant is not None:
        data["tenant"] = str(tenant.id)
    data.update(over)
    return data


BAD = {
    # field: (value, words of the message shown next to it)
    "a name longer than its column": ("name", "n" * 201, "at most 200 characters"),
    "a URL longer than its column": ("target_url", None, "at most 2000 characters"),
    "an expression longer than its column": ("expression", "FREQ=DAILY;BYHOUR=3;" + "BYSECOND=0;" * 200,
                                             "at most 2000 characters"),
    "a backoff of 1e308 seconds": ("backoff_max_seconds", "1e308", "7 days"),
    "a backoff base under a millisecond": ("backoff_base_seconds", "0.0001", "between 0.001 and 604800"),
    "a backoff in Arabic-Indic digits": ("backoff_base_seconds", "١", "give a number of seconds"),
    "a backoff with an underscore": ("backoff_base_seconds", "1_0", "give a number of seconds"),
    "a catch-up limit of 0": ("catchup_limit", "0", "catchupLimit must be between 1 and 10000"),
    "a catch-up limit of a billion": ("catchup_limit", "999999999", "catchupLimit must be between 1 and 10000"),
    "a misfire grace past a week": ("misfire_grace_seconds", "604801", "misfireGraceSeconds must be between 0"),
    "a method the API does not call": ("target_method", "TRACE", "choose one of POST"),
    "an overlap policy that does not exist": ("overlap_policy", "sometimes", "choose one of"),
    # JSON that Python reads but PostgreSQL cannot store (each was a 500 there).
    "a payload with NaN": ("payload", '{"a": NaN}', "NaN is not a JSON number"),
    "a payload with Infinity": ("payload", "[Infinity]", "Infinity is not a JSON number"),
    "a payload with an escaped NUL": ("payload", '{"a": "\\u0000"}', "may not contain NUL"),
    "a payload with a lone surrogate": ("payload", '{"a": "\\ud800"}', "valid Unicode"),
    "a payload nested 100 deep": ("payload", "[" * 100 + "]" * 100, "nested more than 64 levels"),
}


def _value(case, target):
    field, value, _ = BAD[case]
    if field == "target_url" and value is None:
        value = target.url + "/" + "u" * 2001
    return field, value


@pytest.mark.parametrize("case", list(BAD))
def test_a_new_schedule_with_it_is_refused_with_a_message_and_nothing_is_stored(operator, tenant, target, case):
    field, value = _value(case, target)
    before = (Schedule.objects.count(), ScheduleVersion.objects.count())
    resp = operator.post(reverse("schedules-create"), form(target, tenant, **{field: value}))
    assert resp.status_code == 400
    html = resp.content.decode()
    assert BAD[case][2] in html and 'class="field-error"' in html
    assert (Schedule.objects.count(), ScheduleVersion.objects.count()) == before


@pytest.mark.parametrize("case", ["a backoff of 1e308 seconds", "a catch-up limit of a billion",
                                  "a name longer than its column"])
def test_an_edit_with_it_is_refused_and_the_schedule_keeps_its_version(acme, schedule, target, case):
    field, value = _value(case, target)
    resp = acme.post(reverse("schedules-edit", args=[schedule.id]),
                     form(target, version=str(schedule.version), **{field: value}))
    assert resp.status_code == 400 and BAD[case][2] in resp.content.decode()
    schedule.refresh_from_db()
    assert schedule.version == 1 and schedule.versions.count() == 1


def test_values_at_the_bounds_are_taken(operator, tenant, target):
    resp = operator.post(reverse("schedules-create"), form(
        target, tenant, name="n" * 200, backoff_base_seconds="0.001", backoff_max_seconds="604800",
        catchup_limit="10000", misfire_grace_seconds="604800"))
    assert resp.status_code == 302
    v = Schedule.objects.get(tenant=tenant).current
    assert (len(v.name), v.backoff_max_seconds, v.catchup_limit, v.misfire_grace_seconds) == (200, 604800, 10000, 604800)


def test_a_payload_as_large_as_the_api_takes_can_be_saved_and_edited_in_the_form(acme, schedule, target, settings):
    # The form shows the payload pretty-printed; the text middleware's 4,000-character bound for
    # form values refused every edit of a schedule whose payload the API had taken.
    import json

    payload = {"rows": ["x" * 90 for _ in range(500)]}  # ~47 KB of JSON, under the 64 KiB limit
    text = json.dumps(payload, indent=2)
    assert 4000 < len(text) < settings.SCHEDULER_MAX_PAYLOAD_BYTES
    resp = acme.post(reverse("schedules-edit", args=[schedule.id]),
                     form(target, version=str(schedule.version), payload=text, expression="0 4 * * *"))
    assert resp.status_code == 302, resp.content[:300]
    schedule.refresh_from_db()
    assert schedule.version == 2 and schedule.current.payload == payload

    # Pretty-printed, a payload under the limit can be longer than the limit in characters (a
    # fixed 70,000-character field bound cut this one and the edit failed as "not JSON").
    payload = {"rows": [0] * 12_000}
    text = json.dumps(payload, indent=2)
    assert len(json.dumps(payload)) < settings.SCHEDULER_MAX_PAYLOAD_BYTES < 70_000 < len(text)
    resp = acme.post(reverse("schedules-edit", args=[schedule.id]),
                     form(target, version="2", payload=text, expression="0 5 * * *"))
    assert resp.status_code == 302, resp.content[:300]
    schedule.refresh_from_db()
    assert schedule.version == 3 and schedule.current.payload == payload


def test_a_payload_over_the_limit_is_refused_by_the_form_and_far_over_it_before_the_view(operator, tenant, target,
                                                                                        settings):
    import json

    over = json.dumps({"blob": "x" * (settings.SCHEDULER_MAX_PAYLOAD_BYTES + 10)})
    resp = operator.post(reverse("schedules-create"), form(target, tenant, payload=over))
    assert resp.status_code == 400 and 'class="field-error"' in resp.content.decode()
    huge = json.dumps({"blob": "x" * (3 * settings.SCHEDULER_MAX_PAYLOAD_BYTES)})
    resp = operator.post(reverse("schedules-create"), form(target, tenant, payload=huge))
    assert resp.status_code == 400 and "payload field is longer than" in resp.content.decode()
    # Any other field keeps the short bound.
    resp = operator.post(reverse("schedules-create"), form(target, tenant, name="n" * 5000))
    assert resp.status_code == 400 and "longer than 4000 characters" in resp.content.decode()
    assert not Schedule.objects.exists()


def test_the_create_form_reads_every_tenants_allowlist_in_one_query(operator, tenant, target):
    # The URL field lists each tenant's allowed prefixes: one query per tenant made the form of an
    # operator with hundreds of tenants hundreds of queries slower.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from schedules.tenants import create_tenant

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            resp = operator.get(reverse("schedules-create"))
        assert resp.status_code == 200
        return len(ctx.captured_queries)

    few = queries()
    for i in range(12):
        create_tenant(f"t{i}", name=f"T{i}", allow_targets=[target.url + f"/t{i}/"])
    many = operator.get(reverse("schedules-create"))
    assert b"/t11/" in many.content
    assert queries() == few
