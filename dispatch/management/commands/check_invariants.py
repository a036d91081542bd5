import json

from django.core.management.base import BaseCommand

from dispatch import invariants


class Command(BaseCommand):
    help = ("Check the invariants of the run model (docs/failure-model.md) against the database; exit 1 and list "
            "each violation if any. Also available as `audit`.")

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        parser.add_argument("--limit", type=int, default=invariants.DEFAULT_LIMIT, help="ids listed per check")

    def handle(self, *args, **options):
        found = invariants.run_all(limit=options["limit"])
        if options["json"]:
            self.stdout.write(json.dumps({"violations": [v.as_dict() for v in found], "count": len(found)}, indent=2))
        else:
            for v in found:
                more = f" (first {len(v.ids)} of {v.count})" if v.count > len(v.ids) else ""
                self.stdout.write(
                    f"invariant {v.invariant} [{v.severity}] {v.check}: {v.count} - {v.message}{more}\n  "
                    + "\n  ".join(v.ids)
                )
            self.stdout.write(f"{len(found)} violations" if found else "0 violations")
        if found:
            # BaseCommand has no exit-status hook short of raising; SystemExit keeps the output
            # above intact (CommandError would add its own message on stderr).
            raise SystemExit(1)
