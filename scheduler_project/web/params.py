"""Reading ids out of query strings and forms: the one UUID parser of the API and the portal."""

import uuid

from scheduler_project.foundation.errors import ValidationFailed


def parse_uuid(raw, *, field: str | None = None) -> uuid.UUID | None:
    """`raw` as a UUID; None when empty. Something else is a field error when `field` names it
    (the API answers 400), and None otherwise (a portal filter that matches nothing)."""
    if raw in (None, ""):
        return None
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        if field:
            raise ValidationFailed({field: ["must be an id (UUID)"]})
        return None
