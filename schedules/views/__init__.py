"""Portal pages about tenants, their keys, allowlists and webhooks, and the audit log.

Schedule pages live in `runs.views.schedules`: they show runs and call `runs.schedule_actions`,
and `schedules` must not depend on `runs`."""
