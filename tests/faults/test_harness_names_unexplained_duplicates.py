"""The fault suites' own reading of a failure: a run the target acted on more often than its
unknown attempts explain is named with its deliveries and attempts (a CI failure of the delivery
count once left nothing to read). Runs in both passes: it needs only the tables."""

import uuid
from collections import Counter

import pytest

from runs.actions import trigger_schedule
from runs.models import Attempt
from tests.faults.harness import Report, _explain_unexplained_duplicates
from tests.helpers import ACTOR, make_schedule

pytestmark = pytest.mark.django_db


def acted(deliveries):
    return Counter(d[0] for d in deliveries if d[3])


def test_a_run_delivered_twice_with_no_unknown_attempt_is_named_with_its_evidence(tenant, target):
    run = trigger_schedule(make_schedule(tenant, target.url + "/x"), by=ACTOR)
    rid = str(run.id)
    Attempt.objects.create(run=run, scheduled_time=run.scheduled_time, generation=1, worker_id="w-1",
                           started_at=run.scheduled_time, finished_at=run.scheduled_time, outcome="succeeded")
    deliveries = [(rid, 1, rid, True, "200"), (rid, 1, rid, True, "200"), (str(uuid.uuid4()), 1, "k", True, "200")]
    report = Report()
    _explain_unexplained_duplicates(report, acted(deliveries), deliveries)
    assert report.details[0] == "1 runs delivered more often than their unknown attempts explain"
    assert rid in report.details[1] and "(1, '200'), (1, '200')" in report.details[1]
    assert "'w-1', 'succeeded'" in report.details[1]


def test_a_duplicate_its_unknown_attempt_explains_is_not_named(tenant, target):
    run = trigger_schedule(make_schedule(tenant, target.url + "/x"), by=ACTOR)
    rid = str(run.id)
    Attempt.objects.create(run=run, scheduled_time=run.scheduled_time, generation=1, worker_id="w-1",
                           started_at=run.scheduled_time, finished_at=run.scheduled_time, outcome="unknown")
    deliveries = [(rid, 1, rid, True, "drop"), (rid, 2, rid, True, "200"), (rid, 3, rid, False, "500")]
    report = Report()
    _explain_unexplained_duplicates(report, acted(deliveries), deliveries)
    assert report.details == []
