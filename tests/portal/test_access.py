"""Who gets in: anonymous users are sent to log in, users with no role see a message, and the
login page itself works without JavaScript."""

import pytest
from django.test import Client
from django.urls import reverse

PAGES = ["runs-dashboard", "runs-list", "runs-dlq", "schedules-list", "schedules-audit", "schedules-tenants"]


@pytest.mark.parametrize("name", PAGES)
def test_anonymous_users_are_sent_to_log_in(db, name):
    r = Client().get(reverse(name))
    assert r.status_code == 302
    assert r["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("name", PAGES)
def test_a_user_with_no_tenant_and_no_staff_flag_sees_only_a_message(outsider, schedule, name):
    from .conftest import login

    r = login(outsider).get(reverse(name))
    assert r.status_code == 403
    assert b"No access yet" in r.content
    assert b"nightly-report" not in r.content


def test_the_login_form_logs_a_tenant_user_in(acme_user):
    c = Client()
    page = c.get(reverse("login"))
    assert b'<label for="id_username">' in page.content
    r = c.post(reverse("login"), {"username": "alice", "password": "pw-alice-123"})
    assert r.status_code == 302 and r["Location"] == "/"
    assert c.get("/").status_code == 200


def test_a_wrong_password_says_so(acme_user):
    r = Client().post(reverse("login"), {"username": "alice", "password": "nope"})
    assert r.status_code == 200
    assert b"did not match" in r.content


def test_pages_use_the_local_htmx_and_no_cdn(operator):
    html = operator.get("/").content.decode()
    assert "/static/django_htmx/htmx-2.min.js" in html
    assert "https://" not in html.split("<main")[0]  # nothing in <head> or the nav comes from elsewhere
    assert 'hx-headers=\'{"X-CSRFToken"' in html
    assert 'class="skip-link" href="#main"' in html and '<main id="main"' in html


def test_the_htmx_file_is_served_from_static_files():
    from django.contrib.staticfiles import finders

    assert finders.find("django_htmx/htmx-2.min.js")
    assert finders.find("portal/portal.css")
