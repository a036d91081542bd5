"""Tenants: API keys shown once and revoked, operator-managed allowlists and webhook settings."""

from django.urls import reverse

from schedules.models import ApiKey, AuditEntry, TargetPrefix, Tenant, hash_api_key
from schedules.tenants import create_api_key

HX = {"HTTP_HX_REQUEST": "true"}


def test_operators_see_every_tenant(operator, tenant, other_tenant):
    html = operator.get(reverse("schedules-tenants")).content.decode()
    assert "acme" in html and "globex" in html


def test_a_tenant_user_goes_straight_to_their_tenant(acme, tenant):
    r = acme.get(reverse("schedules-tenants"))
    assert r.status_code == 302 and r["Location"] == reverse("schedules-tenant-detail", args=[tenant.id])


def test_a_new_key_is_shown_once_and_only_its_hash_is_kept(acme, tenant):
    r = acme.post(reverse("schedules-key-create", args=[tenant.id]), {"label": "ci"}, **HX)
    html = r.content.decode()
    key = ApiKey.objects.get(tenant=tenant, label="ci")
    raw = html.split('id="new-key" class="key" readonly value="')[1].split('"')[0]
    assert raw.startswith("sk_") and hash_api_key(raw) == key.key_hash
    assert r["Cache-Control"] == "no-store"
    assert raw not in acme.get(reverse("schedules-tenant-detail", args=[tenant.id])).content.decode()
    assert AuditEntry.objects.filter(action="apikey.create", actor="user:alice").exists()


def test_revoking_a_key_goes_through_the_service(acme, tenant):
    key, _ = create_api_key(tenant, label="old")
    html = acme.post(reverse("schedules-key-revoke", args=[tenant.id, key.id]), **HX).content.decode()
    assert "Revoke key" in html and 'name="confirm" value="yes"' in html
    key.refresh_from_db()
    assert key.revoked_at is None  # nothing done before the confirmation
    html = acme.post(reverse("schedules-key-revoke", args=[tenant.id, key.id]), {"confirm": "yes"}, **HX).content.decode()
    assert "Revoked key" in html
    key.refresh_from_db()
    assert key.revoked_at is not None
    again = acme.post(reverse("schedules-key-revoke", args=[tenant.id, key.id]), **HX).content.decode()
    assert "already revoked" in again


def test_operators_manage_the_allowlist(operator, tenant):
    operator.post(reverse("schedules-target-add", args=[tenant.id]), {"prefix": "https://hooks.acme.test/", "max_concurrency": "4"})
    t = TargetPrefix.objects.get(tenant=tenant, prefix="https://hooks.acme.test/")
    assert t.max_concurrency == 4
    r = operator.post(reverse("schedules-target-add", args=[tenant.id]), {"prefix": "ftp://nope"}, follow=True)
    assert "is not an absolute http(s) URL prefix" in r.content.decode()
    asked = operator.post(reverse("schedules-target-remove", args=[tenant.id, t.id])).content.decode()
    assert "allowlist?" in asked and TargetPrefix.objects.filter(id=t.id).exists()
    operator.post(reverse("schedules-target-remove", args=[tenant.id, t.id]), {"confirm": "yes"})
    assert not TargetPrefix.objects.filter(id=t.id).exists()
    assert AuditEntry.objects.filter(action="tenant.remove_target", actor="user:olga").exists()


def test_operators_set_the_webhook_and_the_in_flight_cap(operator, tenant):
    r = operator.post(reverse("schedules-tenant-settings", args=[tenant.id]),
                      {"notification_url": "https://ops.acme.test/hook", "max_in_flight": "20"}, follow=True)
    assert "Settings saved." in r.content.decode()
    tenant.refresh_from_db()
    assert (tenant.notification_url, tenant.max_in_flight) == ("https://ops.acme.test/hook", 20)
    r = operator.post(reverse("schedules-tenant-settings", args=[tenant.id]),
                      {"notification_url": "javascript:alert(1)", "max_in_flight": ""}, follow=True)
    assert "is not an absolute http(s) URL" in r.content.decode()
    assert Tenant.objects.get(id=tenant.id).notification_url == "https://ops.acme.test/hook"
    assert AuditEntry.objects.filter(action="tenant.set_max_in_flight").exists()


def test_tenant_users_cannot_change_operator_settings(acme, tenant):
    assert acme.post(reverse("schedules-target-add", args=[tenant.id]), {"prefix": "https://evil.test/"}).status_code == 404
    assert acme.post(reverse("schedules-tenant-settings", args=[tenant.id]), {"notification_url": "https://evil.test/"}).status_code == 404
    target = tenant.targets.first()
    assert acme.post(reverse("schedules-target-remove", args=[tenant.id, target.id])).status_code == 404
    assert not TargetPrefix.objects.filter(prefix="https://evil.test/").exists()
    assert TargetPrefix.objects.filter(id=target.id).exists()
    html = acme.get(reverse("schedules-tenant-detail", args=[tenant.id])).content.decode()
    assert "Operators manage this list" in html and "Allow prefix" not in html
