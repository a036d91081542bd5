"""`manage.py retention --tenant SLUG`: an operator sets a tenant's own retention (audited), and puts
it back to the defaults."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from runs import retention
from runs.models import RetentionPolicy
from schedules.models import AuditEntry


def run(*args) -> str:
    out = StringIO()
    call_command("retention", *args, stdout=out)
    return out.getvalue()


def test_it_sets_a_tenants_own_retention_and_audits_it(tenant):
    assert run("--tenant", "acme", "--finished-days", "3", "--dead-days", "60") == (
        "acme keeps finished runs 3 days and dead runs 60 days (its own policy)\n")
    assert retention.policy().keep(tenant.id)[0].days == 3
    entry = AuditEntry.objects.get(action="tenant.retention")
    assert (entry.actor, entry.after) == ("system:retention", {"finished_days": 3, "dead_days": 60})


def test_one_class_alone_leaves_the_other_at_the_default(tenant):
    assert "dead runs 30 days (its own policy)" in run("--tenant", "acme", "--finished-days", "5")


def test_defaults_removes_the_tenants_policy(tenant):
    run("--tenant", "acme", "--finished-days", "3")
    assert "(the defaults)" in run("--tenant", "acme", "--defaults")
    assert not RetentionPolicy.objects.exists()


@pytest.mark.parametrize("args, message", [
    (("--tenant", "nobody", "--finished-days", "3"), "no tenant 'nobody'"),
    (("--tenant", "acme"), "give --finished-days and/or --dead-days, or --defaults"),
    (("--tenant", "acme", "--defaults", "--dead-days", "3"), "give --finished-days and/or --dead-days, or --defaults"),
    (("--tenant", "acme", "--finished-days", "0"), "--finished-days must be at least 1"),
])
def test_bad_arguments_are_refused_with_the_reason(tenant, args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not RetentionPolicy.objects.exists()
