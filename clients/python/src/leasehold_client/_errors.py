"""The exceptions: one class per error code the sidecar answers, plus the client's own."""

from __future__ import annotations


class LeaseholdError(Exception):
    """An error answer of the sidecar, or the client's own (`sidecar-down`, `bad-answer`, `busy`).

    `code` is the API's `error` field (`bad-request`, `lost`, `store-down`, ...), `status` the
    HTTP status (0 when the sidecar could not be reached), `field` the request field at fault
    (for `bad-request`), `reason` why a lease is not held (for `lost`).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int = 0,
        field: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.field = field
        self.reason = reason


class SidecarDown(LeaseholdError):
    """The sidecar could not be reached, or did not answer within the client's timeout."""


class BadAnswer(LeaseholdError):
    """The sidecar answered something that is not the API's JSON."""


class BadRequest(LeaseholdError):
    """A field is missing, malformed or out of range; `field` names it."""


class Unauthorized(LeaseholdError):
    """The bearer token is missing or wrong (a sidecar run with `--auth-token-file`)."""


class StoreDown(LeaseholdError):
    """The sidecar's store did not answer in time."""


class StoreRefused(LeaseholdError):
    """The store refused the request: a permission or configuration problem."""


class LeaseLost(LeaseholdError):
    """The lease or run is not held (any more): stop acting on it. `reason` says why:
    `released`, `taken-over`, `expired`, `app-silent`, `timed-out` (a run past its `timeout`),
    `unknown`."""


class LeaseBusy(LeaseholdError):
    """Another holder kept the lease for as long as the caller would wait.

    `holder` is the current holder (None if the store could not say), `remaining` the seconds
    left on its lease.
    """

    def __init__(self, name: str, holder: str | None, remaining: float) -> None:
        super().__init__(f"lease {name} is held by {holder or 'another holder'}", code="busy")
        self.holder = holder
        self.remaining = remaining


class UnknownTask(LeaseholdError):
    """No such task in the store's catalog."""


class NoInstance(LeaseholdError):
    """No instance runs the task now, so nobody would take a trigger."""


class NoCatalog(LeaseholdError):
    """The store keeps no catalog: there is nothing to list, pause or trigger."""


_BY_CODE: dict[str, type[LeaseholdError]] = {
    "bad-request": BadRequest,
    "unauthorized": Unauthorized,
    "store-down": StoreDown,
    "store-refused": StoreRefused,
    "lost": LeaseLost,
    "unknown-task": UnknownTask,
    "no-instance": NoInstance,
    "no-catalog": NoCatalog,
}


def error_for(
    code: str, message: str, status: int, field: str | None, reason: str | None
) -> LeaseholdError:
    """The exception for an error answer with `code` (the base class for codes without one)."""
    kind = _BY_CODE.get(code, LeaseholdError)
    return kind(message, code=code, status=status, field=field, reason=reason)
