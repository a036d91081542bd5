"""Idempotency-Key on create and trigger: a retry returns the first result and does nothing
again; the same key with a different body is refused with 422; errors are not remembered."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dispatch.loops import Reconciler
from runs.models import Run
from scheduler_project.web.api import idempotency
from scheduler_project.web.models import IdempotencyRecord
from schedules.models import Schedule
from tests.api.conftest import schedule_body
from tests.conftest import api_client_for

KEY = "3f1c9a52-create-once"


@pytest.mark.django_db
def test_a_repeated_create_returns_the_first_schedule(api, tenant, target):
    first = api.post("/api/v1/schedules", schedule_body(target), format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    again = api.post("/api/v1/schedules", schedule_body(target), format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Schedule.objects.filter(tenant=tenant).count() == 1


@pytest.mark.django_db
def test_the_same_key_with_a_different_body_is_a_422(api, tenant, target):
    api.post("/api/v1/schedules", schedule_body(target), format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    resp = api.post("/api/v1/schedules", schedule_body(target, name="other"), format="json",
                    HTTP_IDEMPOTENCY_KEY=KEY)
    assert resp.status_code == 422 and "different request body" in resp.json()["error"]
    assert Schedule.objects.filter(tenant=tenant).count() == 1


@pytest.mark.django_db
def test_a_refused_request_is_not_remembered_so_the_fixed_one_can_use_the_key(api, tenant, target):
    bad = api.post("/api/v1/schedules", schedule_body(target, timeZone="Mars/Olympus"), format="json",
                   HTTP_IDEMPOTENCY_KEY=KEY)
    assert bad.status_code == 400
    good = api.post("/api/v1/schedules", schedule_body(target), format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    assert good.status_code == 201
    assert not IdempotencyRecord.objects.filter(status_code__gte=300).exists()


@pytest.mark.django_db
def test_without_a_key_every_create_creates(api, tenant, target):
    for _ in range(2):
        assert api.post("/api/v1/schedules", schedule_body(target), format="json").status_code == 201
    assert Schedule.objects.filter(tenant=tenant).count() == 2


@pytest.mark.django_db
def test_a_repeated_trigger_returns_the_first_run(api, schedule):
    path = f"/api/v1/schedules/{schedule.id}/trigger"
    first = api.post(path, HTTP_IDEMPOTENCY_KEY="trigger-1")
    again = api.post(path, HTTP_IDEMPOTENCY_KEY="trigger-1")
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert Run.objects.filter(schedule=schedule).count() == 1
    # A new key is a new run.
    assert api.post(path, HTTP_IDEMPOTENCY_KEY="trigger-2").json()["id"] != first.json()["id"]


@pytest.mark.django_db
def test_a_trigger_key_is_per_schedule_and_separate_from_create_keys(api, schedule, tenant, target):
    from tests.helpers import make_schedule

    second = make_schedule(tenant, target.url + "/hook", expression="0 * * * *")
    a = api.post(f"/api/v1/schedules/{schedule.id}/trigger", HTTP_IDEMPOTENCY_KEY="k")
    b = api.post(f"/api/v1/schedules/{second.id}/trigger", HTTP_IDEMPOTENCY_KEY="k")
    c = api.post("/api/v1/schedules", schedule_body(target), format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert (a.status_code, b.status_code, c.status_code) == (201, 201, 201)
    assert a.json()["scheduleId"] != b.json()["scheduleId"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_with_one_key_make_one_schedule(tenant, target):
    """The record is inserted in the transaction that does the work: the second request blocks on
    the unique index until the first commits, then replays it."""
    clients = [api_client_for(tenant) for _ in range(4)]
    results, barrier = [], threading.Barrier(len(clients))

    def create(client):
        try:
            barrier.wait()
            r = client.post("/api/v1/schedules", schedule_body(target), format="json", HTTP_IDEMPOTENCY_KEY=KEY)
            results.append((r.status_code, r.json()["id"]))
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [code for code, _ in results] == [201] * 4
    assert len({sid for _, sid in results}) == 1
    assert Schedule.objects.filter(tenant=tenant).count() == 1


@pytest.mark.django_db
def test_a_key_older_than_the_retention_starts_a_new_request_and_is_pruned(api, tenant, target, settings,
                                                                           monkeypatch):
    settings.SCHEDULER_IDEMPOTENCY_RETENTION_HOURS = 24
    first = api.post("/api/v1/schedules", schedule_body(target), format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    other = api.post("/api/v1/schedules", schedule_body(target), format="json", HTTP_IDEMPOTENCY_KEY="kept-key")
    IdempotencyRecord.objects.filter(key=KEY).update(created_at=timezone.now() - timedelta(hours=25))
    # Expired but not pruned yet: the key counts as absent all the same, and is remembered anew.
    again = api.post("/api/v1/schedules", schedule_body(target, name="new"), format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    assert again.status_code == 201 and again.json()["id"] != first.json()["id"]
    assert "Idempotent-Replayed" not in again
    assert api.post("/api/v1/schedules", schedule_body(target, name="new"), format="json",
                    HTTP_IDEMPOTENCY_KEY=KEY).json()["id"] == again.json()["id"]
    # The reconciler prunes what is past the retention, nothing else.
    IdempotencyRecord.objects.filter(key=KEY).update(created_at=timezone.now() - timedelta(hours=30))
    assert idempotency.prune_expired() == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["kept-key"]
    assert other.status_code == 201
    # The reconcile loop's step is what prunes in production.
    IdempotencyRecord.objects.filter(key="kept-key").update(created_at=timezone.now() - timedelta(hours=30))
    Reconciler().step()
    assert not IdempotencyRecord.objects.exists()
