"""The person's choice of how times are shown (UTC, the schedule's zone, the browser's zone): a
cookie, so it holds across sessions and needs no table. A plain form post and a redirect back, so
it works without JavaScript (with it, choosing submits the form)."""

from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from scheduler_project.web.portal.display import MODE_COOKIE, MODES

ONE_YEAR = 365 * 24 * 3600


@require_POST
def time_preference(request):
    back = request.POST.get("next") or reverse("runs-dashboard")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        back = reverse("runs-dashboard")
    response = HttpResponseRedirect(back)
    mode = request.POST.get("mode", "")
    if mode in MODES:
        response.set_cookie(MODE_COOKIE, mode, max_age=ONE_YEAR, samesite="Lax", secure=request.is_secure(),
                            httponly=True)
    return response
