from django.core.management.base import BaseCommand, CommandError

from scheduler_project.errors import ServiceError
from schedules.services import Actor
from schedules.tenants import create_tenant


class Command(BaseCommand):
    help = "Make a tenant (or add allowlist prefixes to an existing one) and the target URL prefixes it may call."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--allow-target", action="append", default=[], metavar="PREFIX",
                            help="a URL prefix the tenant may call, e.g. https://api.example.com/hooks/ (repeatable)")

    def handle(self, *args, slug, name, allow_target, **options):
        try:
            tenant = create_tenant(slug, name=name, allow_targets=allow_target, by=Actor("system:create_tenant"))
        except ServiceError as e:
            raise CommandError(e.message)
        self.stdout.write(f"tenant {tenant.slug} ({tenant.id}) may call: {', '.join(tenant.allowed_prefixes()) or 'nothing yet'}")
        self.stdout.write(f"signing secret: {tenant.signing_secret}")
