from django.contrib import admin
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from scheduler_project.web import health
from scheduler_project.web.api import apply as apply_api
from scheduler_project.web.api import batch as batch_api
from scheduler_project.web.api import forecast as forecast_api
from scheduler_project.web.api import owners as owners_api
from scheduler_project.web.api import retry_cost as retry_cost_api
from scheduler_project.web.api import runs as runs_api
from scheduler_project.web.api import schedules as schedules_api
from scheduler_project.web.api.root import api_root
from scheduler_project.web.health import metrics_view

api_v1 = [
    path("", api_root, name="api-root"),
    path("schedules", schedules_api.ScheduleListView.as_view(), name="api-schedules"),
    path("schedules/batch", batch_api.ScheduleBatchView.as_view(), name="api-schedules-batch"),
    path("schedules/apply", apply_api.ScheduleApplyView.as_view(), name="api-schedules-apply"),
    path("schedules/<uuid:pk>", schedules_api.ScheduleDetailView.as_view(), name="api-schedules-detail"),
    path("schedules/<uuid:pk>/trigger", schedules_api.ScheduleTriggerView.as_view(), name="api-schedules-trigger"),
    path("schedules/<uuid:pk>/backfill", schedules_api.ScheduleBackfillView.as_view(), name="api-schedules-backfill"),
    path("schedules/<uuid:pk>/occurrences", schedules_api.ScheduleOccurrencesView.as_view(), name="api-schedules-occurrences"),
    path("schedules/<uuid:pk>/retry-cost", retry_cost_api.ScheduleRetryCostView.as_view(), name="api-schedules-retry-cost"),
    path("expressions/preview", schedules_api.ExpressionPreviewView.as_view(), name="api-expressions-preview"),
    path("runs", runs_api.RunListView.as_view(), name="api-runs"),
    path("runs/<uuid:pk>", runs_api.RunDetailView.as_view(), name="api-runs-detail"),
    path("runs/<uuid:pk>/retry", runs_api.RunRetryView.as_view(), name="api-runs-retry"),
    path("runs/<uuid:pk>/cancel", runs_api.RunCancelView.as_view(), name="api-runs-cancel"),
    path("keys", schedules_api.ApiKeyListView.as_view(), name="api-keys"),
    path("keys/<uuid:pk>", schedules_api.ApiKeyDetailView.as_view(), name="api-keys-detail"),
    path("keys/<uuid:pk>/revoke", schedules_api.ApiKeyRevokeView.as_view(), name="api-keys-revoke"),
    path("audit", schedules_api.AuditListView.as_view(), name="api-audit"),
    path("forecast", forecast_api.ForecastView.as_view(), name="api-forecast"),
    path("forecast/spread/preview", forecast_api.BulkSpreadPreviewView.as_view(), name="api-forecast-spread-preview"),
    path("forecast/spread", forecast_api.BulkSpreadView.as_view(), name="api-forecast-spread"),
    path("owners", owners_api.OwnerListView.as_view(), name="api-owners"),
    path("owners/<slug:slug>", owners_api.OwnerDetailView.as_view(), name="api-owners-detail"),
    path("owners/<slug:slug>/test-notification", owners_api.OwnerTestView.as_view(), name="api-owners-test"),
    path("owners/<slug:slug>/retry-cost", retry_cost_api.OwnerRetryCostView.as_view(), name="api-owners-retry-cost"),
    path("retry-cost", retry_cost_api.RetryCostView.as_view(), name="api-retry-cost"),
    path("incident-rules", owners_api.RuleListView.as_view(), name="api-incident-rules"),
    path("incident-rules/<str:rule>", owners_api.RuleDetailView.as_view(), name="api-incident-rules-detail"),
    path("incidents", owners_api.IncidentListView.as_view(), name="api-incidents"),
    path("incidents/<int:pk>", owners_api.IncidentDetailView.as_view(), name="api-incidents-detail"),
    path("incidents/<int:pk>/acknowledge", owners_api.IncidentAcknowledgeView.as_view(), name="api-incidents-ack"),
    path("incidents/<int:pk>/resolve", owners_api.IncidentResolveView.as_view(), name="api-incidents-resolve"),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/v1", api_root),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    # Password reset first: served only where mail is configured, and throttled.
    path("accounts/", include("scheduler_project.web.passwordreset")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("scheduler_project.web.portal.urls")),
]

# The Swagger UI assets come from drf-spectacular-sidecar under STATIC_URL. With DEBUG this serves
# them from the app directories (so /api/docs/ works under gunicorn too); without DEBUG it adds
# nothing, and production serves `collectstatic` output from STATIC_ROOT (see docs/api.md).
urlpatterns += staticfiles_urlpatterns()

# Django-level errors (outside DRF) on /api/ paths answer JSON too.
handler400 = "scheduler_project.web.api.errors.json_400"
handler403 = "scheduler_project.web.api.errors.json_403"
handler404 = "scheduler_project.web.api.errors.json_404"
handler500 = "scheduler_project.web.api.errors.json_500"
