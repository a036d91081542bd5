"""Issue 26, finding 5: the read-only operator role could read every tenant's signing secret (the
portal's tenant page and the admin) and so sign calls any tenant's targets accept, while header
values were hidden from it. Secrets are for the Operator role and a tenant's own admins only."""

import pytest
from django.urls import reverse

from scheduler_project.web.access import can
from tests.helpers import make_schedule

from .conftest import login

pytestmark = pytest.mark.django_db


def _pages(tenant, version_id):
    return [reverse("schedules-tenant-detail", args=[tenant.id]),
            reverse("admin:schedules_tenant_change", args=[tenant.id]),
            reverse("admin:schedules_scheduleversion_change", args=[version_id])]


def test_read_only_operator_cannot_read_signing_secrets(read_only_operator, read_only_operator_user, operator,
                                                        acme, tenant, other_tenant, target):
    version = make_schedule(tenant, target.url + "/hook", target_headers={"Authorization": "Bearer tok-s3cr3t"}).current
    assert not can(read_only_operator_user, "view_secret", tenant.id)
    for url in _pages(tenant, version.id):
        page = read_only_operator.get(url)
        assert page.status_code == 200, url
        assert tenant.signing_secret not in page.content.decode(), url
        assert "tok-s3cr3t" not in page.content.decode(), url
    page = read_only_operator.get(reverse("admin:schedules_tenant_change", args=[other_tenant.id])).content.decode()
    assert other_tenant.signing_secret not in page and "hidden" in page
    # Those who may see it still do: the Operator role (portal and admin) and the tenant's admin.
    for url in _pages(tenant, version.id):
        assert operator.get(url).status_code == 200
    assert tenant.signing_secret in operator.get(_pages(tenant, version.id)[0]).content.decode()
    assert tenant.signing_secret in operator.get(_pages(tenant, version.id)[1]).content.decode()
    assert "tok-s3cr3t" in operator.get(_pages(tenant, version.id)[2]).content.decode()
    assert tenant.signing_secret in acme.get(_pages(tenant, version.id)[0]).content.decode()


def test_read_only_operator_cannot_read_header_secrets_in_the_audit_log(read_only_operator, operator, tenant,
                                                                        target):
    """The schedule's create entry holds its header values: masked on the audit pages too."""
    schedule = make_schedule(tenant, target.url + "/hook", target_headers={"Authorization": "Bearer tok-s3cr3t",
                                                                           "X-Team": "bi"})
    from schedules.models import AuditEntry

    entry = AuditEntry.objects.get(action="schedule.create", object_id=str(schedule.id))
    for url in (reverse("schedules-audit"), reverse("admin:schedules_auditentry_change", args=[entry.id])):
        page = read_only_operator.get(url)
        assert page.status_code == 200, url
        html = page.content.decode()
        assert "tok-s3cr3t" not in html and "Authorization" in html and "bi" in html, url
        assert "tok-s3cr3t" in operator.get(url).content.decode(), url


def test_read_only_operator_cannot_read_signing_secrets_from_the_rotation_audit(read_only_operator, tenant):
    """The rotation's audit entry named the old and new secrets' first characters: now fingerprints."""
    from schedules.models import AuditEntry
    from schedules.tenants import rotate_signing_secret
    from tests.helpers import ACTOR

    old = tenant.signing_secret
    new = rotate_signing_secret(tenant, by=ACTOR).signing_secret
    entry = AuditEntry.objects.get(action="tenant.rotate_secret", object_id=str(tenant.id))
    stored = str(entry.before) + str(entry.after)
    html = read_only_operator.get(reverse("schedules-audit")).content.decode()
    for secret in (old, new):
        # What was stored before: "whsec_" and the secret's next four characters.
        assert secret[:10] not in stored and secret[:10] not in html
    assert entry.before["secretFingerprint"] != entry.after["secretFingerprint"]
