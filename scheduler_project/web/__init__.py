"""The HTTP surface, one layer above the domain apps: the DRF API (`api`), the portal's HTML and
htmx pages (`portal`), the admin (`admin`), who may see and do what (`access`), pagination, the
client address behind proxies, health and metrics endpoints.

Layers point one way: `scheduler_project.foundation` <- `schedules` <- `runs` <- `dispatch` <-
`scheduler_project.web`. Nothing in the domain apps imports from here
(tests/architecture/test_layers.py checks it). Every change a page, an API
view or an admin action makes goes through the owning app's service function.
"""
