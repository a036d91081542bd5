from django.core.management.base import BaseCommand

from runs import retention


class Command(BaseCommand):
    help = ("Remove history past its retention now (the `maintain` loop does this on its own): whole partitions on "
            "PostgreSQL, bounded batches on SQLite. --export DIR writes what goes to DIR first (JSON Lines, gzip).")

    def add_arguments(self, parser):
        parser.add_argument("--export", default=None, metavar="DIR", help="write what is removed to DIR first")
        parser.add_argument("--dry-run", action="store_true", help="say which partitions are due; remove nothing")
        parser.add_argument("--once", action="store_true", help="one pass (default: until nothing more is due)")

    def handle(self, *args, **options):
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
