"""DATABASE_URL to a Django DATABASES entry, including several PostgreSQL hosts.

A highly available PostgreSQL (pg_auto_failover, Patroni, a managed service's replicas) is reached
through libpq's multi-host URL:

    postgres://user@db-a:5432,db-b:5432/scheduler?target_session_attrs=read-write

libpq tries the hosts in order and keeps the first that accepts a read-write session, so after a
failover every new connection finds the new primary by itself. django-environ splits such a URL
by hand and gets the corner cases wrong (``h1:5433,h2`` becomes port 5433 for both hosts,
``[::1]`` keeps its brackets), so PostgreSQL URLs are parsed here by libpq's own parser
(``psycopg.conninfo.conninfo_to_dict``). Other schemes (``sqlite://``…) go to django-environ.

Every libpq parameter in the query string goes to OPTIONS, which Django passes to
``psycopg.connect``. The defaults below bound how long a process can sit on a connection to a
host that vanished without closing its sockets (power loss, a cut link): without them a blocked
read waits for the kernel's TCP retransmission limit, about 15 minutes.
"""

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Django's PostgreSQL backend with a health check that costs no round trip (scheduler_project/foundation/postgresql).
POSTGRES_ENGINES = {
    "postgres": "scheduler_project.foundation.postgresql",
    "postgresql": "scheduler_project.foundation.postgresql",
    "pgsql": "scheduler_project.foundation.postgresql",
    "postgis": "django.contrib.gis.db.backends.postgis",
}


def _flag(value: str) -> bool:
    return value.lower() in {"1", "true", "yes", "on"}


# Query parameters that configure Django, not libpq (libpq refuses unknown URI parameters).
_DJANGO_KEYS = {
    "conn_max_age": ("CONN_MAX_AGE", int),
    "conn_health_checks": ("CONN_HEALTH_CHECKS", _flag),
    "atomic_requests": ("ATOMIC_REQUESTS", _flag),
    "disable_server_side_cursors": ("DISABLE_SERVER_SIDE_CURSORS", _flag),
}


def _prepare_threshold(value: str) -> int | None:
    """psycopg's prepare_threshold: "none" (or "off") never prepares a statement, as a PgBouncer
    older than 1.21 in transaction mode needs; a number prepares one after that many runs."""
    if value.lower() in {"none", "off", ""}:
        return None
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"DATABASE_URL: prepare_threshold={value!r} is neither a number of runs (0 or more) nor none")
    return int(value)


# Options of Django's PostgreSQL backend and of psycopg, not libpq's: they go to OPTIONS, as the
# type the backend expects (server_side_binding must be True itself, not a string).
_BACKEND_OPTIONS = {"isolation_level": str, "server_side_binding": _flag, "assume_role": str,
                    "prepare_threshold": _prepare_threshold}

# Applied unless the URL sets them. connect_timeout is per host: a dead first host costs this
# much before libpq tries the next one. keepalives find a silent peer under an idle connection
# in idle + interval * count seconds; tcp_user_timeout (ms) drops a connection whose sent data
# stays unacknowledged that long, which is what a query to a vanished primary looks like.
DEFAULT_OPTIONS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "3",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
}


def parse_database_url(url: str) -> dict:
    """Return the DATABASES["default"] entry for `url`.

    With several hosts and no `target_session_attrs`, ``read-write`` is set: the scheduler
    writes on every connection, and a standby accepts the connection only to fail the first
    write, so a list of hosts is only useful together with that attribute.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in POSTGRES_ENGINES:
        import environ

        return environ.Env.db_url_config(url)

    entry = {"ENGINE": POSTGRES_ENGINES[scheme]}
    libpq_query, backend_options = [], {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() in _DJANGO_KEYS:
            name, convert = _DJANGO_KEYS[key.lower()]
            entry[name] = convert(value)
        elif key in _BACKEND_OPTIONS:
            backend_options[key] = _BACKEND_OPTIONS[key](value)
        else:
            libpq_query.append((key, value))
    # libpq accepts only these two scheme spellings.
    libpq_url = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(libpq_query), ""))

    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(libpq_url).items()}
    entry["NAME"] = params.pop("dbname", "")
    entry["USER"] = params.pop("user", "")
    entry["PASSWORD"] = params.pop("password", "")
    entry["HOST"] = params.pop("host", "")
    entry["PORT"] = params.pop("port", "")
    options = {**DEFAULT_OPTIONS, **params, **backend_options}
    if "," in entry["HOST"]:
        options.setdefault("target_session_attrs", "read-write")
    entry["OPTIONS"] = options
    return entry

