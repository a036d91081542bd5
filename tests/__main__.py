"""The whole test suite, as the README runs it: `python -m tests [pytest arguments]`.

1. What the suite needs from the machine beyond Python: PostgreSQL answering on 127.0.0.1:5432
   (started if its cluster is installed but down), Debian's Chromium for the browser tests,
   libfaketime for the fault suite's skewed clock, pg_auto_failover, iproute2 and iptables for
   the failover and network suites, nginx (and openssl for its test certificate) for the web
   tier's set-up. Missing packages are installed with apt-get (as CI's machines
   and the development machines allow); where that is impossible it says what to install.
2. pytest on PostgreSQL: every test.
3. pytest on the embedded SQLite database (SCHEDULER_TEST_DATABASE=sqlite): every test but those
   marked postgresql_only, the fault suite, and the tests that use no database (they ran the same in
   pass 1); tests/README.md says which and why.

The exit status is non-zero if either pass fails. Plain `pytest` runs pass 1 alone (PostgreSQL).
"""

import os
import shutil
import subprocess
import sys
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


def pytest(args: list[str], **env) -> int:
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, env={**os.environ, **env}).returncode


def main(args: list[str]) -> int:
    install_system_packages()
    ensure_postgres()
    started = time.monotonic()
    say("pass 1 of 2: PostgreSQL")
    on_postgres = pytest(args)
    say("pass 2 of 2: the embedded SQLite database")
    on_sqlite = pytest(args, SCHEDULER_TEST_DATABASE="sqlite")
    if on_sqlite == 5:  # the arguments chose only tests that have no SQLite form (e.g. tests/faults)
        on_sqlite = 0
    say(f"PostgreSQL: {'passed' if on_postgres == 0 else 'FAILED'}; SQLite: {'passed' if on_sqlite == 0 else 'FAILED'}"
        f" ({time.monotonic() - started:.0f} s)")
    return 0 if on_postgres == 0 and on_sqlite == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
