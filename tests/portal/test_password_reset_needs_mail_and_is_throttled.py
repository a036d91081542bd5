"""Issue 26, finding 12: the password reset was offered with no mail configured (an SMTP attempt
per anonymous request, unthrottled). It is served only where mail is configured, and throttled
per address and per mail address asked for."""

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

pytestmark = pytest.mark.django_db

PAGES = ["/accounts/password_reset/", "/accounts/password_reset/done/", "/accounts/reset/done/",
         "/accounts/reset/MQ/set-password/"]


def test_password_reset_is_not_served_without_mail(settings):
    settings.SCHEDULER_PASSWORD_RESET = False
    User.objects.create_user("alice", email="alice@example.com", password="pw-alice-123")
    client = Client()
    for page in PAGES:
        assert client.get(page).status_code == 404, page
    assert client.post("/accounts/password_reset/", {"email": "alice@example.com"}).status_code == 404
    assert mail.outbox == []
    # Signing in is untouched.
    assert client.post("/accounts/login/", {"username": "alice", "password": "pw-alice-123"}).status_code == 302


def test_password_reset_is_not_offered_by_default_without_an_email_host():
    from scheduler_project import settings as project_settings

    assert project_settings.EMAIL_HOST == "" and project_settings.SCHEDULER_PASSWORD_RESET is False


def test_password_reset_with_mail_is_throttled_per_address_and_per_mail_address(settings):
    settings.SCHEDULER_PASSWORD_RESET = True
    settings.SCHEDULER_PASSWORD_RESET_PER_HOUR = 3
    User.objects.create_user("alice", email="alice@example.com", password="pw-alice-123")
    client = Client(REMOTE_ADDR="203.0.113.7")
    assert client.get("/accounts/password_reset/").status_code == 200
    for _ in range(3):
        assert client.post("/accounts/password_reset/", {"email": "alice@example.com"}).status_code == 302
    assert len(mail.outbox) == 3
    resp = client.post("/accounts/password_reset/", {"email": "alice@example.com"})
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0
    assert "Too many password resets" in resp.content.decode()
    assert len(mail.outbox) == 3
    # The same mail address from elsewhere is locked too (a mailbox is not to be flooded)...
    elsewhere = Client(REMOTE_ADDR="198.51.100.9")
    assert elsewhere.post("/accounts/password_reset/", {"email": "ALICE@example.com"}).status_code == 429
    # ...and so is this address for any other mail address.
    assert client.post("/accounts/password_reset/", {"email": "bob@example.com"}).status_code == 429
    assert len(mail.outbox) == 3
    assert elsewhere.post("/accounts/password_reset/", {"email": "carol@example.com"}).status_code == 302
