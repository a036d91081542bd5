from django.core.management.base import BaseCommand, CommandError

from runs import retention
from schedules.models import Tenant
from schedules.services import Actor


class Command(BaseCommand):
    help = ("Remove history past its retention now (the `maintain` loop does this on its own): whole partitions on "
            "PostgreSQL, bounded batches on SQLite. --export DIR writes what goes to DIR first (JSON Lines, gzip). "
            "--tenant SLUG with --finished-days and/or --dead-days sets that tenant's own retention instead "
            "(--defaults: back to the deployment's), and removes nothing.")

    def add_arguments(self, parser):
        parser.add_argument("--export", default=None, metavar="DIR", help="write what is removed to DIR first")
        parser.add_argument("--dry-run", action="store_true", help="say which partitions are due; remove nothing")
        parser.add_argument("--once", action="store_true", help="one pass (default: until nothing more is due)")
        parser.add_argument("--tenant", metavar="SLUG", help="set this tenant's own retention (with the options below)")
        parser.add_argument("--finished-days", type=int, metavar="N",
                            help="keep the tenant's succeeded, canceled and skipped runs N days")
        parser.add_argument("--dead-days", type=int, metavar="N", help="keep the tenant's dead runs N days")
        parser.add_argument("--defaults", action="store_true", help="the tenant keeps the deployment's defaults again")

    def set_tenant_policy(self, options):
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant {options['tenant']!r}")
        fin, dead = options["finished_days"], options["dead_days"]
        if options["defaults"] == (fin is not None or dead is not None):
            raise CommandError("give --finished-days and/or --dead-days, or --defaults")
        try:
            retention.set_policy(tenant, finished_days=fin, dead_days=dead, by=Actor("system:retention"))
        except ValueError as exc:  # "finished_days must be between ..." -> "--finished-days must be ..."
            raise CommandError("--" + str(exc).replace("_", "-", 1)) from exc
        st = retention.status(tenant_ids=[tenant.id])
        (t,) = st.tenants
        self.stdout.write(f"{tenant.slug} keeps finished runs {t.finished_days:g} days and dead runs "
                          f"{t.dead_days:g} days{' (its own policy)' if t.own else ' (the defaults)'}")

    def handle(self, *args, **options):
        if options["tenant"]:
            return self.set_tenant_policy(options)
        # Without --tenant these would be ignored and the command would remove history instead of
        # setting a policy: refuse before anything is removed.
        given = [f"--{k.replace('_', '-')}" for k in ("finished_days", "dead_days") if options[k] is not None]
        if options["defaults"]:
            given.append("--defaults")
        if given:
            raise CommandError(f"{', '.join(given)} set a tenant's own retention: give --tenant SLUG too "
                               "(nothing was removed)")
        while True:
            res = retention.run_pass(export_dir=options["export"], dry_run=options["dry_run"])
            for s in res.swaps:
                self.stdout.write(f"removed {', '.join(s.removed)}; kept {s.kept} (tables locked {s.lock_ms:.0f} ms)"
                                  + (f"; exported {', '.join(s.exported)}" if s.exported else ""))
            if any(res.trimmed.values()):
                self.stdout.write(f"removed by batches: {res.trimmed}")
            for name, survivors, limit in res.held_back:
                self.stdout.write(f"{name}: due, {survivors} rows would stay"
                                  + (f" (more than {limit}: held back)" if limit else ""))
            if res.busy:
                self.stdout.write(f"the {', '.join(res.busy)} tables were busy; try again")
            if options["once"] or options["dry_run"] or not res.more or res.busy:
                break
