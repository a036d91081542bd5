"""Password reset by mail: offered only where mail is configured, and throttled.

Without a mail server the reset form did nothing useful and cost an SMTP connection attempt per
anonymous request. So its pages answer 404 unless SCHEDULER_PASSWORD_RESET is on (the default
when EMAIL_HOST is set), and each address, and each mail address asked for, may ask
SCHEDULER_PASSWORD_RESET_PER_HOUR times an hour (then 429 with Retry-After, and no mail), counted
in the database like sign-in failures (scheduler_project.web.loginthrottle).
"""

import math

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.http import Http404
from django.shortcuts import render
from django.urls import path, reverse_lazy

from scheduler_project.web import loginthrottle
from scheduler_project.web.clientaddr import client_address

WINDOW_SECONDS = 3600


def offered() -> bool:
    return bool(settings.SCHEDULER_PASSWORD_RESET)


def _keys(request) -> list[tuple[str, int]]:
    limit = max(1, settings.SCHEDULER_PASSWORD_RESET_PER_HOUR)
    mail = str(request.POST.get("email", ""))[:254].strip().casefold()
    return [(loginthrottle.digest("reset-addr", client_address(request)), limit),
            (loginthrottle.digest("reset-mail", mail), limit)]


class _OnlyWithMail:
    def dispatch(self, request, *args, **kwargs):
        if not offered():
            raise Http404("password reset is not offered here: no mail is configured")
        return super().dispatch(request, *args, **kwargs)


class ResetView(_OnlyWithMail, auth_views.PasswordResetView):
    success_url = reverse_lazy("password_reset_done")

    def post(self, request, *args, **kwargs):
        keys = _keys(request)
        wait = loginthrottle.locked_until([k for k, _ in keys])
        if wait > 0:
            minutes = max(1, math.ceil(wait / 60))
            messages.error(request, f"Too many password resets asked for; try again in {minutes} "
                                    f"minute{'s' if minutes != 1 else ''}.")
            response = render(request, self.template_name, self.get_context_data(form=self.get_form()), status=429)
            response["Retry-After"] = str(math.ceil(wait))
            return response
        loginthrottle.count(keys, window_seconds=WINDOW_SECONDS, lockout_seconds=WINDOW_SECONDS)
        return super().post(request, *args, **kwargs)


class ResetDoneView(_OnlyWithMail, auth_views.PasswordResetDoneView):
    pass


class ResetConfirmView(_OnlyWithMail, auth_views.PasswordResetConfirmView):
    success_url = reverse_lazy("password_reset_complete")


class ResetCompleteView(_OnlyWithMail, auth_views.PasswordResetCompleteView):
    pass


# In place of django.contrib.auth.urls' reset routes (same names, so templates' links still work).
urlpatterns = [
    path("password_reset/", ResetView.as_view(), name="password_reset"),
    path("password_reset/done/", ResetDoneView.as_view(), name="password_reset_done"),
    path("reset/<uidb64>/<token>/", ResetConfirmView.as_view(), name="password_reset_confirm"),
    path("reset/done/", ResetCompleteView.as_view(), name="password_reset_complete"),
]
