"""Values that used to answer 500 in the portal, or a wrong message, or the internal field name:
NUL in a filter or a key label (PostgreSQL refuses NUL in text), caps given as `²`, 30 digits,
-1 or 0, backfills from year 1 or to year 9999. Each is now a 400 or a message that names the field
as the page does, and nothing changes."""

import pytest
from django.urls import reverse

from runs.models import Run
from schedules.models import ApiKey, AuditEntry, TargetPrefix, Tenant

pytestmark = pytest.mark.django_db

BAD_CAPS = ["²", "9" * 30, "-1", "0", "1.5", "١٢", " 1 2", "1e3"]


@pytest.mark.parametrize("path, param", [("schedules-list", "q"), ("schedules-audit", "action"),
                                         ("schedules-audit", "actor"), ("schedules-audit", "object"),
                                         ("runs-dlq", "error"), ("runs-list", "state")])
def test_nul_in_a_filter_is_a_400_that_says_what_to_remove(operator, path, param):
    for value in ("a\x00b", "\x00"):
        resp = operator.get(reverse(path), {param: value})
        assert resp.status_code == 400
        assert "NUL character" in resp.content.decode()


@pytest.mark.parametrize("path, param", [("schedules-list", "q"), ("schedules-audit", "actor"), ("runs-dlq", "error")])
def test_a_huge_filter_is_a_400_that_says_to_shorten_it(operator, path, param):
    # SQLite refuses LIKE patterns over 50,000 bytes: these answered 500 on the embedded database.
    resp = operator.get(reverse(path), {param: "x" * 100_000})
    assert resp.status_code == 400
    assert "longer than 4000 characters" in resp.content.decode()


def test_nul_in_a_key_label_is_a_400_and_no_key_is_made(operator, tenant):
    resp = operator.post(reverse("schedules-key-create", args=[tenant.id]), {"label": "ci\x00bot"})
    assert resp.status_code == 400 and "NUL character" in resp.content.decode()
    assert not ApiKey.objects.filter(tenant=tenant).exists()


def test_a_key_label_over_200_characters_is_a_message_and_no_key_is_made(operator, tenant):
    resp = operator.post(reverse("schedules-key-create", args=[tenant.id]), {"label": "x" * 201})
    assert resp.status_code == 200
    assert "Label: must be at most 200 characters" in resp.content.decode()
    assert not ApiKey.objects.filter(tenant=tenant).exists()


def test_a_control_character_in_a_key_label_is_refused_by_the_service_for_every_caller(tenant, api):
    from scheduler_project.foundation.errors import ValidationFailed
    from schedules.services import SYSTEM
    from schedules.tenants import create_api_key

    with pytest.raises(ValidationFailed) as e:
        create_api_key(tenant, label="a\x1bb", by=SYSTEM)
    assert e.value.errors == {"label": ["may not contain the control character U+001B"]}
    resp = api.post("/api/v1/keys", b'{"label": "a\\u0000b"}', content_type="application/json")
    assert resp.status_code == 400


@pytest.mark.parametrize("raw", BAD_CAPS)
def test_a_bad_in_flight_cap_is_a_message_with_the_fields_name_and_changes_nothing(operator, tenant, raw):
    resp = operator.post(reverse("schedules-tenant-settings", args=[tenant.id]),
                         {"notification_url": "https://ops.acme.test/hook", "max_in_flight": raw}, follow=True)
    assert resp.status_code == 200
    html = resp.content.decode()
    assert "Max runs in flight: must be a whole number from 1 to 1,000,000, or empty for the default share" in html
    assert "max_in_flight" not in html.replace('name="max_in_flight"', "")
    t = Tenant.objects.get(id=tenant.id)
    # The webhook in the same form is not saved either: a refused form changes nothing.
    assert (t.notification_url, t.max_in_flight) == ("", None)
    assert not AuditEntry.objects.filter(action__startswith="tenant.set_").exists()


@pytest.mark.parametrize("raw", BAD_CAPS)
def test_a_bad_per_prefix_cap_is_a_message_and_the_prefix_is_not_added(operator, tenant, raw):
    resp = operator.post(reverse("schedules-target-add", args=[tenant.id]),
                         {"prefix": "https://hooks.acme.test/", "max_concurrency": raw}, follow=True)
    assert "Max concurrency: must be a whole number from 1 to 1,000,000, or empty for the default share" in resp.content.decode()
    assert not TargetPrefix.objects.filter(prefix="https://hooks.acme.test/").exists()


def test_good_caps_are_saved_and_empty_removes_them(operator, tenant):
    url = reverse("schedules-tenant-settings", args=[tenant.id])
    operator.post(url, {"notification_url": "", "max_in_flight": " 25 ", "max_schedules": "500",
                        "max_subminute_schedules": "3"})
    t = Tenant.objects.get(id=tenant.id)
    assert (t.max_in_flight, t.max_schedules, t.max_subminute_schedules) == (25, 500, 3)
    operator.post(url, {"notification_url": "", "max_in_flight": "", "max_schedules": "", "max_subminute_schedules": ""})
    t = Tenant.objects.get(id=tenant.id)
    assert (t.max_in_flight, t.max_schedules, t.max_subminute_schedules) == (None, None, None)
    operator.post(reverse("schedules-target-add", args=[tenant.id]),
                  {"prefix": "https://hooks.acme.test/", "max_concurrency": "4"})
    assert TargetPrefix.objects.get(prefix="https://hooks.acme.test/").max_concurrency == 4


@pytest.mark.parametrize("start, end", [
    ("0001-01-01T00:00", "2026-01-01T00:00"),
    ("0001-01-01T00:00:00+14:00", "2026-01-01T00:00"),
    ("2026-01-01T00:00", "9999-12-31T23:59:59"),
    ("2026-01-01T00:00", "9999-12-31T23:59:59-12:00"),
    ("1969-12-31T23:59", "1970-01-02T00:00"),
])
@pytest.mark.parametrize("confirm", ["", "yes"])
def test_a_backfill_outside_1970_to_2999_is_a_message_and_makes_nothing(operator, schedule, start, end, confirm):
    before = Run.objects.count()
    resp = operator.post(reverse("schedules-backfill", args=[schedule.id]),
                         {"start": start, "end": end, "confirm": confirm})
    assert resp.status_code == 400
    assert "UTC date-times between 1970-01-01 and 2999-12-31" in resp.content.decode()
    assert Run.objects.count() == before
