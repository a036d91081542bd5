from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from scheduler_project.foundation.errors import ServiceError
from schedules.services import Actor
from schedules.tenants import UNCHANGED, create_tenant, update_tenant_settings


class Command(BaseCommand):
    help = "Make a tenant (or add allowlist prefixes to an existing one) and the target URL prefixes it may call."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--allow-target", action="append", default=[], metavar="PREFIX",
                            help="a URL prefix the tenant may call, e.g. https://api.example.com/hooks/ (repeatable)")
        parser.add_argument("--max-schedules", default=UNCHANGED, metavar="N",
                            help="the tenant's schedule quota; empty: the deployment's default")
        parser.add_argument("--max-subminute-schedules", default=UNCHANGED, metavar="N",
                            help="the tenant's quota of rules firing more than once a minute; empty: the default")

    def handle(self, *args, slug, name, allow_target, max_schedules, max_subminute_schedules, **options):
        by = Actor("system:create_tenant")
        try:
            with transaction.atomic():  # a refused quota leaves no tenant behind
                tenant = create_tenant(slug, name=name, allow_targets=allow_target, by=by)
                update_tenant_settings(tenant, max_schedules=max_schedules,
                                       max_subminute_schedules=max_subminute_schedules, by=by)
        except ServiceError as e:
            raise CommandError(e.message)
        self.stdout.write(f"tenant {tenant.slug} ({tenant.id}) may call: {', '.join(tenant.allowed_prefixes()) or 'nothing yet'}")
        self.stdout.write(f"signing secret: {tenant.signing_secret}")
