"""The whole test suite, as the README runs it: `python -m tests [pytest arguments]`.

1. What the suite needs from the machine beyond Python: PostgreSQL answering on 127.0.0.1:5432
   (started if its cluster is installed but down), Debian's Chromium for the browser tests,
   libfaketime for the fault suite's skewed clock, pg_auto_failover, iproute2 and iptables for
   the failover and network suites, nginx (and openssl for its test certificate) for the web
   tier's set-up. Missing packages are installed with apt-get (as CI's machines
   and the development machines allow); where that is impossible it says what to install.
2. pytest on PostgreSQL: every test but the fault suite (marker `faults`), the soak's CI form
   (marker `soak`) and the long tests marked `beside_soak`. Beside it, in a process of its own, the
   soak's CI form (bench/soak.py --ci, on a pg_auto_failover formation of its own, not the machine's
   PostgreSQL), then the `beside_soak` tests on a test database of their own.
3. pytest on the embedded SQLite database (SCHEDULER_TEST_DATABASE=sqlite): every test but those
   marked postgresql_only, the fault suite, the soak, and the tests that use no database (they ran
   the same in pass 1); tests/README.md says which and why. Beside it, in a process of its own, the
   fault suite on PostgreSQL.

Why lanes at once: the PostgreSQL pass keeps about one core of two busy, the fault suite about half
of one (it waits on the processes and formations it starts and kills), and the SQLite pass and the
soak need nothing the lane beside them uses (the soak and the fault suite make network namespaces
and formations, so they are never side by side; the fault suite uses the machine's PostgreSQL under
the same test database as the PostgreSQL pass, so it is not beside that pass). One after the other the
suite took close to CI's 30 minutes. A lane run beside another has its output printed whole once
both have ended.

The exit status is non-zero if any lane fails. Plain `pytest` runs every PostgreSQL test, the fault
suite and the soak included, in one process; SCHEDULER_TEST_PART=rest|faults|soak chooses one lane.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (what must exist, the Debian package that provides it)
SYSTEM_NEEDS = [
    ("/usr/bin/chromium", "chromium"),
    ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "faketime"),
    ("/usr/bin/pg_autoctl", "pg-auto-failover-cli"),
    ("/usr/lib/postgresql/15/lib/pgautofailover.so", "postgresql-15-auto-failover"),
    ("/usr/sbin/ip", "iproute2"),
    ("/usr/sbin/tc", "iproute2"),
    ("/usr/sbin/iptables", "iptables"),
    # promtool checks the alert rules in deploy/prometheus/ (tests/dispatch/test_dashboards_and_alerts.py).
    ("/usr/bin/promtool", "prometheus"),
    # The documented web tier: nginx in front of gunicorn (tests/deploy), with Debian's nginx.conf.
    ("/usr/sbin/nginx", "nginx"),
    ("/etc/nginx/nginx.conf", "nginx"),
    ("/usr/bin/openssl", "openssl"),
]


def say(msg: str) -> None:
    print(f"[tests] {msg}", flush=True)


def missing_packages() -> list[str]:
    wanted = []
    for path, package in SYSTEM_NEEDS:
        if not Path(path).exists() and package not in wanted:
            wanted.append(package)
    return wanted


def install_system_packages() -> None:
    packages = missing_packages()
    if not packages:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say(f"missing system packages {' '.join(packages)}: install them (apt-get install {' '.join(packages)}) "
            "and run again")
        sys.exit(2)
    say(f"installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env, stdout=subprocess.DEVNULL)


def postgres_answers() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"]).returncode == 0


def ensure_postgres() -> None:
    if os.environ.get("DATABASE_URL") or postgres_answers():
        return
    versions = sorted(os.listdir("/etc/postgresql")) if Path("/etc/postgresql").is_dir() else []
    if not versions or not shutil.which("pg_ctlcluster"):
        say("PostgreSQL is not answering on 127.0.0.1:5432 and no local cluster is installed; start one")
        sys.exit(2)
    say(f"starting PostgreSQL {versions[-1]}")
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"], check=False)
    for _ in range(30):
        if postgres_answers():
            return
        time.sleep(1)
    say("PostgreSQL did not come up on 127.0.0.1:5432")
    sys.exit(2)


NO_TESTS_COLLECTED = 5  # pytest's exit status when the arguments choose nothing in a pass


def pytest_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def pytest(args: list[str], **env) -> int:
    return subprocess.run(pytest_command(args), cwd=ROOT, env={**os.environ, **env}).returncode


def verdict(status: int) -> str:
    return {0: "passed", NO_TESTS_COLLECTED: "nothing chosen"}.get(status, "FAILED")


@contextlib.contextmanager
def beside(name: str, args: list[str], results: dict, **env):
    """Run one lane of PostgreSQL tests in a process of its own while the block runs the foreground
    lane; its output, kept in a file, is printed whole once both have ended."""
    with tempfile.TemporaryFile(mode="w+") as log:
        lane = subprocess.Popen(pytest_command(args), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **env})
        try:
            yield
            say(f"waiting for {name}")
            results[name] = lane.wait()
        finally:
            if lane.poll() is None:  # interrupted: stop the lane as Ctrl-C would, so its fixtures clean up
                lane.send_signal(signal.SIGINT)
                try:
                    lane.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    lane.kill()
            log.seek(0)
            say(f"{name}, as it ran:")
            sys.stdout.write(log.read())
            sys.stdout.flush()


def main(args: list[str]) -> int:
    install_system_packages()
    ensure_postgres()
    started = time.monotonic()
    results: dict[str, int] = {}
    say("pass 1 of 2: PostgreSQL, all but the fault suite and the soak; beside it the soak's CI form, "
        "then the tests marked beside_soak (its output follows when both have ended)")
    with beside("the soak's CI form", args, results, SCHEDULER_TEST_PART="soak"):
        results["PostgreSQL"] = pytest(args, SCHEDULER_TEST_PART="rest")
    say("pass 2 of 2: the embedded SQLite database; beside it the fault suite on PostgreSQL "
        "(its output follows when both have ended)")
    with beside("the fault suite", args, results, SCHEDULER_TEST_PART="faults"):
        results["SQLite"] = pytest(args, SCHEDULER_TEST_DATABASE="sqlite")
    say("; ".join(f"{name}: {verdict(status)}" for name, status in results.items())
        + f" ({time.monotonic() - started:.0f} s)")
    if any(status not in (0, NO_TESTS_COLLECTED) for status in results.values()):
        return 1
    # The arguments may choose tests of one lane only (tests/faults has no SQLite form); choosing
    # none at all is a mistake worth pytest's own status for it.
    return NO_TESTS_COLLECTED if all(status == NO_TESTS_COLLECTED for status in results.values()) else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # Ctrl-C: every lane has had its SIGINT and has cleaned up by now
        say("interrupted")
        sys.exit(130)
