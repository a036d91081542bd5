"""Settings for the test suite.

PostgreSQL on the local machine unless DATABASE_URL says otherwise; with
SCHEDULER_TEST_DATABASE=sqlite, the embedded SQLite database the quickstart uses (a file in a
temporary folder, so that the worker's threads and subprocesses share it), for every test not
marked `postgresql_only` or `faults` (tests/README.md says which and why).
"""

import os
import tempfile

ON_SQLITE = os.environ.get("SCHEDULER_TEST_DATABASE", "postgresql") == "sqlite"
if ON_SQLITE:
    os.environ["DATABASE_URL"] = ""
    os.environ.setdefault("SCHEDULER_VAR_DIR", tempfile.mkdtemp(prefix="scheduler-test-"))
else:
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/scheduler")
os.environ.setdefault("SCHEDULER_ALLOW_DEV_SECRET", "1")

from .settings import *  # noqa: E402,F403

if ON_SQLITE:
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}  # noqa: F405
else:
    # Not "scheduler-…": tests that terminate the scheduler's sessions must not end their own.
    DATABASES["default"]["OPTIONS"]["application_name"] = "tests"  # noqa: F405
    if os.environ.get("SCHEDULER_TEST_PART") == "soak":
        # The soak's lane runs beside the main PostgreSQL pass, with tests of its own (marker
        # beside_soak) after the soak: a test database of its own, so neither pass sees the
        # other's rows, sessions or locks.
        DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_beside"}  # noqa: F405

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
