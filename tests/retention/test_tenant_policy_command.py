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
    (("--tenant", "acme", "--finished-days", "0"), "--finished-days must be between 1 and 36500"),
    (("--tenant", "acme", "--dead-days", "-1"), "--dead-days must be between 1 and 36500"),
    # Fits the database's integer but not a datetime: it made every tenant's retention pass fail.
    (("--tenant", "acme", "--dead-days", "2000000000"), "--dead-days must be between 1 and 36500"),
    (("--tenant", "acme", "--finished-days", "36501"), "--finished-days must be between 1 and 36500"),
])
def test_bad_arguments_are_refused_with_the_reason(tenant, args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not RetentionPolicy.objects.exists()


@pytest.mark.parametrize("args", [("--finished-days", "3"), ("--dead-days", "3"), ("--defaults",)])
def test_policy_options_without_a_tenant_are_refused_and_nothing_is_removed(tenant, target, args):
    """Without --tenant they were ignored and the command ran a removal pass instead."""
    from datetime import timedelta

    from django.test import override_settings

    from runs.models import Run
    from tests.retention.conftest import one_run

    run = one_run(tenant, target, "/ok", to="succeeded")
    with override_settings(SCHEDULER_RETENTION_DAYS=0):  # the run would be due at once
        with pytest.raises(CommandError, match="give --tenant SLUG too"):
            call_command("retention", *args, stdout=StringIO())
    assert Run.objects.filter(id=run.id).exists()


def test_the_database_refuses_a_period_no_datetime_can_hold(tenant):
    from django.db import IntegrityError, transaction

    for field in ("finished_days", "dead_days"):
        with pytest.raises(IntegrityError), transaction.atomic():
            RetentionPolicy.objects.create(tenant=tenant, **{field: 2_000_000_000})
    with pytest.raises(ValueError, match="between 1 and 36500"):
        retention.set_policy(tenant, finished_days=None, dead_days=10**6, by=retention.ACTOR)
    assert not RetentionPolicy.objects.exists()
