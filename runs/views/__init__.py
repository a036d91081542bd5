"""Portal pages: dashboard, runs, the dead-letter queue, and schedules (which show and make runs,
so they live here rather than in `schedules`, which must not depend on `runs`)."""
