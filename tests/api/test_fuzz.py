"""Schemathesis against the schema this server publishes, in process, over every operation: no
5xx for any generated request (valid or not), and every response conforms to the document.

Requests carry a real key; ids in paths are swapped for real objects of the key's tenant so the
operations get past the 404 and do their work (the 404s are covered in test_tenant_isolation)."""

import os

import hypothesis
import hypothesis.internal.conjecture.utils as _conjecture_utils
import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis import DataGenerationMethod
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from runs import schedule_changes
from schedules.tenants import create_api_key
from scheduler_project.wsgi import application
from tests.helpers import ACTOR, make_schedule

if not hasattr(_conjecture_utils.many, "more"):
    # hypothesis 6.170.10 reworked this internal, which hypothesis-jsonschema 0.23.1 (schemathesis
    # 3.x's body generator) still calls: every case would die with an AttributeError. Say so.
    pytest.fail(
        f"hypothesis {hypothesis.__version__} is too new for hypothesis-jsonschema; "
        "pin hypothesis<6.170.10 in pyproject.toml's dev extras",
        pytrace=False,
    )

schema = schemathesis.from_wsgi(
    "/api/schema/?format=json",
    application,
    data_generation_methods=[DataGenerationMethod.positive, DataGenerationMethod.negative],
)

CHECKS = (not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance)


@pytest.fixture
def same_connection():
    """Calls go straight to the WSGI handler, whose request signals would close this thread's
    database connection (it is inside the test's transaction, so it looks unusable) and lose the
    test data; Django's own test client disconnects the same receiver for the same reason."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def world(db, same_connection, tenant, target, settings):
    # One key makes every request here; the rate limit has its own tests.
    settings.SCHEDULER_API_RATE_LIMIT_PER_MINUTE = 0
    schedule = make_schedule(tenant, target.url + "/hook", expression="0 * * * *")
    run = schedule_changes.trigger_schedule(schedule, by=ACTOR)
    _, raw = create_api_key(tenant, label="fuzz")
    spare, _ = create_api_key(tenant, label="spare, to be revoked")
    return {
        "headers": {"Authorization": f"Bearer {raw}"},
        "target_url": target.url + "/fuzz",
        "ids": {"/api/v1/schedules/": schedule.id, "/api/v1/runs/": run.id, "/api/v1/keys/": spare.id},
    }


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_no_operation_answers_5xx_or_off_schema(case, world):
    if "id" in (case.path_parameters or {}):
        for prefix, real in world["ids"].items():
            if case.path.startswith(prefix):
                case.path_parameters["id"] = str(real)
    if isinstance(case.body, dict) and isinstance(case.body.get("target"), dict) and "url" in case.body["target"]:
        # A random URL is always off the allowlist; an allowed one lets the rest of the body reach
        # the services (expression parsing, policies, bounds) instead of stopping at the target.
        case.body["target"]["url"] = world["target_url"]
    response = case.call(headers=world["headers"])
    case.validate_response(response, checks=CHECKS)
