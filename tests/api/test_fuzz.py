"""Schemathesis against the schema this server publishes, in process, over every operation: no
5xx for any generated request (valid or not), and every response conforms to the document.

Requests carry a real key; ids in paths are swapped for real objects of the key's tenant so the
operations get past the 404 and do their work (the 404s are covered in test_tenant_isolation)."""

import dataclasses
import os

import hypothesis
import hypothesis.internal.conjecture.utils as _conjecture_utils
import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis import DataGenerationMethod
from schemathesis.checks import ALL_CHECKS

from runs import actions
from scheduler_project.wsgi import application
from schedules.tenants import create_api_key
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

# `--checks all`: no 5xx; status codes, content types, headers and bodies as documented; negative
# data (wrong types, out-of-range values, missing fields) rejected; and no operation that
# declares the bearer key answers without it.
CHECKS = ALL_CHECKS

pytestmark = pytest.mark.beside_soak


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
    run = actions.trigger_schedule(schedule, by=ACTOR)
    _, raw = create_api_key(tenant, label="fuzz")
    spare, _ = create_api_key(tenant, label="spare, to be revoked")
    return {
        "headers": {"Authorization": f"Bearer {raw}"},
        "target_url": target.url + "/fuzz",
        "ids": {"/api/v1/schedules/": schedule.id, "/api/v1/runs/": run.id, "/api/v1/keys/": spare.id},
    }


def negative(meta, part: str) -> bool:
    method = getattr(meta, part, None) if meta is not None else None
    return bool(method and method.is_negative)


def _on_the_wire(value):
    # How schemathesis writes a query value: booleans in lower case, the rest as text.
    return str(value).lower() if isinstance(value, bool) else str(value)


def _as_declared(text: str, schema: dict):
    """A query string value read as its parameter's declared type, as any server must read it."""
    kind = schema.get("type")
    try:
        if kind == "boolean":
            return {"true": True, "false": False}[text]
        if kind == "integer":
            return int(text) if text.lstrip("-").isdigit() else text
    except KeyError:
        return text
    return text


def query_negative_on_the_wire(case) -> bool:
    """A query string carries text only: a negative value (the number 0 for a string, the string
    "false" for a boolean) can arrive as a valid one, and no server can tell them apart. Such a
    case is not negative once sent, so it is not counted as one."""
    import jsonschema

    params = {p.name: p.definition.get("schema", {}) for p in case.operation.query}
    for name, value in (case.query or {}).items():
        if isinstance(value, list):
            # The client drops None items (`?limit=[None]` was drawn and sent no limit), and sends
            # the array ["owner"] as `?by=owner`: the string once on the wire.
            value = [v for v in value if v is not None]
            if len(value) == 1 and not isinstance(value[0], (list, dict)):
                value = value[0]
        if value is None or (isinstance(value, (list, dict)) and not value):
            continue  # never sent: the client leaves out None and empty lists (`?limit=[]` was drawn)
        if name not in params or isinstance(value, (list, dict)):
            return True
        read = _as_declared(_on_the_wire(value), params[name])
        if not jsonschema.Draft4Validator(params[name], format_checker=jsonschema.FormatChecker()).is_valid(read):
            return True
    return False


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_no_operation_answers_5xx_or_off_schema(case, world):
    meta = case.meta
    if meta is not None and negative(meta, "path_parameters") and not case.operation.path_parameters:
        # schemathesis 3.x marks the path negative even where there is no path parameter to
        # negate, and then counts an ignored extra query parameter or header as accepted negative
        # data; the request has no path negation, so say so.
        case.meta = meta = dataclasses.replace(meta, path_parameters=None)
    if meta is not None and negative(meta, "query") and not query_negative_on_the_wire(case):
        case.meta = meta = dataclasses.replace(meta, query=None)
    if "id" in (case.path_parameters or {}) and not negative(meta, "path_parameters"):
        for prefix, real in world["ids"].items():
            if case.path.startswith(prefix):
                case.path_parameters["id"] = str(real)
    if (isinstance(case.body, dict) and isinstance(case.body.get("target"), dict) and "url" in case.body["target"]
            and not negative(meta, "body")):
        # A random URL is always off the allowlist; an allowed one lets the rest of the body reach
        # the services (expression parsing, policies, bounds) instead of stopping at the target.
        # (Not in a negative body: the URL may be what was made invalid.)
        case.body["target"]["url"] = world["target_url"]
    # On the case itself, so that ignored_auth can take the key away and send the request again.
    case.headers = {**(case.headers or {}), **world["headers"]}
    response = case.call()
    case.validate_response(response, checks=CHECKS, headers=world["headers"])
