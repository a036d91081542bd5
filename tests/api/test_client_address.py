"""The client address in the audit log and the /metrics allowlist: X-Forwarded-For is believed
only as far as trusted proxies wrote it."""

import pytest
from django.test import RequestFactory

from scheduler_project.web.clientaddr import client_address
from schedules.models import AuditEntry
from tests.api.conftest import schedule_body

PROXY = {"REMOTE_ADDR": "10.0.0.5"}


def addr(settings, trusted, remote, forwarded=None):
    settings.SCHEDULER_TRUSTED_PROXIES = trusted
    meta = {"REMOTE_ADDR": remote}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    return client_address(RequestFactory().get("/", **meta))


def test_without_trusted_proxies_the_header_is_ignored(settings):
    assert addr(settings, [], "10.0.0.5", "198.51.100.7") == "10.0.0.5"


def test_a_trusted_proxy_gives_the_address_it_saw(settings):
    assert addr(settings, ["10.0.0.0/8"], "10.0.0.5", "198.51.100.7") == "198.51.100.7"


def test_an_address_the_client_wrote_itself_is_not_believed(settings):
    # The client sent "X-Forwarded-For: 192.0.2.66"; the proxy appended what it saw.
    assert addr(settings, ["10.0.0.0/8"], "10.0.0.5", "192.0.2.66, 198.51.100.7") == "198.51.100.7"


def test_a_chain_of_trusted_proxies_is_walked_to_the_client(settings):
    assert addr(settings, ["10.0.0.0/8"], "10.0.0.5", "198.51.100.7, 10.0.0.9") == "198.51.100.7"


def test_a_client_that_is_not_a_proxy_cannot_forward_for_anyone(settings):
    assert addr(settings, ["10.0.0.0/8"], "198.51.100.7", "192.0.2.66") == "198.51.100.7"


def test_a_garbled_entry_stops_at_the_last_trusted_hop(settings):
    assert addr(settings, ["10.0.0.0/8"], "10.0.0.5", "not-an-address") == "10.0.0.5"


@pytest.mark.django_db
def test_the_audit_log_records_the_client_behind_a_trusted_proxy(settings, api, target):
    settings.SCHEDULER_TRUSTED_PROXIES = ["10.0.0.0/8"]
    resp = api.post("/api/v1/schedules", schedule_body(target), format="json",
                    HTTP_X_FORWARDED_FOR="192.0.2.66, 198.51.100.7", **PROXY)
    assert resp.status_code == 201, resp.content
    assert AuditEntry.objects.get(action="schedule.create").remote_addr == "198.51.100.7"


@pytest.mark.django_db
def test_the_metrics_allowlist_applies_to_the_client_behind_a_trusted_proxy(settings, client):
    settings.SCHEDULER_TRUSTED_PROXIES = ["10.0.0.0/8"]
    settings.SCHEDULER_METRICS_ALLOWED_NETWORKS = ["198.51.100.0/24"]
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="198.51.100.7", **PROXY).status_code == 200
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="192.0.2.66", **PROXY).status_code == 403
