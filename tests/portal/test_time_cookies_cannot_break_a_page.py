"""The time-display cookies are the browser's to set, so any value in them must leave every page
working, in UTC: a folder of the tz database ("Europe") made ZoneInfo raise IsADirectoryError and
every page answer 500."""

import pytest
from django.urls import reverse

from scheduler_project.web.portal.display import BROWSER_COOKIE, MODE_COOKIE

pytestmark = pytest.mark.django_db

ZONES = ["Europe", "America", "Etc", "zone.tab", "tzdata.zi", "leapseconds", "../../etc/passwd", "/etc/localtime",
         "x" * 3000, "Europe/Berlin\\", "Europe//Berlin"]
PAGES = ["runs-dashboard", "runs-list", "runs-dlq", "schedules-list", "dispatch-workers", "schedules-audit"]


@pytest.mark.parametrize("value", ZONES)
def test_a_browser_zone_that_is_not_a_zone_leaves_every_page_in_utc(acme, schedule, value):
    acme.cookies[MODE_COOKIE] = "browser"
    acme.cookies[BROWSER_COOKIE] = value
    for name in PAGES:
        resp = acme.get(reverse(name))
        assert resp.status_code == 200, name
    resp = acme.get(reverse("schedules-detail", args=[schedule.id]))
    assert resp.status_code == 200 and "times are in UTC" in resp.content.decode()


def test_a_real_browser_zone_is_used(acme, schedule):
    acme.cookies[MODE_COOKIE] = "browser"
    acme.cookies[BROWSER_COOKIE] = "Asia/Kolkata"
    html = acme.get(reverse("schedules-detail", args=[schedule.id])).content.decode()
    assert " IST<" in html and "times are in UTC" not in html
