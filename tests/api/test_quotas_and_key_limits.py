"""Per-tenant limits: a key minted through POST /api/v1/keys has its own rate limit, so minting
is bounded (active keys, and creations per hour); schedules have a quota, and rules that fire
more than once a minute a smaller one. Past a limit the answer is a 400 (a quota: retrying will
not help) or a 429 with Retry-After (a rate: it will), with a message saying what to do, and
nothing is stored."""

import pytest

from runs import actions
from schedules.models import ApiKey, Schedule
from schedules.services import SYSTEM
from schedules.tenants import create_api_key, revoke_api_key, update_tenant_settings
from tests.api.conftest import schedule_body
from tests.helpers import ACTOR

pytestmark = pytest.mark.django_db

EVERY_SECOND = "RRULE:FREQ=SECONDLY"
TWICE_A_MINUTE = "RRULE:FREQ=MINUTELY;BYSECOND=0,30"


def mint(api, label="k"):
    return api.post("/api/v1/keys", {"label": label}, format="json")


def test_active_keys_are_capped_per_tenant(api, settings):
    settings.SCHEDULER_MAX_ACTIVE_KEYS_PER_TENANT = 3  # the `api` fixture's key is the first
    assert mint(api).status_code == 201 and mint(api).status_code == 201
    resp = mint(api)
    assert resp.status_code == 400
    assert "already has 3 active API keys" in resp.json()["errors"]["body"][0]
    assert ApiKey.objects.count() == 3
    # Revoking one makes room again.
    revoke_api_key(ApiKey.objects.filter(label="k").first(), by=ACTOR)
    assert mint(api).status_code == 201


def test_key_creation_is_rate_limited_per_tenant_revoked_keys_included(api, settings):
    settings.SCHEDULER_KEY_CREATIONS_PER_HOUR = 3
    for _ in range(3):
        made = mint(api)
        assert made.status_code == 201
        revoke_api_key(ApiKey.objects.get(id=made.json()["id"]), by=ACTOR)
    resp = mint(api)
    assert resp.status_code == 429
    assert "created 3 API keys in the last hour" in resp.json()["error"]
    assert 1 <= int(resp["Retry-After"]) <= 3601 and resp.json()["retryAfter"] == int(resp["Retry-After"])
    assert ApiKey.objects.filter(revoked_at__isnull=True).count() == 1


def test_another_tenant_is_not_held_to_this_tenants_key_limit(api, other_api, settings):
    settings.SCHEDULER_KEY_CREATIONS_PER_HOUR = 1
    assert mint(api).status_code == 201 and mint(api).status_code == 429
    assert mint(other_api).status_code == 201


def test_commands_on_the_server_are_not_held_to_the_key_limits(tenant, settings):
    settings.SCHEDULER_MAX_ACTIVE_KEYS_PER_TENANT = 1
    settings.SCHEDULER_KEY_CREATIONS_PER_HOUR = 1
    for _ in range(3):
        create_api_key(tenant, label="quickstart", by=SYSTEM)
    assert ApiKey.objects.filter(tenant=tenant).count() == 3


def test_the_schedule_quota_refuses_a_create_past_it_and_archiving_frees_a_place(api, target, settings):
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 2
    made = [api.post("/api/v1/schedules", schedule_body(target), format="json") for _ in range(2)]
    assert [r.status_code for r in made] == [201, 201]
    resp = api.post("/api/v1/schedules", schedule_body(target), format="json")
    assert resp.status_code == 400
    assert "has 2 schedules, its quota" in resp.json()["errors"]["body"][0]
    assert Schedule.objects.count() == 2
    assert api.delete(f"/api/v1/schedules/{made[0].json()['id']}").status_code == 204
    assert api.post("/api/v1/schedules", schedule_body(target), format="json").status_code == 201


def test_a_tenants_own_quota_overrides_the_default(api, tenant, target, settings):
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 1
    update_tenant_settings(tenant, max_schedules="3", by=ACTOR)
    codes = [api.post("/api/v1/schedules", schedule_body(target), format="json").status_code for _ in range(4)]
    assert codes == [201, 201, 201, 400]


@pytest.mark.parametrize("expression", [EVERY_SECOND, TWICE_A_MINUTE])
def test_sub_minute_rules_have_their_own_smaller_quota(api, target, settings, expression):
    settings.SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT = 1
    first = api.post("/api/v1/schedules", schedule_body(target, expression=expression), format="json")
    assert first.status_code == 201, first.json()
    second = api.post("/api/v1/schedules", schedule_body(target, expression=expression), format="json")
    assert second.status_code == 400
    assert "fires more than once a minute" in second.json()["errors"]["expression"][0]
    # Rules firing once a minute or less often are not counted against it.
    for slow in ("* * * * *", "rate(1 minute)", "RRULE:FREQ=MINUTELY", "RRULE:FREQ=SECONDLY;INTERVAL=60"):
        resp = api.post("/api/v1/schedules", schedule_body(target, expression=slow), format="json")
        assert resp.status_code == 201, (slow, resp.json())


def test_an_edit_that_makes_a_rule_sub_minute_is_held_to_the_quota(api, tenant, target, settings):
    settings.SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT = 1
    assert api.post("/api/v1/schedules", schedule_body(target, expression=EVERY_SECOND), format="json").status_code == 201
    slow = api.post("/api/v1/schedules", schedule_body(target), format="json").json()
    resp = api.patch(f"/api/v1/schedules/{slow['id']}", {"expectedVersion": 1, "expression": TWICE_A_MINUTE},
                     format="json")
    assert resp.status_code == 400 and "fires more than once a minute" in resp.json()["errors"]["expression"][0]
    assert Schedule.objects.get(id=slow["id"]).version == 1
    # The sub-minute schedule itself may be edited and stay sub-minute: it already has its place.
    fast = Schedule.objects.get(current__sub_minute=True)
    edited = actions.edit_schedule(fast, expected_version=1, changes={"name": "renamed"}, by=ACTOR)
    assert edited.version == 2 and edited.current.sub_minute


def test_no_quota_when_the_setting_is_zero(api, target, settings):
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 0
    settings.SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT = 0
    for _ in range(3):
        assert api.post("/api/v1/schedules", schedule_body(target, expression=EVERY_SECOND),
                        format="json").status_code == 201


def test_create_tenant_sets_quotas_and_a_refused_one_leaves_no_tenant():
    from io import StringIO

    from django.core.management import CommandError, call_command

    from schedules.models import Tenant

    call_command("create_tenant", "quota-co", "--allow-target", "https://x.example/", "--max-schedules", "50",
                 stdout=StringIO())
    assert Tenant.objects.get(slug="quota-co").max_schedules == 50
    with pytest.raises(CommandError, match="Sub-minute schedule quota: must be a whole number"):
        call_command("create_tenant", "bad-co", "--max-subminute-schedules", "²")
    assert not Tenant.objects.filter(slug="bad-co").exists()
    # Running it again without the option leaves the quota as it was.
    call_command("create_tenant", "quota-co", stdout=StringIO())
    assert Tenant.objects.get(slug="quota-co").max_schedules == 50
