"""Issue 26, finding 6: the sign-in lockout was bypassed with look-alike user names. Django's
sign-in form folds a name with NFKC before it looks the account up, so a locked `victim` signed in
as `ｖｉｃｔｉｍ` (fullwidth) or `victiⅿ` (U+217F) while the throttle counted that as another name.
The throttle now folds names as the form does (and case), and no account can be created whose name
reads as another's."""

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client

from schedules.models import MemberRole
from schedules.tenants import add_member
from tests.helpers import ACTOR

from .conftest import login

pytestmark = pytest.mark.django_db

LOOK_ALIKES = ["ｖｉｃｔｉｍ", "victiⅿ", "VICTIM", "Ｖｉｃｔｉｍ", " victim"]


def attempt(username, password, *, path="/accounts/login/", address="203.0.113.7"):
    client = Client(REMOTE_ADDR=address)
    return client, client.post(path, {"username": username, "password": password})


@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_look_alike_user_names_share_the_sign_in_lockout(path):
    User.objects.create_user("victim", password="pw-victim-123", is_staff=True)
    for _ in range(5):
        assert attempt("victim", "wrong", path=path)[1].status_code == 200
    assert attempt("victim", "pw-victim-123", path=path)[1].status_code == 429
    for name in LOOK_ALIKES:
        client, resp = attempt(name, "pw-victim-123", path=path)
        assert resp.status_code == 429, name
        assert "_auth_user_id" not in client.session, name
    # The failures of look-alikes count against the same name too.
    User.objects.create_user("carol", password="pw-carol-123")
    for name in ["ｃａｒｏｌ", "CAROL", "Ｃarol", "cａrol", "carol "]:
        attempt(name, "wrong", path=path, address="198.51.100.4")
    assert attempt("carol", "pw-carol-123", path=path, address="198.51.100.4")[1].status_code == 429


def test_look_alike_user_names_cannot_be_created():
    User.objects.create_user("victim", password="pw-victim-123")
    for name in ["Victim", "VICTIM"]:
        with pytest.raises(ValidationError, match="reads as the existing account 'victim'"):
            User.objects.create_user(name, password="pw-x-12345")
    # Raw ORM saves skip Django's own NFKC folding: still refused.
    for name in ["ｖｉｃｔｉｍ", "victiⅿ"]:
        with pytest.raises(ValidationError):
            User.objects.create(username=name)
    assert list(User.objects.values_list("username", flat=True)) == ["victim"]
    # Saving the account again (a sign-in's last_login, a new password) is no clash with itself.
    victim = User.objects.get(username="victim")
    victim.set_password("pw-new-123456")
    victim.save()
    other = User.objects.create_user("victor")
    other.username = "ＶＩＣＴＩＭ"
    with pytest.raises(ValidationError):
        other.save()


def test_look_alike_user_names_are_refused_by_the_admin_user_form():
    root = User.objects.create_superuser("root", password="pw-root-123")
    User.objects.create_user("victim")
    resp = login(root).post("/admin/auth/user/add/", {"username": "ｖｉｃｔｉｍ", "password1": "Ok-pass-8861x",
                                                       "password2": "Ok-pass-8861x", "usable_password": "true"})
    assert resp.status_code == 200
    assert "reads as the existing account" in resp.content.decode() or "already exists" in resp.content.decode()
    resp = login(root).post("/admin/auth/user/add/", {"username": "Ｖｉｃｔｏｒ", "password1": "Ok-pass-8861x",
                                                       "password2": "Ok-pass-8861x", "usable_password": "true"})
    assert resp.status_code == 302 and User.objects.filter(username="Victor").exists()
    other = User.objects.get(username="Victor")
    resp = login(root).post(f"/admin/auth/user/{other.pk}/change/", {"username": "VICTIM", "date_joined_0": "2026-01-01",
                                                                     "date_joined_1": "00:00:00"})
    assert resp.status_code == 200 and "reads as the existing account" in resp.content.decode()
    assert User.objects.filter(username="Victor").exists()


def test_look_alike_user_names_find_the_account_when_adding_a_member(tenant):
    User.objects.create_user("victim")
    membership = add_member(tenant, "ｖｉｃｔｉｍ", role=MemberRole.VIEWER, by=ACTOR)
    assert membership.user.username == "victim"
