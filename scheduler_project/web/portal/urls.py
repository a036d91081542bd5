"""Portal routes (HTML + htmx). Public ids in URLs are UUIDs; names carry the app prefix."""

from django.urls import path

from scheduler_project.web.portal import (audit, dashboard, dlq, incidents, preferences, runs, schedule_form, schedules,
                                          tenants, workers)

urlpatterns = [
    path("", dashboard.dashboard, name="runs-dashboard"),
    path("runs/", runs.run_list, name="runs-list"),
    path("runs/<uuid:pk>/", runs.run_detail, name="runs-detail"),
    path("runs/<uuid:pk>/retry", runs.run_retry, name="runs-retry"),
    path("runs/<uuid:pk>/cancel", runs.run_cancel, name="runs-cancel"),
    path("dlq/", dlq.dlq, name="runs-dlq"),
    path("dlq/action", dlq.dlq_action, name="runs-dlq-action"),
    path("workers/", workers.workers, name="dispatch-workers"),
    path("schedules/", schedules.schedule_list, name="schedules-list"),
    path("schedules/new", schedule_form.schedule_create, name="schedules-create"),
    path("schedules/preview", schedule_form.expression_preview, name="schedules-preview"),
    path("schedules/<uuid:pk>/", schedules.schedule_detail, name="schedules-detail"),
    path("schedules/<uuid:pk>/edit", schedule_form.schedule_edit, name="schedules-edit"),
    path("schedules/<uuid:pk>/runs", schedules.schedule_runs, name="schedules-runs"),
    path("schedules/<uuid:pk>/pause", schedules.schedule_pause, name="schedules-pause"),
    path("schedules/<uuid:pk>/resume", schedules.schedule_resume, name="schedules-resume"),
    path("schedules/<uuid:pk>/trigger", schedules.schedule_trigger, name="schedules-trigger"),
    path("schedules/<uuid:pk>/backfill", schedules.schedule_backfill, name="schedules-backfill"),
    path("audit/", audit.audit_log, name="schedules-audit"),
    path("tenants/", tenants.tenant_list, name="schedules-tenants"),
    path("tenants/<uuid:pk>/", tenants.tenant_detail, name="schedules-tenant-detail"),
    path("tenants/<uuid:pk>/settings", tenants.tenant_settings, name="schedules-tenant-settings"),
    path("tenants/<uuid:pk>/secret", tenants.secret_rotate, name="schedules-secret-rotate"),
    path("tenants/<uuid:pk>/members", tenants.member_add, name="schedules-member-add"),
    path("tenants/<uuid:pk>/members/<int:member_id>", tenants.member_change, name="schedules-member-change"),
    path("tenants/<uuid:pk>/keys", tenants.key_create, name="schedules-key-create"),
    path("tenants/<uuid:pk>/keys/<uuid:key_id>/revoke", tenants.key_revoke, name="schedules-key-revoke"),
    path("tenants/<uuid:pk>/targets", tenants.target_add, name="schedules-target-add"),
    path("tenants/<uuid:pk>/targets/<int:target_id>/remove", tenants.target_remove, name="schedules-target-remove"),
    path("incidents/", incidents.incident_list, name="incidents-list"),
    path("incidents/<int:pk>/acknowledge", incidents.incident_acknowledge, name="incidents-acknowledge"),
    path("incidents/<int:pk>/resolve", incidents.incident_resolve, name="incidents-resolve"),
    path("owners/<uuid:pk>/", incidents.owner_detail, name="incidents-owner"),
    path("schedules/<uuid:pk>/owner", incidents.schedule_owner, name="schedules-owner"),
    path("preferences/time", preferences.time_preference, name="portal-time-preference"),
]
