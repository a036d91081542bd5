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
    def __init__(self, current_version: int):
        super().__init__(
            f"expectedVersion is stale: the schedule is at version {current_version}",
            currentVersion=current_version,
        )
        self.current_version = current_version


class PayloadTooLarge(ServiceError):
    status = 413
