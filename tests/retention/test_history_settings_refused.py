"""The history settings refuse a value that would fail later, naming the setting: text where a
number goes, and a lock timeout PostgreSQL would not take (the DDL would fail at every step)."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from runs.history_settings import get


@pytest.mark.parametrize("value, said", [
    ("abc", "it must be a whole number"),
    (99_999_999_999, "from 1 to 2147483647"),
    (0, "from 1"),
    (-5, "from 1"),
])
def test_a_gate_timeout_out_of_range_or_not_a_number_is_refused(settings, value, said):
    settings.SCHEDULER_PARTITION_GATE_TIMEOUT_MS = value
    with pytest.raises(ImproperlyConfigured) as refused:
        get("SCHEDULER_PARTITION_GATE_TIMEOUT_MS")
    assert "SCHEDULER_PARTITION_GATE_TIMEOUT_MS" in str(refused.value) and said in str(refused.value)


def test_the_largest_lock_timeout_postgresql_takes_is_taken(settings):
    settings.SCHEDULER_PARTITION_LOCK_TIMEOUT_MS = 2**31 - 1
    assert get("SCHEDULER_PARTITION_LOCK_TIMEOUT_MS") == 2**31 - 1
