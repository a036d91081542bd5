"""Content-Security-Policy on every response (Django 5.2 has none built in; a few lines here
rather than django-csp as a dependency).

The portal, the admin and the API docs load scripts and styles only from this server, and the
portal has no inline script; so the policy is 'self' throughout, with three exact exceptions,
each allowed by the SHA-256 of its text and nothing else:

- htmx injects one <style> for its request indicators (the text below, htmx 2's default classes);
- the tenant page's new-key field selects itself on focus (`onfocus="this.select()"`), an inline
  handler, which needs 'unsafe-hashes' with its hash;
- the API docs page (drf-spectacular's Swagger UI) has an inline <script> and <style> that
  configure it; their hashes are taken from that response itself, which renders no tenant data.

SCHEDULER_CONTENT_SECURITY_POLICY replaces the policy (empty: no header).
"""

import base64
import hashlib
import re

from django.conf import settings

HTMX_INDICATOR_STYLE = (".htmx-indicator{opacity:0;visibility: hidden} "
                        ".htmx-request .htmx-indicator, .htmx-request.htmx-indicator"
                        "{opacity:1;visibility: visible;transition: opacity 200ms ease-in}")
SELECT_ON_FOCUS = "this.select()"
DOCS_PATH = "/api/docs/"
_INLINE = re.compile(rb"<(script|style)(?:\s[^>]*)?>(.*?)</\1>", re.S | re.I)


def sha256_source(text: bytes | str) -> str:
    data = text.encode() if isinstance(text, str) else text
    return "'sha256-" + base64.b64encode(hashlib.sha256(data).digest()).decode() + "'"


def default_policy() -> str:
    return "; ".join([
        "default-src 'self'",
        f"script-src 'self' 'unsafe-hashes' {sha256_source(SELECT_ON_FOCUS)}",
        f"style-src 'self' {sha256_source(HTMX_INDICATOR_STYLE)}",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ])


def _with_inline_hashes(policy: str, body: bytes) -> str:
    extra = {"script": [], "style": []}
    for tag, content in _INLINE.findall(body):
        if content.strip():
            extra[tag.decode().lower()].append(sha256_source(content))
    parts = []
    for directive in policy.split(";"):
        directive = directive.strip()
        name = directive.split(" ", 1)[0]
        if name in ("script-src", "style-src") and extra[name[:-4]]:
            directive += " " + " ".join(extra[name[:-4]])
        parts.append(directive)
    return "; ".join(parts)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        policy = getattr(settings, "SCHEDULER_CONTENT_SECURITY_POLICY", None)
        if policy is None:
            policy = default_policy()
        if not policy or "Content-Security-Policy" in response:
            return response
        if (request.path == DOCS_PATH and not getattr(response, "streaming", False)
                and response.get("Content-Type", "").startswith("text/html")):
            if hasattr(response, "render") and not response.is_rendered:
                response.render()
            policy = _with_inline_hashes(policy, response.content)
        response["Content-Security-Policy"] = policy
        return response
