from django.core.management.base import BaseCommand, CommandError

from schedules.models import Tenant
from schedules.services import Actor
from schedules.tenants import create_api_key


class Command(BaseCommand):
    help = "Make an API key for a tenant and print it once, alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--label", default="")

    def handle(self, *args, slug, label, **options):
        try:
            tenant = Tenant.objects.get(slug=slug)
        except Tenant.DoesNotExist:
            raise CommandError(f"no tenant {slug!r}; make it with `manage.py create_tenant {slug}`")
        key, raw = create_api_key(tenant, label=label, by=Actor("system:create_api_key"))
        self.stdout.write(f"API key {key.prefix}… for tenant {tenant.slug} (shown once; store it now):")
        self.stdout.write(raw)
