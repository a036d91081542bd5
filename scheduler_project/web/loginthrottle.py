"""Login throttling for the portal's and the admin's sign-in forms.

Failed sign-ins are counted in the database (scheduler_project.web.models.LoginThrottle), so every gunicorn
worker on every machine shares one count: per username and client address, and per address
alone (several times higher, against one address trying many usernames). Past the limit within
the window, that pair (or address) is locked out for a while: its sign-in POSTs are answered 429
with a message saying when to try again, and the password is not even checked, so guessing on
during the lockout learns nothing. A successful sign-in clears its pair's count, not its
address's (one valid account must not reset an address that is guessing others). Usernames are
counted in their folded form (scheduler_project.foundation.usernames), so a look-alike spelling that signs
in to the same account is locked with it.

A small middleware rather than django-axes: two counters and a message are all this needs, and
axes brings its own models, backend, middleware, signals and settings to configure and upgrade.
It wraps Django's own login views, so the portal and the admin are covered alike.
"""

import hashlib
import math
from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.forms import AuthenticationForm
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.shortcuts import render

from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.usernames import canonical_username
from scheduler_project.web.clientaddr import client_address
from scheduler_project.web.models import LoginThrottle

LOGIN_PATHS = frozenset({"/accounts/login/", "/admin/login/"})
# The address alone may fail this many times the per-username limit.
ADDRESS_FACTOR = 4
PRUNE_BATCH = 100


def digest(kind: str, value: str) -> str:
    return hashlib.sha256(f"{kind}\x00{value}".encode("utf-8", "replace")).hexdigest()


def _keys(username: str, address: str) -> list[tuple[str, int]]:
    limit = settings.SCHEDULER_LOGIN_MAX_FAILURES
    return [
        # Folded as the sign-in form folds it (NFKC) and case-free: `ｖｉｃｔｉｍ` and `Victim` are
        # counted, and locked, with `victim`.
        (digest("user", f"{canonical_username(username)}\x00{address}"), limit),
        (digest("addr", address), limit * ADDRESS_FACTOR),
    ]


def locked_until(keys: list[str], *, now=None) -> float:
    """Seconds until none of these counters is locked any more (0: none is)."""
    now = now or db_now()
    until = (LoginThrottle.objects.filter(key__in=keys, locked_until__gt=now)
             .order_by("-locked_until").values_list("locked_until", flat=True).first())
    return (until - now).total_seconds() if until else 0.0


def locked_for(username: str, address: str, *, now=None) -> float:
    """Seconds until this username may try again from this address (0: it may now)."""
    return locked_until([k for k, _ in _keys(username, address)], now=now)


def count(keys: list[tuple[str, int]], *, window_seconds: int, lockout_seconds: int) -> None:
    """One more event on each (key, limit) counter; one that reaches its limit within the window
    is locked for the lockout. Also used by the password-reset form (scheduler_project.web.passwordreset)."""
    now = db_now()
    window = timedelta(seconds=window_seconds)
    lockout = timedelta(seconds=lockout_seconds)
    for key, limit in keys:
        for _ in range(2):  # a concurrent first failure may insert the row between our read and insert
            try:
                with transaction.atomic():
                    row = LoginThrottle.objects.select_for_update().filter(key=key).first()
                    if row is None:
                        row = LoginThrottle(key=key, failures=0, window_start=now, expires_at=now + window)
                    if now - row.window_start >= window:
                        row.failures, row.window_start = 0, now
                    row.failures += 1
                    row.expires_at = max(row.window_start + window, row.expires_at)
                    if row.failures >= limit:
                        row.locked_until = now + lockout
                        row.failures, row.window_start = 0, now
                        row.expires_at = max(row.expires_at, row.locked_until)
                    row.save()
                break
            except IntegrityError:
                continue
    stale = list(LoginThrottle.objects.filter(expires_at__lt=now).values_list("id", flat=True)[:PRUNE_BATCH])
    if stale:
        LoginThrottle.objects.filter(Q(id__in=stale) & Q(expires_at__lt=now)).delete()


def record_failure(username: str, address: str) -> None:
    count(_keys(username, address), window_seconds=settings.SCHEDULER_LOGIN_WINDOW_SECONDS,
          lockout_seconds=settings.SCHEDULER_LOGIN_LOCKOUT_SECONDS)


def record_success(username: str, address: str) -> None:
    LoginThrottle.objects.filter(key=_keys(username, address)[0][0]).delete()


class LoginThrottleMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method != "POST" or request.path not in LOGIN_PATHS or not settings.SCHEDULER_LOGIN_MAX_FAILURES:
            return self.get_response(request)
        username = str(request.POST.get("username", ""))[:150]
        address = client_address(request)
        wait = locked_for(username, address)
        if wait > 0:
            minutes = max(1, math.ceil(wait / 60))
            messages.error(request, f"Too many failed sign-ins for this username from your address. Sign-in is "
                                    f"locked for {minutes} more minute{'s' if minutes != 1 else ''}; try again then.")
            response = render(request, "registration/login.html",
                              {"form": AuthenticationForm(request), "next": request.POST.get("next", "")}, status=429)
            response["Retry-After"] = str(math.ceil(wait))
            return response
        response = self.get_response(request)
        # Django's login views redirect after a sign-in and show the form again after a refusal.
        if response.status_code == 302:
            record_success(username, address)
        elif response.status_code == 200:
            record_failure(username, address)
        return response
