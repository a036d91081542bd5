
from django.core.management.base import BaseCommand

from runs import partitions, retention
from runs.store import store
from scheduler_project.foundation.dbclock import db_now


class Command(BaseCommand):
    help = ("Make the history tables' partitions for the time ahead, seal the quiet ones, and show the layout. "
            "--check: make nothing, exit 1 if partitions are missing (rows in a catch-all partition, or none "
            "made for the time ahead).")

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="only check; exit 1 on a problem")

    def handle(self, *args, **options):
        s = store()
        if not s.partitioned:
            self.stdout.write("this database (SQLite) has no partitions; retention removes history by batches")
            return
        now = db_now()
        if not options["check"]:
            made = s.history_ensure_partitions(now)
            s.history_seal_partitions(now)
            if made and made.created:
                self.stdout.write(f"made {len(made.created)} partitions; moved {made.moved_from_future} rows out of "
                                  "the catch-all partitions")
        st = retention.status(now=now)
        for table, parts in s.history_partition_layout().items():
            self.stdout.write(f"{table}:")
            for p in parts:
                lo = p.lower.isoformat() if p.lower else "MINVALUE"
                hi = p.upper.isoformat() if p.upper else "MAXVALUE"
                self.stdout.write(f"  {p.name:42s} [{lo}, {hi}) {p.role}{' sealed' if p.sealed else ''}")
        self.stdout.write(f"partitions made up to {st.covered_until}; next removal {st.next_removal or '-'} at "
                          f"{st.next_removal_at or '-'}")
        problems = []
        if st.unpartitioned:
            problems.append(f"{st.unpartitioned} rows were written for times no partition covered yet "
                            f"({st.unpartitioned_rows}): run `manage.py partitions` (or keep `manage.py maintain` / "
                            "`manage.py scheduler` running), which makes the partitions and moves those rows into them")
        if st.covered_until is None or st.covered_until < now + partitions.ahead() / 2:
            problems.append(f"partitions end at {st.covered_until}, less than {partitions.ahead() / 2} ahead: run "
                            "`manage.py partitions`, and keep `manage.py maintain` (or `scheduler`) running")
        for p in problems:
            self.stderr.write(f"PROBLEM: {p}")
        if options["check"] and problems:
            raise SystemExit(1)
