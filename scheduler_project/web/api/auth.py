"""Bearer API keys: a key belongs to one tenant; it is stored only as its SHA-256 hash."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from scheduler_project.web.store import find_key
from schedules.models import ApiKey, hash_api_key


class KeyPrincipal:
    """request.user for API calls: the key and its tenant."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, key: ApiKey, counted: tuple[int, float] | None = None):
        self.key = key
        self.tenant = key.tenant
        self.counted = counted

    def __str__(self):
        return f"key:{self.key.prefix}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    # last_used_at is written at most this often per key, so reads do not become writes.
    TOUCH_EVERY = timedelta(minutes=1)

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise exceptions.AuthenticationFailed("use 'Authorization: Bearer <api key>'")
        found = find_key(hash_api_key(raw.strip()), count=settings.SCHEDULER_API_RATE_LIMIT_PER_MINUTE > 0)
        if found is None:
            raise exceptions.AuthenticationFailed("unknown API key")
        key = found.key
        if key.revoked_at is not None:
            raise exceptions.AuthenticationFailed("this API key has been revoked")
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at > self.TOUCH_EVERY:
            ApiKey.objects.filter(id=key.id).update(last_used_at=now)
            key.last_used_at = now
        # Read in the same statement: the rate limit's count and the request's database time
        # (ratelimit.PerKeyRateThrottle, dbclock.request_now).
        request.db_now = found.now
        principal = KeyPrincipal(key, counted=found.counted)
        return principal, key

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class IsTenantKey(permissions.BasePermission):
    message = "an API key is required: 'Authorization: Bearer <api key>'"

    def has_permission(self, request, view):
        return isinstance(request.user, KeyPrincipal)


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """Describes the bearer key in the OpenAPI document, so Swagger UI's "Authorize" button and
    schema-driven clients (and fuzzers) know how to send it."""

    target_class = "scheduler_project.web.api.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "`Authorization: Bearer <api key>`; a key acts for its own tenant only.",
        }
