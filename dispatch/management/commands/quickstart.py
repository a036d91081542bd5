"""Everything in one command on the embedded database: migrate, an operator login, a demo tenant
with its API key and signing secret, a local demo target and demo schedules (dispatch.demo), the
web server (portal, admin, API) under gunicorn, and all the loops. Run again, it keeps what it
made: no second tenant or set of schedules, one live quickstart key (a new one each run, since a
key is stored only as its hash)."""

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from dispatch.demo import DEMO, EchoTarget, ensure_demo
from dispatch.loops import LoopCommand
from dispatch.management.commands.scheduler import start_loops, stop_with_parent
from dispatch.management.commands.work import default_worker_id
from dispatch.worker import run_worker
from schedules.models import ApiKey
from schedules.tenants import create_api_key, create_tenant, revoke_api_key


class Command(LoopCommand):
    help = "Run the whole scheduler (portal, API, scanner, worker, reconciler) for a first look."
    loop_name = "quickstart"

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="where the web server listens")
        parser.add_argument("--no-web", action="store_true", help="run only the loops")
        parser.add_argument("--allow-target", action="append", default=[], metavar="PREFIX",
                            help="another URL prefix the demo tenant may call (repeatable)")
        parser.add_argument("--demo-port", type=int, default=9000,
                            help="where the demo target listens on 127.0.0.1 (default 9000)")
        parser.add_argument("--no-demo", action="store_true", help="no demo target and no demo schedules")

    def run(self, options):
        call_command("migrate", interactive=False, verbosity=0)
        # A first look wants to call a target on this machine; production refuses loopback
        # unless SCHEDULER_TARGET_ALLOWED_NETWORKS says otherwise.
        if not settings.SCHEDULER_TARGET_ALLOWED_NETWORKS:
            settings.SCHEDULER_TARGET_ALLOWED_NETWORKS = ["127.0.0.0/8"]
            os.environ["SCHEDULER_TARGET_ALLOWED_NETWORKS"] = "127.0.0.0/8"
        User = get_user_model()
        password = os.environ.get("SCHEDULER_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        admin, created = User.objects.get_or_create(username="admin", defaults={"is_staff": True, "is_superuser": True})
        if created or os.environ.get("SCHEDULER_ADMIN_PASSWORD"):
            admin.set_password(password)
            admin.save()
            login = f"admin / {password}"
        else:
            login = "admin / (password set on the first run; `manage.py changepassword admin` to reset)"
        # A first look should not wait on a long shutdown grace.
        settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS = min(settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS, 3.0)
        echo = None
        if not options["no_demo"]:
            try:
                echo = EchoTarget(options["demo_port"]).start()
            except OSError as exc:
                raise CommandError(f"the demo target cannot listen on 127.0.0.1:{options['demo_port']} ({exc}): "
                                   "choose another port with --demo-port, or --no-demo") from exc
        self.echo = echo
        prefixes = ([echo.url + "/"] if echo else []) + options["allow_target"]
        tenant = create_tenant("demo", name="Demo", allow_targets=prefixes, by=DEMO)
        for old in ApiKey.objects.filter(tenant=tenant, label="quickstart", revoked_at__isnull=True):
            revoke_api_key(old, by=DEMO)  # a key is shown once only: the new one replaces it
        _, key = create_api_key(tenant, label="quickstart", by=DEMO)
        made = ensure_demo(tenant, echo.url) if echo else []
        host = options["addr"]
        env_file = Path(settings.VAR_DIR) / "quickstart.env"
        env_file.write_text(
            f"BASE=http://{host}\nKEY={key}\nSIGNING_SECRET={tenant.signing_secret}\n"
            + (f"TARGET={echo.url}\n" if echo else "")
        )
        env_file.chmod(0o600)
        demo = (f"  demo     target {echo.url} (/demo/ok answers 200, /demo/fail 503); schedules "
                f"demo-every-minute, demo-fails-into-dlq, demo-berlin-0230"
                f"{' (made now; the first two triggered)' if made else ''}\n" if echo else "")
        self.stdout.write(
            f"\n  portal   http://{host}/            login {login}\n"
            f"  admin    http://{host}/admin/\n"
            f"  API      http://{host}/api/v1/      docs http://{host}/api/docs/\n"
            f"  tenant   demo, may call {', '.join(tenant.allowed_prefixes())} "
            f"(add more with `manage.py create_tenant demo --allow-target PREFIX`)\n"
            f"  API key  {key}\n"
            f"  signing secret  {tenant.signing_secret}   (targets verify X-Scheduler-Signature with it)\n"
            f"{demo}"
            f"  shell    . {env_file}   (sets BASE, KEY, SIGNING_SECRET{', TARGET' if echo else ''} for the README's examples)\n"
            f"  database {settings.DATABASES['default']['NAME']}\n\n"
            f"  Ctrl-C to stop.\n\n"
        )
        self.stdout.flush()
        web = None
        if not options["no_web"]:
            web = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", "python:scheduler_project.gunicorn_conf", "scheduler_project.wsgi",
                 "--bind", host, "--workers", "2",
                 "--threads", "4", "--access-logfile", "-"],
                env={**os.environ, "DJANGO_SETTINGS_MODULE": "scheduler_project.settings"},
                # Its own process group, which stop_web signals whole: a worker that outlives its
                # master (gunicorn 27 left one after Ctrl-C, holding the port) goes with it. Out of
                # the terminal's group, a killed quickstart must still take it along.
                start_new_session=True, preexec_fn=stop_with_parent,
            )
        start_loops(self.loops)
        try:
            run_worker(default_worker_id(), stop=self.stop, concurrency=16)
        finally:
            self.stop.set()
            exit_if_stuck(STOP_DEADLINE_SECONDS, web)
            if web:
                stop_web(web)
            self.loops.join(timeout=settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS + 2)
            if self.echo:
                self.echo.stop()
            self.stdout.write("quickstart stopped\n")


# Ctrl-C must always end quickstart and free its ports: whatever still runs this long after the
# stop began (a thread in a call that does not return) is not waited for.
STOP_DEADLINE_SECONDS = 12.0


def exit_if_stuck(seconds: float, web: subprocess.Popen | None) -> threading.Thread:
    """A daemon thread that, `seconds` after the stop began, kills the web server if it is still
    there and ends the process (status 1), so that a stuck thread or an exit handler waiting on
    one cannot keep quickstart and its ports alive."""

    def watchdog():
        time.sleep(seconds)
        sys.stderr.write(f"quickstart did not stop within {seconds:.0f} s; exiting now\n")
        sys.stderr.flush()
        if web is not None:
            _signal_group(web, signal.SIGKILL)
        os._exit(1)

    t = threading.Thread(target=watchdog, name="stop-watchdog", daemon=True)
    t.start()
    return t


def _signal_group(web: subprocess.Popen, sig) -> None:
    try:
        os.killpg(web.pid, sig)
    except ProcessLookupError:
        pass


def stop_web(web: subprocess.Popen) -> None:
    """gunicorn's quick shutdown (SIGINT to its whole group; SIGTERM would wait for its workers'
    graceful timeout), then a kill of whatever of the group is still there: the port must be
    free when quickstart has exited."""
    _signal_group(web, signal.SIGINT)
    try:
        web.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    time.sleep(0.2)  # the workers' own quick exit
    _signal_group(web, signal.SIGKILL)
    web.wait()
