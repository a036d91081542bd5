"""Issue 26, finding 1: one tenant could take the whole fleet by default. With no cap configured,
calls that never answer filled every worker slot and another tenant's runs did not start. Now no
tenant and no target host holds more than its default share of a worker's slots
(SCHEDULER_TENANT_SHARE, SCHEDULER_TARGET_SHARE), and an operator's explicit cap replaces it."""

import socket
import threading
import time

import pytest

from dispatch.worker import run_worker
from runs import queue
from runs.actions import trigger_schedule
from runs.decisions import Holding
from runs.models import Run
from schedules.models import TargetPrefix
from tests.conftest import Target
from tests.helpers import ACTOR, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def due_runs(tenant, url, n, **fields):
    """n manual runs of the tenant, due now, each of its own schedule."""
    return [trigger_schedule(make_schedule(tenant, f"{url}/r{i}", **fields), by=ACTOR) for i in range(n)]


def claim_as(worker: str, holding: Holding, limit: int = 100) -> list:
    """A claim by a worker holding `holding`, which then holds what it was given (as the worker's
    own bookkeeping does)."""
    claims = queue.claim(worker, limit, holding=holding)
    for c in claims:
        holding.tenants[c.tenant_id] = holding.tenants.get(c.tenant_id, 0) + 1
        key = (c.tenant_id, c.target_host)
        holding.hosts[key] = holding.hosts.get(key, 0) + 1
    return claims


def worker_of(slots: int) -> Holding:
    return queue.idle_holding(slots)


def leased(tenant, **where) -> int:
    return Run.objects.filter(tenant=tenant, state="leased", **where).count()


@pytest.fixture
def second():
    t = Target()
    yield t
    t.close()


def host(target) -> str:
    return f"127.0.0.1:{target.port}"


def test_one_tenant_can_take_the_whole_fleet_by_default(tenant, other_tenant, target, second):
    # Defaults: a tenant may hold half a worker's slots, its calls to one host a quarter.
    TargetPrefix.objects.create(tenant=tenant, prefix=second.url + "/")
    due_runs(tenant, target.url, 20)
    due_runs(tenant, second.url, 20)
    w1, w2 = worker_of(16), worker_of(16)
    for _ in range(3):  # however often they claim, with nothing configured
        claim_as("w1", w1)
        claim_as("w2", w2)
    assert w1.tenants == {tenant.id: 8} and w2.tenants == {tenant.id: 8}
    assert leased(tenant) == 16 and Run.objects.filter(tenant=tenant, state="ready").count() == 24
    # The other tenant's runs, due later, get the slots kept free for them at once, calls to the
    # same host included: a target is counted per tenant.
    due_runs(other_tenant, target.url, 6)
    got = claim_as("w1", w1) + claim_as("w2", w2)
    assert {c.tenant_id for c in got} == {other_tenant.id} and len(got) == 6
    assert leased(tenant) == 16


def test_one_target_cannot_take_a_tenants_whole_share_by_default(tenant, target, second):
    TargetPrefix.objects.create(tenant=tenant, prefix=second.url + "/")
    due_runs(tenant, target.url, 20)  # older: the claim takes these first
    due_runs(tenant, second.url, 6)
    w = worker_of(16)
    for _ in range(3):
        claim_as("w", w)
    # A quarter of the worker for the first host however many of its runs wait; the tenant's
    # other target has the rest of the tenant's half.
    assert w.hosts == {(tenant.id, host(target)): 4, (tenant.id, host(second)): 4}
    assert Run.objects.filter(tenant=tenant, state="ready", target_host=host(second)).count() == 2


def end_calls(claims):
    """The calls answered: their runs succeed and free their slots."""
    queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200) for c in claims])


def test_an_operator_raises_a_tenants_share_with_max_in_flight(tenant, other_tenant, target):
    type(tenant).objects.filter(id=tenant.id).update(max_in_flight=12)
    queue._limits.loaded_at = -1e9
    due_runs(tenant, target.url, 30)
    due_runs(other_tenant, target.url, 3)
    w = worker_of(16)
    claims = [c for _ in range(3) for c in claim_as("w", w)]
    # The explicit cap (counted across the fleet) replaces both default shares for this tenant;
    # the other tenant keeps its own.
    assert leased(tenant) == 12 and leased(other_tenant) == 3
    # Lowered below the default, it holds as a limit too.
    end_calls(claims)
    type(tenant).objects.filter(id=tenant.id).update(max_in_flight=2)
    queue._limits.loaded_at = -1e9
    w = worker_of(16)
    for _ in range(3):
        claim_as("w", w)
    assert leased(tenant) == 2


def test_a_target_budget_replaces_the_target_share(tenant, target):
    TargetPrefix.objects.filter(tenant=tenant).update(max_concurrency=6)
    queue._limits.loaded_at = -1e9
    due_runs(tenant, target.url, 20)
    w = worker_of(16)
    claims = [c for _ in range(3) for c in claim_as("w", w)]
    assert leased(tenant) == 6  # past the target share (4), within the tenant's (8)
    TargetPrefix.objects.filter(tenant=tenant).update(max_concurrency=2)
    queue._limits.loaded_at = -1e9
    end_calls(claims)
    w = worker_of(16)
    for _ in range(3):
        claim_as("w", w)
    assert leased(tenant) == 2


# --- the noisy-tenant fight, with real workers --------------------------------------------------


class Silent:
    """A server on 127.0.0.1 that accepts every connection and never answers."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted.append(conn)

    def close(self):
        self.done.set()
        self.thread.join(5)
        for c in self.accepted:
            c.close()
        self.sock.close()


def p99(values):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def start_lags(tenant, url, n, tag):
    """Trigger n runs of the tenant, a little apart, and return each one's start lag (first start
    - its instant) once all succeeded; fails if they do not all succeed within 20 s."""
    schedules = [make_schedule(tenant, f"{url}/{tag}{i}") for i in range(n)]
    runs = []
    for s in schedules:
        runs.append(trigger_schedule(s, by=ACTOR))
        time.sleep(0.05)
    ids = [r.id for r in runs]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if Run.objects.filter(id__in=ids, state="succeeded").count() == n:
            break
        time.sleep(0.1)
    done = list(Run.objects.filter(id__in=ids, state="succeeded"))
    assert len(done) == n, f"only {len(done)} of the other tenant's {n} runs succeeded within 20 s"
    return [(r.first_started_at - r.scheduled_time).total_seconds() for r in done]


def test_the_noisy_tenant_fight_leaves_the_other_tenants_start_lag_as_it_was(tenant, other_tenant, target):
    # Two workers of 8 slots each (a small fleet, so the test is quick); every fairness setting
    # as shipped.
    silent = [Silent() for _ in range(3)]
    for s in silent:
        TargetPrefix.objects.create(tenant=tenant, prefix=s.url + "/")
    stop = threading.Event()
    workers = [threading.Thread(target=run_worker, args=(f"w-fight-{i}",),
                                kwargs={"stop": stop, "concurrency": 8, "grace_seconds": 0.1})
               for i in range(2)]
    for w in workers:
        w.start()
    try:
        baseline = start_lags(other_tenant, target.url, 20, "base")
        # More calls that never answer, each allowed 30 minutes, than both workers have slots, to
        # three hosts (so the tenant's share binds, not only each target's).
        hanging = [r for s in silent for r in due_runs(tenant, s.url, 14, target_timeout_seconds=1800)]
        deadline = time.monotonic() + 10
        while leased(tenant) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert leased(tenant) == 8  # each worker holds the noisy tenant's share of its slots: half
        noisy = start_lags(other_tenant, target.url, 20, "noisy")
        assert leased(tenant) == 8 and Run.objects.filter(id__in=[r.id for r in hanging], state="ready").count() == 34
        assert sum(len(s.accepted) for s in silent) == 8  # the calls did go out, and hang
        bound = max(2 * p99(baseline), 2.0)
        print(f"\nnoisy-tenant fight: the other tenant's p99 start lag {p99(baseline):.3f} s alone, "
              f"{p99(noisy):.3f} s beside 42 hanging calls (bound {bound:.3f} s)")
        assert p99(noisy) <= bound, f"p99 start lag {p99(noisy):.3f}s beside the noisy tenant, baseline {p99(baseline):.3f}s"
    finally:
        stop.set()
        for w in workers:
            w.join(20)
        for s in silent:
            s.close()
    assert not any(w.is_alive() for w in workers)
