"""The Django admin as a safe console: registrations for the domain models, actions that call the
services. Loaded by admin autodiscovery (this app is installed as `scheduler_project.web`)."""

from scheduler_project.web.admin import incidents, runs, schedules, users  # noqa: F401  (registers the model admins)
