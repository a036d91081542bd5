"""Personas and a local HTTP target shared by the suite.

The suite runs on PostgreSQL, and again on the embedded SQLite database with
SCHEDULER_TEST_DATABASE=sqlite (`python -m tests` runs both): there every test runs except those
marked `postgresql_only` (with the reason) and the fault-injection suite, which are deselected,
not skipped. tests/README.md lists them.
"""

import json
import os
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Target:
    """A target on 127.0.0.1 that records every delivery and answers what the test says."""

    def __init__(self):
        self.deliveries = []
        self.lock = threading.Lock()
        self.status = 200
        self.delay = 0.0
        self.body = b'{"ok": true}'
        self.responder = None  # callable(delivery) -> (status, body) overriding status/body
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                delivery = {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": raw,
                            "at": datetime.now(timezone.utc)}
                with target.lock:
                    target.deliveries.append(delivery)
                if target.delay:
                    threading.Event().wait(target.delay)
                status, body = target.responder(delivery) if target.responder else (target.status, target.body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_PUT = do_GET = do_PATCH = do_DELETE = _handle

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # A short poll interval: close() waits for the serve loop to notice, once per test.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def json_bodies(self):
        return [json.loads(d["body"] or b"null") for d in self.deliveries]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def target():
    t = Target()
    yield t
    t.close()


ON_SQLITE = os.environ.get("SCHEDULER_TEST_DATABASE") == "sqlite"


# Fixtures that give a test the database; a test with none of them runs the same on either engine.
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                               "live_server", "django_db_setup"})


def runs_the_same_on_both_engines(item) -> bool:
    """No database fixture, no django_db marker, and a module that does not ask which engine it is on
    (a module importing ON_SQLITE chooses its cases by engine). The PostgreSQL pass has run it."""
    if DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("django_db"):
        return False
    return not hasattr(getattr(item, "module", None), "ON_SQLITE")


# `python -m tests` runs the suite in lanes, some at once (tests/__main__.py says which and why):
# SCHEDULER_TEST_PART chooses one: "faults" the fault suite, "soak" the soak's CI form (each by its
# marker) and, after it, the PostgreSQL tests marked `beside_soak`, "rest" everything else. Unset,
# every test is chosen.
PART = os.environ.get("SCHEDULER_TEST_PART", "")
LANE_MARKERS = ("faults", "soak")
PARTS = (*LANE_MARKERS, "rest")
if PART not in ("", *PARTS):
    raise pytest.UsageError(f"SCHEDULER_TEST_PART={PART!r}: one of {', '.join(PARTS)}, or unset")


def lane_marker(item) -> str | None:
    return next((name for name in LANE_MARKERS if item.get_closest_marker(name)), None)


def part_of(item) -> str:
    """The lane a test runs in: its lane marker's; a `beside_soak` test's is the soak's on PostgreSQL
    (on SQLite it is an ordinary test of the SQLite pass)."""
    if (lane := lane_marker(item)) is not None:
        return lane
    return "soak" if item.get_closest_marker("beside_soak") and not ON_SQLITE else "rest"


def leaves_out(item) -> bool:
    if PART and part_of(item) != PART:
        return True
    return ON_SQLITE and bool(item.get_closest_marker("postgresql_only") or lane_marker(item) is not None
                              or runs_the_same_on_both_engines(item))


def pytest_collection_modifyitems(config, items):
    if not ON_SQLITE and not PART:
        return
    keep, drop = [], []
    for item in items:
        (drop if leaves_out(item) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if PART == "soak":
        # The soak first: what its lane adds after it must not slow the formation it times.
        items.sort(key=lambda item: lane_marker(item) != "soak")


@pytest.fixture(autouse=True)
def _fresh_process_caches():
    # Versions never change, so a process keeps their policies by id. SQLite reuses the ids of a
    # rolled-back test's rows (PostgreSQL's sequences never go back), so each test starts clean.
    from runs import queue

    queue._policies.clear()
    queue._limits.loaded_at = -1e9
    from dispatch import metrics

    metrics._forecast_cache.clear()


@pytest.fixture(autouse=True)
def _allow_loopback_targets(settings):
    # Targets in tests live on 127.0.0.1, which production refuses unless an operator allows it.
    settings.SCHEDULER_TARGET_ALLOWED_NETWORKS = ["127.0.0.0/8"]


@pytest.fixture
def tenant(db, target):
    from schedules.tenants import create_tenant

    return create_tenant("acme", name="Acme", allow_targets=[target.url + "/"])


@pytest.fixture
def other_tenant(db, target):
    from schedules.tenants import create_tenant

    return create_tenant("globex", name="Globex", allow_targets=[target.url + "/"])


def api_client_for(tenant):
    from rest_framework.test import APIClient

    from schedules.tenants import create_api_key

    _, raw = create_api_key(tenant, label="tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    client.raw_key = raw
    return client


@pytest.fixture
def api(tenant):
    return api_client_for(tenant)


@pytest.fixture
def other_api(other_tenant):
    return api_client_for(other_tenant)


@pytest.fixture
def actor():
    from schedules.services import Actor

    return Actor("user:tests")
