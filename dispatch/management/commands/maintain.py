from dispatch.loops import LoopCommand, drain, run_loop
from dispatch.maintenance import Maintenance


class Command(LoopCommand):
    help = ("Keep the history tables' partitions ahead of time and remove history past its retention "
            "(also run by `scheduler`). One copy does the work at a time.")
    loop_name = "maintain"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--export", default=None, metavar="DIR",
                            help="write what each removal removes to DIR first (JSON Lines, gzip); default "
                                 "SCHEDULER_RETENTION_EXPORT_DIR")

    def run(self, options):
        loop = Maintenance(export_dir=options["export"])
        if options["once"]:
            drain(loop.step)
        else:
            run_loop(loop, stop=self.stop)
