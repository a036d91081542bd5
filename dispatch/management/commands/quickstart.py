"""Everything in one command on the embedded database: migrate, an operator login, a demo tenant
and API key, the web server (portal, admin, API) under gunicorn, and all the loops."""

import os
import secrets
import signal
import subprocess
import sys

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command

from dispatch.loops import LoopCommand
from dispatch.management.commands.scheduler import start_loops
from dispatch.management.commands.work import default_worker_id
from dispatch.worker import run_worker
from schedules.services import Actor
from schedules.tenants import create_api_key, create_tenant


class Command(LoopCommand):
    help = "Run the whole scheduler (portal, API, scanner, worker, reconciler) for a first look."
    loop_name = "quickstart"

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="where the web server listens")
        parser.add_argument("--no-web", action="store_true", help="run only the loops")
        parser.add_argument("--allow-target", action="append", default=None, metavar="PREFIX",
                            help="URL prefix the demo tenant may call (repeatable; default http://127.0.0.1:9000/)")

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
        prefixes = options["allow_target"] or ["http://127.0.0.1:9000/"]
        tenant = create_tenant("demo", name="Demo", allow_targets=prefixes, by=Actor("system:quickstart"))
        _, key = create_api_key(tenant, label="quickstart", by=Actor("system:quickstart"))
        host = options["addr"]
        self.stdout.write(
            f"\n  portal   http://{host}/            login {login}\n"
            f"  admin    http://{host}/admin/\n"
            f"  API      http://{host}/api/v1/      docs http://{host}/api/docs/\n"
            f"  tenant   demo, may call {', '.join(tenant.allowed_prefixes())} "
            f"(add more with `manage.py create_tenant demo --allow-target PREFIX`)\n"
            f"  API key  {key}\n"
            f"  database {settings.DATABASES['default']['NAME']}\n\n"
        )
        web = None
        if not options["no_web"]:
            web = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "scheduler_project.wsgi", "--bind", host, "--workers", "2",
                 "--threads", "4", "--access-logfile", "-"],
                env={**os.environ, "DJANGO_SETTINGS_MODULE": "scheduler_project.settings"},
            )
        start_loops(self.loops)
        try:
            run_worker(default_worker_id(), stop=self.stop, concurrency=16)
        finally:
            self.stop.set()
            if web:
                stop_web(web)
            self.loops.join(timeout=15)


def stop_web(web: subprocess.Popen) -> None:
    """gunicorn's quick shutdown (SIGINT; SIGTERM would wait for its workers' graceful timeout),
    then a kill if it is still there: the port must be free when quickstart has exited."""
    if web.poll() is None:
        web.send_signal(signal.SIGINT)
    try:
        web.wait(timeout=5)
    except subprocess.TimeoutExpired:
        web.kill()
        web.wait()
