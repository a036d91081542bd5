"""Settings for the processes of the failover and network suites: the project's settings with
DATABASE_URL read by scheduler_project.database_url, which keeps a multi-host URL's port list as
libpq means it (django-environ's own parsing gives one port to every host when one is missing).

Once settings.py reads DATABASE_URL through parse_database_url itself, this module changes
nothing and can go.
"""

import os

from scheduler_project.database_url import parse_database_url
from scheduler_project.settings import *  # noqa: F401,F403
from scheduler_project.settings import env

DATABASES = {"default": parse_database_url(os.environ["DATABASE_URL"])}
_db = DATABASES["default"]
# The same defaults settings.py gives its own entry.
_db.setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
_db.setdefault("CONN_HEALTH_CHECKS", True)
_db["OPTIONS"].setdefault("application_name", "scheduler-web")
_db["OPTIONS"].setdefault("options", "-c jit=off")
