"""Issue 26, finding 9: a target URL with an unbalanced IPv6 bracket (`http://[::1`) was a 500 on
the API's create, edit and batch (the standard library's URL split raises ValueError), and one such
item turned a whole batch into a 500. It is a 400 on `target` with a message saying how an IPv6
address is written, and nothing is stored."""

import pytest

from schedules.models import Schedule
from tests.api.conftest import schedule_body

pytestmark = pytest.mark.django_db

BAD_URLS = ["http://[::1", "http://[::1/hook", "https://::1]/hook", "http://[::1]x/", "http://[::1:8080/x"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_finding_9_the_shape_check_answers_with_a_message(url):
    from schedules.targets import url_shape_problem

    problem = url_shape_problem(url)
    assert problem and "does not parse" in problem and "brackets" in problem


@pytest.mark.parametrize("url", BAD_URLS)
def test_finding_9_create_with_an_unbalanced_bracket_is_a_400(api, target, url):
    resp = api.post("/api/v1/schedules", {**schedule_body(target), "target": {"url": url}}, format="json")
    assert resp.status_code == 400, resp.content
    assert any("brackets" in m for m in resp.json()["errors"]["target"]), resp.json()
    assert not Schedule.objects.exists()


def test_finding_9_edit_with_an_unbalanced_bracket_is_a_400_and_keeps_the_version(api, schedule):
    resp = api.patch(f"/api/v1/schedules/{schedule.id}",
                     {"expectedVersion": 1, "target": {"url": "http://[::1"}}, format="json")
    assert resp.status_code == 400, resp.content
    assert "brackets" in str(resp.json()["errors"])
    schedule.refresh_from_db()
    assert schedule.version == 1


def test_finding_9_one_such_item_is_that_items_400_in_a_batch(api, tenant, target):
    items = [schedule_body(target, name="ok"), {**schedule_body(target), "target": {"url": "http://[::1"}}]
    resp = api.post("/api/v1/schedules/batch", {"schedules": items}, format="json")
    assert resp.status_code == 207, resp.content
    assert [r["status"] for r in resp.json()["results"]] == [201, 400]
    assert "brackets" in str(resp.json()["results"][1])
    assert Schedule.objects.filter(tenant=tenant).count() == 1
