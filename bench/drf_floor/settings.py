"""Settings of the DRF floor app (bench/drf_floor): the bench database from DATABASE_URL, the
same connection reuse as the product (CONN_MAX_AGE 60, health checks), DEBUG off."""

import os
from urllib.parse import urlsplit

_url = urlsplit(os.environ["DATABASE_URL"])
SECRET_KEY = "drf-floor-bench-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "rest_framework", "drf_floor"]
MIDDLEWARE = ["django.middleware.security.SecurityMiddleware", "django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "drf_floor.urls"
WSGI_APPLICATION = "drf_floor.wsgi.application"
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": _url.path.lstrip("/"), "USER": _url.username or "postgres",
    "PASSWORD": _url.password or "", "HOST": _url.hostname, "PORT": _url.port or 5432,
    "CONN_MAX_AGE": 60, "CONN_HEALTH_CHECKS": True, "OPTIONS": {"application_name": "drf-floor"},
}}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": None,
}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
