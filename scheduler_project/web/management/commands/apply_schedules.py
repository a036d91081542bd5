"""manage.py apply_schedules TENANT FILE... [--dry-run] [--prune]: a tenant's schedule set from
JSON and YAML files, planned and applied as POST /api/v1/schedules/apply does (runs.schedule_apply),
with a plan to read first (docs/api.md, "Schedules as code")."""

import json

from django.core.management.base import BaseCommand, CommandError

from runs.schedule_apply import Action, apply_set
from scheduler_project.foundation.errors import ServiceError, ValidationFailed
from scheduler_project.web.schedule_set import declared_from_files
from schedules.models import Tenant
from schedules.services import Actor

MARKS = {Action.CREATE: "+", Action.ADOPT: "~", Action.EDIT: "~", Action.ARCHIVE: "-", Action.UNCHANGED: " "}


def _value(v) -> str:
    return json.dumps(v, sort_keys=True, ensure_ascii=False)


def plan_lines(plan, *, unchanged: bool = False) -> list[str]:
    """The plan as `terraform plan` shows one: a mark per schedule (+ create, ~ adopt/edit with its
    field diffs, - archive), then one summary line."""
    lines = []
    for step in plan.steps:
        if step.action == Action.UNCHANGED and not unchanged:
            continue
        ident = f" ({step.schedule_id} v{step.version})" if step.schedule_id else ""
        lines.append(f"  {MARKS[step.action]} {step.action:<9} {step.name}{ident}")
        for field_name, (before, after) in step.changes.items():
            lines.append(f"        {field_name}: {_value(before)} -> {_value(after)}")
    for name in plan.not_declared:
        lines.append(f"    (kept)    {name}: managed, not in the set (--prune archives it)")
    c = plan.counts()
    summary = (f"{c['create']} to create, {c['adopt']} to adopt, {c['edit']} to edit, {c['archive']} to archive, "
               f"{c['unchanged']} unchanged.")
    if not plan.changed:
        lines.append(f"No changes: the schedules match the set ({c['unchanged']} unchanged).")
    elif plan.applied:
        lines.append("Applied: " + summary.replace(" to ", " "))
    else:
        lines.append("Plan: " + summary)
    return lines


def error_lines(exc: ValidationFailed) -> list[str]:
    return [f"{where}: {message}" for where, messages in exc.errors.items() for message in messages]


class Command(BaseCommand):
    help = "Apply a tenant's schedule set from JSON/YAML files (see docs/api.md, 'Schedules as code')."

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("files", nargs="+", help="JSON (.json) or YAML (.yaml, .yml) files, read as one set")
        parser.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
        parser.add_argument("--prune", action="store_true",
                            help="archive the managed schedules the files no longer name")

    def handle(self, *args, tenant, files, dry_run, prune, verbosity, **options):
        t = Tenant.objects.filter(slug=tenant).first()
        if t is None:
            raise CommandError(f"no tenant {tenant!r}")
        try:
            declared = declared_from_files(files)
            plan = apply_set(t, declared, prune=prune, dry_run=dry_run, by=Actor("system:apply_schedules"))
        except ValidationFailed as exc:
            lines = error_lines(exc)
            raise CommandError(f"{len(lines)} error(s); nothing was changed:\n" + "\n".join(lines))
        except ServiceError as exc:
            raise CommandError(f"{exc.message}; nothing was changed")
        self.stdout.write(f"Tenant {t.slug}: {len(declared)} schedule(s) in {len(files)} file(s)"
                          f"{' (dry run)' if dry_run else ''}")
        self.stdout.write("\n".join(plan_lines(plan, unchanged=verbosity >= 2)))
