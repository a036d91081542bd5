"""Portal pages (HTML + htmx) for operators and tenant users; see docs/portal.md."""
