"""Issue 26, finding 9, in the portal: a schedule form with a target URL with an unbalanced IPv6
bracket was a 500; it is a 400 with the message next to the URL field, and nothing is stored."""

import pytest
from django.urls import reverse

from schedules.models import Schedule, ScheduleVersion
from tests.portal.test_schedule_form_refuses_what_the_api_refuses import form

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["http://[::1", "https://::1]/hook"])
def test_finding_9_new_schedule_with_an_unbalanced_bracket_is_a_form_error(operator, tenant, target, url):
    before = (Schedule.objects.count(), ScheduleVersion.objects.count())
    resp = operator.post(reverse("schedules-create"), form(target, tenant, target_url=url))
    assert resp.status_code == 400
    html = resp.content.decode()
    assert "brackets" in html and 'class="field-error"' in html
    assert (Schedule.objects.count(), ScheduleVersion.objects.count()) == before


def test_finding_9_edit_with_an_unbalanced_bracket_is_a_form_error(acme, schedule, target):
    resp = acme.post(reverse("schedules-edit", args=[schedule.id]),
                     form(target, version=str(schedule.version), target_url="http://[::1/x"))
    assert resp.status_code == 400 and "brackets" in resp.content.decode()
    schedule.refresh_from_db()
    assert schedule.version == 1 and schedule.versions.count() == 1
