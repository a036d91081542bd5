"""`{% load portal %}`: the portal's template tags. Django finds tag libraries only in an installed
app's `templatetags` package; the tags themselves live with the portal (web/portal/tags.py)."""

from scheduler_project.web.portal.tags import register  # noqa: F401
