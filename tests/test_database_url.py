"""DATABASE_URL parsing, including libpq's multi-host form used with pg_auto_failover."""

import psycopg
import pytest
from django.db.backends.postgresql.base import DatabaseWrapper

from scheduler_project.database_url import DEFAULT_OPTIONS, parse_database_url


def test_it_keeps_a_host_list_and_one_port_per_host():
    entry = parse_database_url("postgres://sched:s3cret@db-a:5433,db-b:5434/scheduler?target_session_attrs=read-write")
    assert entry["ENGINE"] == "scheduler_project.foundation.postgresql"
    assert (entry["NAME"], entry["USER"], entry["PASSWORD"]) == ("scheduler", "sched", "s3cret")
    assert entry["HOST"] == "db-a,db-b"
    assert entry["PORT"] == "5433,5434"
    assert entry["OPTIONS"]["target_session_attrs"] == "read-write"


def test_a_host_without_a_port_keeps_its_place_in_the_port_list():
    # django-environ turns both of these into one port for every host, which sends the
    # portless host to the other host's port.
    assert parse_database_url("postgres://db-a:5433,db-b/s")["PORT"] == "5433,"
    assert parse_database_url("postgres://db-a,db-b:5434/s")["PORT"] == ",5434"


def test_ipv6_hosts_lose_their_brackets():
    entry = parse_database_url("postgres://[::1]:5432,[fd00::2]:5432/s")
    assert entry["HOST"] == "::1,fd00::2"


def test_a_host_list_without_session_attributes_asks_for_the_primary():
    assert parse_database_url("postgres://a,b/s")["OPTIONS"]["target_session_attrs"] == "read-write"


def test_the_url_can_ask_for_other_session_attributes():
    entry = parse_database_url("postgres://a,b/s?target_session_attrs=primary")
    assert entry["OPTIONS"]["target_session_attrs"] == "primary"


def test_one_host_gets_no_session_attributes():
    entry = parse_database_url("postgresql://u@localhost:5432/s")
    assert entry["HOST"] == "localhost" and entry["PORT"] == "5432"
    assert "target_session_attrs" not in entry["OPTIONS"]


def test_timeouts_and_keepalives_default_and_the_url_overrides_them():
    entry = parse_database_url("postgres://a/s")
    for key, value in DEFAULT_OPTIONS.items():
        assert entry["OPTIONS"][key] == value
    entry = parse_database_url("postgres://a/s?connect_timeout=2&keepalives_idle=30&sslmode=require")
    assert entry["OPTIONS"]["connect_timeout"] == "2"
    assert entry["OPTIONS"]["keepalives_idle"] == "30"
    assert entry["OPTIONS"]["sslmode"] == "require"


def test_django_settings_in_the_query_are_not_sent_to_libpq():
    entry = parse_database_url(
        "postgres://a/s?conn_max_age=0&conn_health_checks=true&isolation_level=2&application_name=x"
    )
    assert entry["CONN_MAX_AGE"] == 0
    assert entry["CONN_HEALTH_CHECKS"] is True
    assert entry["OPTIONS"]["isolation_level"] == "2"
    assert entry["OPTIONS"]["application_name"] == "x"


def test_psycopg_and_backend_options_get_the_type_they_are_read_as():
    entry = parse_database_url("postgres://a/s?prepare_threshold=none&server_side_binding=true")
    assert entry["OPTIONS"]["prepare_threshold"] is None  # never prepare (an old PgBouncer)
    assert entry["OPTIONS"]["server_side_binding"] is True  # Django's backend tests `is True`
    assert parse_database_url("postgres://a/s?prepare_threshold=3")["OPTIONS"]["prepare_threshold"] == 3
    assert "prepare_threshold" not in parse_database_url("postgres://a/s")["OPTIONS"]  # psycopg's default
    for bad in ("-1", "soon"):
        with pytest.raises(ValueError):
            parse_database_url(f"postgres://a/s?prepare_threshold={bad}")


def test_percent_encoded_credentials_and_socket_directories_are_decoded():
    entry = parse_database_url("postgres://u%40corp:p%2Fw%3A@%2Fvar%2Frun%2Fpostgresql/s")
    assert entry["USER"] == "u@corp"
    assert entry["PASSWORD"] == "p/w:"
    assert entry["HOST"] == "/var/run/postgresql"


def test_an_unknown_parameter_is_refused_rather_than_ignored():
    with pytest.raises(psycopg.ProgrammingError):
        parse_database_url("postgres://a/s?target_sesion_attrs=read-write")


def test_other_schemes_go_to_django_environ():
    entry = parse_database_url("sqlite:////tmp/scheduler.sqlite3")
    assert entry["ENGINE"] == "django.db.backends.sqlite3"
    assert entry["NAME"] == "/tmp/scheduler.sqlite3"


def test_django_hands_libpq_the_host_and_port_lists():
    entry = parse_database_url("postgres://u@127.0.0.2:5433,127.0.0.3:5434/s")
    entry.update({"TIME_ZONE": None, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False, "AUTOCOMMIT": True,
                  "ATOMIC_REQUESTS": False})
    params = DatabaseWrapper(entry).get_connection_params()
    assert params["host"] == "127.0.0.2,127.0.0.3"
    assert params["port"] == "5433,5434"
    assert params["target_session_attrs"] == "read-write"
    # psycopg turns them into one attempt per host, in order (it resolves names, hence addresses).
    attempts = psycopg.conninfo.conninfo_attempts(
        {k: v for k, v in params.items() if k in {"host", "port", "dbname", "user", "target_session_attrs"}}
    )
    assert [(a["host"], a["port"]) for a in attempts] == [("127.0.0.2", "5433"), ("127.0.0.3", "5434")]
