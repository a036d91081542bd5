"""The two built-in operator roles, as Django groups carrying the operator permissions of migration
0004 (docs/portal.md, "Roles"); and the sub-minute mark of the schedule versions that exist.

- "Operator": everything an operator does, in the portal and the admin.
- "Read-only operator": sees every tenant, changes nothing.

The permission rows are made here, since Django only makes them after all migrations have run
(post_migrate), and it then finds them in place. Running this again changes nothing; the groups
are left alone on the way back, since an administrator may have put people in them."""

from datetime import timedelta

from django.db import migrations

OPERATOR_PERMISSIONS = {
    "view_all_tenants": "Can see every tenant's schedules, runs, keys and settings",
    "operate_runs": "Can retry and cancel any tenant's runs",
    "operate_schedules": "Can pause, resume, trigger and backfill any tenant's schedules",
    "manage_api_keys": "Can create and revoke any tenant's API keys",
    "manage_tenants": "Can change tenants' allowlists, webhooks, limits, quotas and members",
}
ROLES = {
    "Operator": list(OPERATOR_PERMISSIONS),
    "Read-only operator": ["view_all_tenants"],
}


def create_roles(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    tenant_type, _ = ContentType.objects.get_or_create(app_label="schedules", model="tenant")
    perms = {}
    for codename, name in OPERATOR_PERMISSIONS.items():
        perms[codename], _ = Permission.objects.get_or_create(
            content_type=tenant_type, codename=codename, defaults={"name": name}
        )
    for role, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.add(*(perms[c] for c in codenames))


def mark_sub_minute_versions(apps, schema_editor):
    """Only RRULEs can fire more than once a minute (cron has minutes, rate() minutes at least)."""
    from schedules.services import is_sub_minute
    from schedules.timeexpr import DstPolicy, ExpressionError, parse

    Schedule = apps.get_model("schedules", "Schedule")
    ScheduleVersion = apps.get_model("schedules", "ScheduleVersion")
    marked = []
    for s in Schedule.objects.exclude(status="archived").exclude(current=None).select_related("current").iterator():
        v = s.current
        if not v.expression.lstrip().upper().startswith(("RRULE", "DTSTART")):
            continue
        try:
            rule = parse(v.expression, v.time_zone, anchor=s.anchor_at,
                         dst_policy=DstPolicy(v.dst_skipped, v.dst_repeated))
        except (ExpressionError, ValueError):
            continue
        if is_sub_minute(rule, after=s.anchor_at - timedelta(microseconds=1)):
            marked.append(v.id)
    ScheduleVersion.objects.filter(id__in=marked).update(sub_minute=True)


class Migration(migrations.Migration):
    dependencies = [
        ("schedules", "0004_tenant_quotas_and_operator_permissions"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(create_roles, migrations.RunPython.noop),
        migrations.RunPython(mark_sub_minute_versions, migrations.RunPython.noop),
    ]
