"""Everything in one command on the embedded database: migrate, an operator login, a demo tenant
with its API key and signing secret, a local demo target and demo schedules (dispatch.demo), the
web server (portal, admin, API) under gunicorn, and all the loops. Run again, it keeps what it
made: no second tenant or set of schedules, one live quickstart key (a new one each run, since a
key is stored only as its hash).

It checks that its ports (the web server's and the demo target's) are free before it makes
anything, waits for the web server to listen before it prints the banner, and exits non-zero
with the reason when the web server cannot start or dies while it runs (it used to print its
banner and run its loops with no web server, for ever). The `admin` login's password is set in
the same step that prints it: a run that fails before its banner leaves `admin` without a usable
password, and the next run sets one and shows it (a first run that failed after making `admin`
used to leave a password nobody had seen)."""

import os
import secrets
import signal
import socket
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
        web_addr = None if options["no_web"] else listen_address(options["addr"])
        # Before anything is made: a taken port is a clear error, not a half-started quickstart.
        if web_addr is not None:
            refuse_if_taken(web_addr, "the web server", "choose another address with --addr HOST:PORT")
        echo = None
        if not options["no_demo"]:
            try:
                echo = EchoTarget(options["demo_port"])  # binds its port now
            except OSError as exc:
                raise CommandError(f"the demo target cannot listen on 127.0.0.1:{options['demo_port']} "
                                   f"({exc.strerror or exc}): choose another port with --demo-port, or --no-demo"
                                   ) from exc
        self.echo = echo
        try:
            self._run(options, echo, web_addr)
        finally:
            if echo is not None:
                echo.stop()

    def _run(self, options, echo, web_addr):
        call_command("migrate", interactive=False, verbosity=0)
        # A first look wants to call a target on this machine; production refuses loopback
        # unless SCHEDULER_TARGET_ALLOWED_NETWORKS says otherwise.
        if not settings.SCHEDULER_TARGET_ALLOWED_NETWORKS:
            settings.SCHEDULER_TARGET_ALLOWED_NETWORKS = ["127.0.0.0/8"]
            os.environ["SCHEDULER_TARGET_ALLOWED_NETWORKS"] = "127.0.0.0/8"
        User = get_user_model()
        admin, created = User.objects.get_or_create(username="admin", defaults={"is_staff": True, "is_superuser": True})
        if created:
            # Usable only once shown (set_admin_password, next to the banner): a run that fails
            # before it leaves this, and the next run sets a password and shows it.
            admin.set_unusable_password()
            admin.save(update_fields=["password"])
        # A first look should not wait on a long shutdown grace.
        settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS = min(settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS, 3.0)
        if echo is not None:
            echo.start()
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
        web = None
        if not options["no_web"]:
            web = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", "python:scheduler_project.gunicorn_conf",
                 "scheduler_project.wsgi", "--bind", host, "--workers", "2",
                 "--threads", "4", "--access-logfile", "-"],
                env={**os.environ, "DJANGO_SETTINGS_MODULE": "scheduler_project.settings"},
                # Its own process group, which stop_web signals whole: a worker that outlives its
                # master (gunicorn 27 left one after Ctrl-C, holding the port) goes with it. Out of
                # the terminal's group, a killed quickstart must still take it along.
                start_new_session=True, preexec_fn=stop_with_parent,
            )
            problem = wait_until_listening(web, web_addr, WEB_START_SECONDS)
            if problem is not None:
                stop_web(web)
                raise CommandError(f"the web server did not start: {problem}")
        login = set_admin_password(admin, created)
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
        died = watch_web(web, self.stop) if web else None
        start_loops(self.loops)
        try:
            run_worker(default_worker_id(), stop=self.stop, concurrency=16)
        finally:
            self.stop.set()
            exit_if_stuck(STOP_DEADLINE_SECONDS, web)
            if web:
                stop_web(web)
            self.loops.join(timeout=settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS + 2)
            self.stdout.write("quickstart stopped\n")
        if died is not None and died.is_set():
            raise CommandError(f"the web server (gunicorn) exited with status {web.returncode} while quickstart ran "
                               "(its output is above); quickstart stopped everything")


def set_admin_password(admin, created: bool) -> str:
    """The banner's login text. A password is set (and so shown) when `admin` is new, when it has
    no usable password (a run stopped before its banner), or when SCHEDULER_ADMIN_PASSWORD gives
    one; an `admin` whose password someone has already seen keeps it."""
    given = os.environ.get("SCHEDULER_ADMIN_PASSWORD")
    if not (created or given or not admin.has_usable_password()):
        return "admin / (password set on an earlier run; `manage.py changepassword admin` to reset)"
    password = given or secrets.token_urlsafe(12)
    admin.set_password(password)
    admin.save(update_fields=["password"])
    return f"admin / {password}"


# --------------------------------------------------------------------------- the web server

# gunicorn imports Django and the project before it listens: seconds on a slow machine.
WEB_START_SECONDS = 60.0


def listen_address(addr: str) -> tuple[str, int] | None:
    """(host, port) of a --addr that names one (`127.0.0.1:8000`, `[::1]:8000`, `0.0.0.0:8000`,
    `:8000`), None for the forms gunicorn takes that are not a TCP port (`unix:PATH`, `fd://N`)."""
    if addr.startswith(("unix:", "fd://")):
        return None
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"--addr {addr!r} is not HOST:PORT with a port from 1 to 65535")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def refuse_if_taken(addr: tuple[str, int], what: str, hint: str) -> None:
    """CommandError when nothing could listen on `addr` now (another process holds it). Bound as
    gunicorn binds (SO_REUSEADDR), so a port left in TIME_WAIT by a stopped run is not taken."""
    host, port = addr
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CommandError(f"{what} cannot listen on {host}:{port} ({exc.strerror or exc}): {hint}") from exc
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
            probe.listen(1)
        except OSError as exc:
            raise CommandError(f"{what} cannot listen on {host}:{port} ({exc.strerror or exc}; is another "
                               f"quickstart or server running there?): {hint}") from exc


def wait_until_listening(web: subprocess.Popen, addr: tuple[str, int] | None, seconds: float) -> str | None:
    """None once the web server accepts connections on `addr`, else why not: it exited, or it did
    not listen within `seconds`. A unix-socket address is only checked for the process's exit."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if web.poll() is not None:
            return f"gunicorn exited with status {web.returncode} (its output is above)"
        if addr is None:
            time.sleep(1.0)
            return None if web.poll() is None else f"gunicorn exited with status {web.returncode}"
        host = "127.0.0.1" if addr[0] in ("0.0.0.0", "") else "::1" if addr[0] == "::" else addr[0]
        try:
            with socket.create_connection((host, addr[1]), timeout=1):
                return None
        except OSError:
            time.sleep(0.2)
    return f"gunicorn did not listen on {addr[0]}:{addr[1]} within {seconds:.0f} s"


def watch_web(web: subprocess.Popen, stop: threading.Event) -> threading.Event:
    """A daemon thread that stops quickstart when the web server exits while it runs; the event
    it returns is set when that happened (quickstart then exits non-zero with the reason)."""
    died = threading.Event()

    def watch():
        while not stop.is_set():
            if web.poll() is not None:
                if not stop.is_set():
                    sys.stderr.write(f"quickstart: the web server (gunicorn) exited with status {web.returncode}; "
                                     "stopping\n")
                    sys.stderr.flush()
                    died.set()
                    stop.set()
                return
            stop.wait(0.5)

    threading.Thread(target=watch, name="web-watch", daemon=True).start()
    return died


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
