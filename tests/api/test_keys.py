"""API keys over HTTP: created and shown once, listed by prefix and label, stored hashed, last use
kept, revoked at once."""

import hashlib

import pytest
from rest_framework.test import APIClient

from schedules.models import ApiKey

pytestmark = pytest.mark.django_db


def client_with(raw):
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return c


def test_a_new_key_is_shown_once_and_stored_only_as_a_hash(api, tenant):
    resp = api.post("/api/v1/keys", {"label": "billing-service"}, format="json")
    assert resp.status_code == 201
    body = resp.json()
    raw = body["key"]
    assert raw.startswith(body["prefix"]) and body["label"] == "billing-service" and body["active"] is True
    row = ApiKey.objects.get(id=body["id"])
    assert row.tenant_id == tenant.id and row.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in {row.key_hash, row.prefix, row.label}
    # Not shown again: neither in the list nor in the detail.
    listed = api.get("/api/v1/keys").content.decode() + api.get(f"/api/v1/keys/{row.id}").content.decode()
    assert raw not in listed
    assert client_with(raw).get("/api/v1/schedules").status_code == 200


def test_the_list_shows_prefix_and_label_and_no_secret(api):
    api.post("/api/v1/keys", {"label": "second"}, format="json")
    results = api.get("/api/v1/keys").json()["results"]
    assert {k["label"] for k in results} == {"tests", "second"}
    for k in results:
        assert set(k) == {"id", "prefix", "label", "active", "createdAt", "createdBy", "lastUsedAt", "revokedAt"}
        assert len(k["prefix"]) < 16


def test_last_use_is_recorded(api):
    key = ApiKey.objects.get(prefix=api.raw_key[:11])
    assert key.last_used_at is None
    api.get("/api/v1/schedules")
    key.refresh_from_db()
    assert key.last_used_at is not None
    assert api.get(f"/api/v1/keys/{key.id}").json()["lastUsedAt"].endswith("Z")


def test_a_revoked_key_is_refused_on_its_very_next_request(api):
    created = api.post("/api/v1/keys", {"label": "doomed"}, format="json").json()
    doomed = client_with(created["key"])
    assert doomed.get("/api/v1/schedules").status_code == 200
    resp = api.post(f"/api/v1/keys/{created['id']}/revoke")
    assert resp.status_code == 200 and resp.json()["active"] is False and resp.json()["revokedAt"].endswith("Z")
    after = doomed.get("/api/v1/schedules")
    assert after.status_code == 401 and "revoked" in after.json()["error"]
    assert after["WWW-Authenticate"].startswith("Bearer")


def test_revoking_twice_is_a_409(api):
    created = api.post("/api/v1/keys", {}, format="json").json()
    assert api.post(f"/api/v1/keys/{created['id']}/revoke").status_code == 200
    again = api.post(f"/api/v1/keys/{created['id']}/revoke")
    assert again.status_code == 409 and "already revoked" in again.json()["error"]


def test_a_key_may_revoke_itself_and_then_cannot_act(api):
    me = ApiKey.objects.get(prefix=api.raw_key[:11])
    assert api.post(f"/api/v1/keys/{me.id}/revoke").status_code == 200
    assert api.get("/api/v1/keys").status_code == 401
    assert api.post("/api/v1/keys", {}, format="json").status_code == 401


def test_a_label_is_checked(api):
    assert api.post("/api/v1/keys", {"label": "x" * 201}, format="json").status_code == 400
    assert api.post("/api/v1/keys", {"labels": "x"}, format="json").status_code == 400


def test_no_key_or_a_malformed_header_is_401(db):
    anon = APIClient()
    for header in (None, "Basic dXNlcjpwdw==", "Bearer", "Bearer sk_unknown"):
        if header:
            anon.credentials(HTTP_AUTHORIZATION=header)
        resp = anon.get("/api/v1/keys")
        assert resp.status_code == 401 and resp.json()["error"], header
