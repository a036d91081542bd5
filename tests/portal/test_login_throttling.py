"""Sign-in attempts are throttled per username and address, and per address, counted in the
database so every web process shares the count: past the limit the sign-in form answers 429 with
a message saying when to try again, without checking the password, for the portal's login and
the admin's alike."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from scheduler_project.foundation.dbclock import db_now
from scheduler_project.web.models import LoginThrottle

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="pw-alice-123")


def attempt(password, *, username="alice", address="203.0.113.7", path=LOGIN):
    client = Client(REMOTE_ADDR=address)
    return client, client.post(path, {"username": username, "password": password})


def test_five_failures_lock_the_username_at_that_address_even_against_the_right_password(alice, settings):
    assert settings.SCHEDULER_LOGIN_MAX_FAILURES == 5
    for _ in range(5):
        _, resp = attempt("wrong")
        assert resp.status_code == 200
    client, resp = attempt("pw-alice-123")
    assert resp.status_code == 429
    html = resp.content.decode()
    assert "Too many failed sign-ins for this username from your address" in html
    assert "locked for 15 more minutes" in html
    assert 890 <= int(resp["Retry-After"]) <= 900
    assert "_auth_user_id" not in client.session


def test_the_lock_holds_for_the_same_username_in_another_case_and_not_elsewhere(alice):
    User.objects.create_user("bob", password="pw-bob-123")
    for _ in range(5):
        attempt("wrong")
    assert attempt("pw-alice-123", username="ALICE")[1].status_code == 429
    assert attempt("pw-bob-123", username="bob")[1].status_code == 302
    assert attempt("pw-alice-123", address="198.51.100.9")[1].status_code == 302


def test_a_successful_sign_in_clears_the_count(alice):
    for _ in range(4):
        attempt("wrong")
    assert attempt("pw-alice-123")[1].status_code == 302
    for _ in range(4):
        assert attempt("wrong")[1].status_code == 200
    assert attempt("pw-alice-123")[1].status_code == 302


def test_the_lock_ends_after_the_lockout(alice):
    for _ in range(5):
        attempt("wrong")
    assert attempt("pw-alice-123")[1].status_code == 429
    LoginThrottle.objects.filter(locked_until__isnull=False).update(locked_until=db_now() - timedelta(seconds=1))
    assert attempt("pw-alice-123")[1].status_code == 302


def test_one_address_trying_many_usernames_is_locked_out_as_a_whole(alice):
    for i in range(20):
        attempt("wrong", username=f"guess-{i}")
    assert attempt("pw-alice-123")[1].status_code == 429
    assert attempt("pw-alice-123", address="198.51.100.9")[1].status_code == 302


def test_the_admin_sign_in_is_throttled_too(alice):
    alice.is_staff = True
    alice.save()
    for _ in range(5):
        assert attempt("wrong", path="/admin/login/")[1].status_code == 200
    assert attempt("pw-alice-123", path="/admin/login/")[1].status_code == 429
    assert attempt("pw-alice-123")[1].status_code == 429


def test_no_username_is_stored_and_old_rows_are_pruned(alice):
    attempt("wrong", username="my-password-typed-as-username")
    assert not LoginThrottle.objects.filter(key__icontains="password").exists()
    assert all(len(k) == 64 for k in LoginThrottle.objects.values_list("key", flat=True))
    LoginThrottle.objects.update(expires_at=db_now() - timedelta(seconds=1))
    attempt("wrong", username="someone-else")
    assert LoginThrottle.objects.count() == 2  # only the new failure's two counters are left


def test_throttling_can_be_turned_off(alice, settings):
    settings.SCHEDULER_LOGIN_MAX_FAILURES = 0
    for _ in range(8):
        attempt("wrong")
    assert attempt("pw-alice-123")[1].status_code == 302
