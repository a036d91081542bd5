"""The quickstart's demo: a local echo target and three schedules that show the product working
within a minute of `manage.py quickstart` on a fresh clone.

The target serves nothing from disk (a first look must not publish the repository, its SQLite
file or its secrets): `/demo/ok` answers 200 with what it was sent, `/demo/fail` answers 503, any
other path 200 with a short note. The schedules, made once (by name) in the demo tenant:

- `demo-every-minute`: `* * * * *` to /demo/ok, succeeds;
- `demo-fails-into-dlq`: `* * * * *` to /demo/fail with two attempts, lands in the dead-letter
  queue with its evidence;
- `demo-berlin-0230`: `30 2 * * *` in Europe/Berlin, a wall time the spring change skips, so its
  preview shows a DST note.
The first two are triggered when they are made, so runs are on the dashboard at once.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from runs.actions import create_schedule, trigger_schedule
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule, ScheduleStatus, Tenant
from schedules.services import Actor

DEMO = Actor("system:quickstart")


def demo_schedules(base: str) -> list[dict]:
    return [
        {"name": "demo-every-minute", "expression": "* * * * *", "time_zone": "UTC",
         "target_url": f"{base}/demo/ok", "payload": {"demo": "every minute"}},
        {"name": "demo-fails-into-dlq", "expression": "* * * * *", "time_zone": "UTC",
         "target_url": f"{base}/demo/fail", "payload": {"demo": "fails"}, "max_attempts": 2,
         "backoff_base_seconds": 1.0, "backoff_max_seconds": 2.0},
        {"name": "demo-berlin-0230", "expression": "30 2 * * *", "time_zone": "Europe/Berlin",
         "target_url": f"{base}/demo/ok", "payload": {"demo": "nightly, DST-affected"}},
    ]


TRIGGERED_AT_START = ("demo-every-minute", "demo-fails-into-dlq")


def ensure_demo(tenant: Tenant, base: str) -> list[str]:
    """Make the demo schedules the tenant does not have yet (by name); returns the names made."""
    have = set(Schedule.objects.filter(tenant=tenant).exclude(status=ScheduleStatus.ARCHIVED)
               .values_list("name", flat=True))
    made = []
    for given in demo_schedules(base):
        if given["name"] in have:
            continue
        schedule = create_schedule(tenant, given, by=DEMO, now=db_now())
        if given["name"] in TRIGGERED_AT_START:
            trigger_schedule(schedule, by=DEMO)
        made.append(given["name"])
    return made


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scheduler-demo-target"

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(length, 1 << 20)) if length else b""
        if self.path.startswith("/demo/fail"):
            status, out = 503, {"error": "the demo target fails on purpose: this run goes to the dead-letter queue"}
        elif self.path.startswith("/demo/ok"):
            try:
                sent = json.loads(body or b"null")
            except ValueError:
                sent = None
            status, out = 200, {"ok": True, "runId": self.headers.get("Idempotency-Key"), "received": sent}
        else:
            status, out = 200, {"ok": True, "note": "the quickstart's demo target: /demo/ok answers 200, /demo/fail 503"}
        data = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args):
        pass


class EchoTarget:
    """The demo target on 127.0.0.1:`port`, on a daemon thread."""

    def __init__(self, port: int):
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _Echo)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="demo-target", daemon=True)

    def start(self) -> "EchoTarget":
        self.thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        if not self.thread.is_alive():  # never started (quickstart stopped before): only the port
            self.server.server_close()
            return
        # shutdown() waits for the serving loop without a limit; it is asked on a thread of its own
        # so that a loop that does not answer cannot hold quickstart's exit.
        threading.Thread(target=self.server.shutdown, name="demo-target-stop", daemon=True).start()
        self.thread.join(timeout)
        self.server.server_close()
