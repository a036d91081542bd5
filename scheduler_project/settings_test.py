"""Settings for the test suite: PostgreSQL on the local machine unless DATABASE_URL says otherwise."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/scheduler")
os.environ.setdefault("SCHEDULER_ALLOW_DEV_SECRET", "1")

from .settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
