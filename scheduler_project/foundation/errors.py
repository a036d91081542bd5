"""Errors that services raise and every front end (API, portal, admin, commands) turns into a
message a person can act on."""


class ServiceError(Exception):
    """Base: the request was understood but cannot be done as asked. Nothing was changed."""

    status = 400

    def __init__(self, message: str, **extra):
        super().__init__(message)
        self.message = message
        self.extra = extra


class ValidationFailed(ServiceError):
    """Field errors: {"field": ["message", ...]}."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        first = next(iter(errors.items()))
        super().__init__(f"{first[0]}: {first[1][0]}")


class Conflict(ServiceError):
    """The object is not in a state that allows the action (e.g. retry of a succeeded run)."""

    status = 409


class StaleVersion(Conflict):
    """An edit made against an older version. `changed_since` is {field: (value in the expected
    version, value now)} for each versioned field that differs between the two, or None when the
    expected version is not one the schedule ever had."""

    def __init__(self, current_version: int, *, expected_version: int | None = None,
                 changed_since: dict | None = None):
        super().__init__(
            f"expectedVersion is stale: the schedule is at version {current_version}",
            currentVersion=current_version,
        )
        self.current_version = current_version
        self.expected_version = expected_version
        self.changed_since = changed_since


class EditConflict(StaleVersion):
    """A merged edit (three-way: the version the editor loaded, the current one, the editor's
    values) in which both sides changed a field to different values: nothing was saved, the
    editor must choose. `conflicts` is {field: {"base": ..., "theirs": ..., "mine": ...}}."""

    def __init__(self, current_version: int, *, expected_version: int, changed_since: dict, conflicts: dict):
        super().__init__(current_version, expected_version=expected_version, changed_since=changed_since)
        self.conflicts = conflicts
        self.message = (f"version {current_version} changed {', '.join(conflicts)} since version "
                        f"{expected_version}, and so did this edit: choose which value to keep")


class PayloadTooLarge(ServiceError):
    status = 413
