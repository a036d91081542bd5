"""Settings, all from the environment (django-environ).

With no DATABASE_URL the scheduler runs on an embedded SQLite file under var/ so the quickstart
needs no server; PostgreSQL is the production database and what the test suite uses.
"""

from pathlib import Path

import environ

from scheduler_project.database_url import parse_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("SCHEDULER_VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env.bool("DEBUG", default=False)
# A development key is only acceptable when DEBUG is on or on the embedded quickstart database.
_DEV_KEY = "dev-only-insecure-key-change-me"
SECRET_KEY = env.str("SECRET_KEY", default=_DEV_KEY)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "schedules",
    "runs",
    "dispatch",
    # The HTTP surface (API, portal, admin) above the domain apps.
    "scheduler_project.web",
]

MIDDLEWARE = [
    # First: a body over the limit is refused by its Content-Length before anything reads it.
    "scheduler_project.web.bodylimit.RequestBodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "scheduler_project.web.csp.ContentSecurityPolicyMiddleware",
    # Serves the portal's, the admin's and the API docs' assets from the process itself, so a
    # gunicorn-only deployment needs no separate static server (no CDN either).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    # Query strings and form fields with NUL (PostgreSQL cannot store or compare it) or huge: a 400.
    "scheduler_project.web.textinput.RefuseBadTextMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Failed sign-ins counted per username and address; a 429 with a message past the limit.
    "scheduler_project.web.loginthrottle.LoginThrottleMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "scheduler_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    }
]

WSGI_APPLICATION = "scheduler_project.wsgi.application"

# --- database -------------------------------------------------------------------------------
EMBEDDED_DATABASE_PATH = VAR_DIR / "scheduler.sqlite3"
if env.str("DATABASE_URL", default=""):
    # libpq's own parsing: a multi-host URL (pg_auto_failover) keeps one port per host, and
    # target_session_attrs=read-write is the default with several hosts (docs/failure-model.md).
    DATABASES = {"default": parse_database_url(env.str("DATABASE_URL"))}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(EMBEDDED_DATABASE_PATH),
            "OPTIONS": {
                # WAL lets the portal read while a loop writes; IMMEDIATE takes the write lock at
                # BEGIN so two loops never deadlock upgrading a read lock; the busy timeout makes a
                # writer wait instead of failing at once.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
        }
    }
_db = DATABASES["default"]
_db.setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
_db.setdefault("CONN_HEALTH_CHECKS", True)
if _db["ENGINE"].endswith("postgresql"):
    _db.setdefault("OPTIONS", {}).setdefault("application_name", "scheduler-web")
    # No JIT: the queue statements are short OLTP statements whose estimated cost (CTE row
    # guesses) can pass jit_above_cost, and compiling one then cost a third of a claim.
    _db["OPTIONS"].setdefault("options", "-c jit=off")
    _db.setdefault("TEST", {})
IS_POSTGRES = _db["ENGINE"].endswith("postgresql")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- HTTPS and browser security (README, "Production set-up") --------------------------------
# Production is PostgreSQL with DEBUG off and a real SECRET_KEY: there the browser-facing
# protections are on unless the environment turns one off. The embedded quickstart, the test
# suite and anything else on the development key serve plain HTTP on localhost, so they are off.
PRODUCTION = not DEBUG and IS_POSTGRES and SECRET_KEY != _DEV_KEY
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=PRODUCTION)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=PRODUCTION)
# The portal sends its CSRF token from the page (hx-headers), never by reading the cookie.
CSRF_COOKIE_HTTPONLY = True
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=PRODUCTION)
# Load balancers and Prometheus probe these over plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31_536_000 if PRODUCTION else 0)
# Both commit every subdomain (and, preloaded, every browser) to HTTPS: off unless asked for.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
# Behind a proxy that ends TLS: the header it sets and the value that means HTTPS, e.g.
# "HTTP_X_FORWARDED_PROTO" (value https) or "HTTP_X_FORWARDED_PROTO=https". Only set it when
# the proxy always sets or overwrites that header, or clients could claim HTTPS themselves.
_proxy_header = env.str("SCHEDULER_SECURE_PROXY_SSL_HEADER", default="")
if _proxy_header:
    _name, _, _value = _proxy_header.partition("=")
    SECURE_PROXY_SSL_HEADER = (_name.strip().upper().replace("-", "_"), _value.strip() or "https")
X_FRAME_OPTIONS = "DENY"
# scheduler_project.web.csp; empty turns the header off, anything else replaces the policy.
SCHEDULER_CONTENT_SECURITY_POLICY = env.str("SCHEDULER_CONTENT_SECURITY_POLICY", default=None)
# scheduler_project.web.loginthrottle: this many failed sign-ins for one username from one
# address within the window lock that pair out (0: no throttling); one address alone gets 4x.
SCHEDULER_LOGIN_MAX_FAILURES = env.int("SCHEDULER_LOGIN_MAX_FAILURES", default=5)
SCHEDULER_LOGIN_WINDOW_SECONDS = env.int("SCHEDULER_LOGIN_WINDOW_SECONDS", default=900)
SCHEDULER_LOGIN_LOCKOUT_SECONDS = env.int("SCHEDULER_LOGIN_LOCKOUT_SECONDS", default=900)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.str("STATIC_ROOT", default=str(VAR_DIR / "static"))
Path(STATIC_ROOT).mkdir(parents=True, exist_ok=True)  # whitenoise looks there even before collectstatic
STATICFILES_DIRS = [BASE_DIR / "static"] if (BASE_DIR / "static").exists() else []
# Without `collectstatic`, serve straight from the apps' static folders (the quickstart); with
# it (production), set WHITENOISE_USE_FINDERS=false and serve the collected, compressed files.
WHITENOISE_USE_FINDERS = env.bool("WHITENOISE_USE_FINDERS", default=True)

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["scheduler_project.web.api.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["scheduler_project.web.api.auth.IsTenantKey"],
    # Per key, counted in the database so every gunicorn worker shares one count.
    "DEFAULT_THROTTLE_CLASSES": ["scheduler_project.web.api.ratelimit.PerKeyRateThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON only, size-capped before it is read (413), and refusing what PostgreSQL cannot store.
    "DEFAULT_PARSER_CLASSES": ["scheduler_project.web.api.errors.LimitedJSONParser"],
    "EXCEPTION_HANDLER": "scheduler_project.web.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
    "UNAUTHENTICATED_TOKEN": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Durable scheduler API",
    "DESCRIPTION": (
        "Schedules, runs and attempts for services. Authenticate with `Authorization: Bearer <api key>`; "
        "every object belongs to the key's tenant and another tenant's id answers 404. Times are UTC "
        "ISO 8601 with `Z`; ids are UUIDs; lists are cursor-paginated (`next`). Errors are JSON: "
        '`{"errors": {"field": ["message"]}}` for field errors, `{"error": "..."}` otherwise. '
        "The service developer guide is docs/api.md in the repository."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The document and the docs page are public (they describe the API, not a tenant's data), so a
    # missing or revoked key never hides them.
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"persistAuthorization": True},
    "COMPONENT_SPLIT_REQUEST": True,
    # Request bodies are JSON objects, even where every field is optional (POST /keys takes {}).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "scheduler_project.web.api.base.require_request_bodies",
    ],
    "ENUM_NAME_OVERRIDES": {
        "ScheduleStatusEnum": "schedules.models.ScheduleStatus",
        "RunStateEnum": "runs.models.RunState",
        "RunKindEnum": "runs.models.RunKind",
        "AttemptOutcomeEnum": "runs.models.AttemptOutcome",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- the scheduler's own settings (the README's production section lists them with their defaults) ---
SCHEDULER_LEASE_SECONDS = env.int("SCHEDULER_LEASE_SECONDS", default=60)
SCHEDULER_CLAIM_BATCH = env.int("SCHEDULER_CLAIM_BATCH", default=200)
SCHEDULER_SCAN_BATCH = env.int("SCHEDULER_SCAN_BATCH", default=500)
SCHEDULER_MAX_PAYLOAD_BYTES = env.int("SCHEDULER_MAX_PAYLOAD_BYTES", default=65536)
SCHEDULER_TARGET_ALLOWED_NETWORKS = env.list("SCHEDULER_TARGET_ALLOWED_NETWORKS", default=[])
SCHEDULER_MAX_RESPONSE_BYTES = env.int("SCHEDULER_MAX_RESPONSE_BYTES", default=65536)
SCHEDULER_RESPONSE_EXCERPT_BYTES = env.int("SCHEDULER_RESPONSE_EXCERPT_BYTES", default=1024)
SCHEDULER_POLL_SECONDS = env.float("SCHEDULER_POLL_SECONDS", default=1.0)
SCHEDULER_RECONCILE_SECONDS = env.float("SCHEDULER_RECONCILE_SECONDS", default=5.0)
SCHEDULER_SHUTDOWN_GRACE_SECONDS = env.float("SCHEDULER_SHUTDOWN_GRACE_SECONDS", default=10.0)
SCHEDULER_WORKER_CONCURRENCY = env.int("SCHEDULER_WORKER_CONCURRENCY", default=256)
# Fair by default: the fraction of each worker's slots that one tenant's calls, and one tenant's
# calls to one target host (host:port), may hold at once, however long the calls take; the rest
# of the slots stay free for the others (other tenants, the tenant's other targets). A tenant's max_in_flight
# (fleet-wide) replaces the tenant share for it, and a target prefix's max_concurrency replaces the
# target share for that tenant's calls to its host: an operator raises (or lowers) them there.
# 1.0 turns a share off. docs/dispatch.md, "Fair by default".
SCHEDULER_TENANT_SHARE = env.float("SCHEDULER_TENANT_SHARE", default=0.5)
SCHEDULER_TARGET_SHARE = env.float("SCHEDULER_TARGET_SHARE", default=0.25)
for _name in ("SCHEDULER_TENANT_SHARE", "SCHEDULER_TARGET_SHARE"):
    if not 0 < globals()[_name] <= 1:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"{_name} must be a fraction above 0 and at most 1, not {globals()[_name]}")
# "uvloop" (default, when installed) or "asyncio": the worker's event loop.
SCHEDULER_WORKER_LOOP = env.str("SCHEDULER_WORKER_LOOP", default="uvloop")
# A target call's time limit: the default when a schedule gives none, and the most it may ask for.
# A call may outlast its lease: the worker's heartbeats keep the lease, and a worker that loses it
# (canceled, or expired while its database was away) abandons the call.
SCHEDULER_MAX_TIMEOUT_SECONDS = env.int("SCHEDULER_MAX_TIMEOUT_SECONDS", default=1800)
SCHEDULER_DEFAULT_TIMEOUT_SECONDS = env.int("SCHEDULER_DEFAULT_TIMEOUT_SECONDS", default=30)
SCHEDULER_MAX_BACKFILL = env.int("SCHEDULER_MAX_BACKFILL", default=1000)
SCHEDULER_HORIZON_SECONDS = env.int("SCHEDULER_HORIZON_SECONDS", default=10)
# How far ahead the scanner looks for a burst it could not materialise within the horizon
# (dispatch.loops.Scanner); at most this far ahead are runs made early.
SCHEDULER_LOOKAHEAD_SECONDS = env.int("SCHEDULER_LOOKAHEAD_SECONDS", default=120)
# The database is deployed with a synchronous standby (docs/failure-model.md): /metrics and the
# dashboard then call it degraded whenever commits are acknowledged without one.
SCHEDULER_EXPECT_SYNCHRONOUS_STANDBY = env.bool("SCHEDULER_EXPECT_SYNCHRONOUS_STANDBY", default=False)
SCHEDULER_OUTBOX_RETENTION_HOURS = env.int("SCHEDULER_OUTBOX_RETENTION_HOURS", default=72)

# Incident rules' defaults for tenants and schedules without a policy of their own
# (docs/incidents.md): failed attempts in a row that open an incident; start lag (seconds) and
# dead runs per hour above which one opens (unset: those rules are off by default); how long the
# incidents loop lets an outbox event settle before reading past it.
SCHEDULER_INCIDENT_FAILURES = env.int("SCHEDULER_INCIDENT_FAILURES", default=3)
SCHEDULER_INCIDENT_START_LAG_SECONDS = env.float("SCHEDULER_INCIDENT_START_LAG_SECONDS", default=None)
SCHEDULER_INCIDENT_DLQ_GROWTH = env.int("SCHEDULER_INCIDENT_DLQ_GROWTH", default=None)
SCHEDULER_INCIDENT_SETTLE_SECONDS = env.float("SCHEDULER_INCIDENT_SETTLE_SECONDS", default=5.0)
# Incident e-mail goes through Django's e-mail backend.
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="scheduler@localhost")
SCHEDULER_IDEMPOTENCY_RETENTION_HOURS = env.int("SCHEDULER_IDEMPOTENCY_RETENTION_HOURS", default=24)
SCHEDULER_API_RATE_LIMIT_PER_MINUTE = env.int("SCHEDULER_API_RATE_LIMIT_PER_MINUTE", default=600)
# Per tenant (0: none). Keys: each key has its own rate limit, so minting keys must not be a way
# around it. Schedules: those not archived; sub-minute ones (an RRULE firing twice within a
# minute) are the costly kind and get a smaller quota. A tenant's own quota (the portal's tenant page,
# `create_tenant --max-schedules`) overrides the schedule defaults.
SCHEDULER_MAX_ACTIVE_KEYS_PER_TENANT = env.int("SCHEDULER_MAX_ACTIVE_KEYS_PER_TENANT", default=20)
SCHEDULER_KEY_CREATIONS_PER_HOUR = env.int("SCHEDULER_KEY_CREATIONS_PER_HOUR", default=20)
SCHEDULER_MAX_SCHEDULES_PER_TENANT = env.int("SCHEDULER_MAX_SCHEDULES_PER_TENANT", default=10000)
SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT = env.int("SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT", default=10)
# /metrics names tenants: by default only loopback clients, a bearer token's holder and signed-in
# operators read it (scheduler_project.web.health). "0.0.0.0/0,::/0" opens it to every address.
SCHEDULER_METRICS_ALLOWED_NETWORKS = env.list("SCHEDULER_METRICS_ALLOWED_NETWORKS",
                                              default=["127.0.0.0/8", "::1/128"])
SCHEDULER_METRICS_TOKEN = env.str("SCHEDULER_METRICS_TOKEN", default="")
# Networks of the load balancers / reverse proxies in front of gunicorn: X-Forwarded-For is
# believed only as far as they wrote it (scheduler_project.web.clientaddr). Empty: never believed.
SCHEDULER_TRUSTED_PROXIES = env.list("SCHEDULER_TRUSTED_PROXIES", default=[])
SCHEDULER_MAX_REQUEST_BYTES = env.int("SCHEDULER_MAX_REQUEST_BYTES", default=2 * SCHEDULER_MAX_PAYLOAD_BYTES + 65536)
# POST /api/v1/schedules/batch: up to 1,000 schedules of a few KiB each.
SCHEDULER_MAX_BATCH_REQUEST_BYTES = env.int("SCHEDULER_MAX_BATCH_REQUEST_BYTES", default=4 * 1024 * 1024)
# A schedule set (POST /api/v1/schedules/apply, manage.py apply_schedules): at most this many
# schedules; the API's body takes the batch create's limit above.
SCHEDULER_MAX_APPLY_SCHEDULES = env.int("SCHEDULER_MAX_APPLY_SCHEDULES", default=10000)
# Django reads a body whole up to this before a view sees it: never below the API's own limits,
# which scheduler_project.web.bodylimit checks first (the portal's forms are far smaller).
DATA_UPLOAD_MAX_MEMORY_SIZE = max(2_621_440, SCHEDULER_MAX_REQUEST_BYTES, SCHEDULER_MAX_BATCH_REQUEST_BYTES)
SCHEDULER_OUTBOX_ALERT_SECONDS = env.int("SCHEDULER_OUTBOX_ALERT_SECONDS", default=300)
# Target calls' X-Scheduler-Signature carries v2 (bound to the run, key, generation, method and
# URL) and, while this is on, the older v1 (body and time only, replayable under other headers)
# for targets not yet moved to v2. Turn it off once every target checks v2 (docs/api.md).
SCHEDULER_SIGNATURE_V1 = env.bool("SCHEDULER_SIGNATURE_V1", default=True)
# Mail, for password resets only. Without EMAIL_HOST no reset is offered (its pages answer 404):
# it could not send anything, and each request cost an SMTP attempt (scheduler_project.web.passwordreset).
EMAIL_HOST = env.str("EMAIL_HOST", default="")
EMAIL_PORT = env.int("EMAIL_PORT", default=587)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=True)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="scheduler@localhost")
SCHEDULER_PASSWORD_RESET = env.bool("SCHEDULER_PASSWORD_RESET", default=bool(EMAIL_HOST))
# Per client address and per mail address asked for, in an hour.
SCHEDULER_PASSWORD_RESET_PER_HOUR = env.int("SCHEDULER_PASSWORD_RESET_PER_HOUR", default=5)
SCHEDULER_RELAY_BATCH = env.int("SCHEDULER_RELAY_BATCH", default=100)
SCHEDULER_RELAY_TIMEOUT_SECONDS = env.float("SCHEDULER_RELAY_TIMEOUT_SECONDS", default=10.0)
SCHEDULER_RELAY_VISIBILITY_SECONDS = env.float("SCHEDULER_RELAY_VISIBILITY_SECONDS", default=120.0)
SCHEDULER_RELAY_MAX_BACKOFF_SECONDS = env.float("SCHEDULER_RELAY_MAX_BACKOFF_SECONDS", default=600.0)
SCHEDULER_RELAY_CONCURRENCY = env.int("SCHEDULER_RELAY_CONCURRENCY", default=16)

if not DEBUG and SECRET_KEY == _DEV_KEY and IS_POSTGRES and not env.bool("SCHEDULER_ALLOW_DEV_SECRET", default=False):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        "SECRET_KEY must be set in production (DATABASE_URL points at PostgreSQL and DEBUG is off)."
    )
