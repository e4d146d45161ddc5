"""The project's one error root and the classes every layer shares.

`OutcomeUnknown` is its own class on purpose: a write that timed out may have been applied, so callers
re-read before deciding, and never treat it as "failed" (DESIGN.md, Ownership and fencing).
"""

from __future__ import annotations


class SchedError(Exception):
    """Root of every error this package raises on purpose."""


class InvalidArgument(SchedError, ValueError):
    """Bad input. `field` names what to fix (a dotted path such as `spec.minute`), `reason` says why.

    The gRPC edge maps this to INVALID_ARGUMENT with a google.rpc.BadRequest field violation, the CLI
    prints `field: reason` and exits non-zero.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason

    def nested(self, prefix: str) -> InvalidArgument:
        """The same error with its field path prefixed (`minute` -> `spec.minute`)."""
        return InvalidArgument(f"{prefix}.{self.field}" if self.field else prefix, self.reason)


class OutcomeUnknown(SchedError):
    """A write may or may not have been applied (timeout, lost connection): re-read before deciding."""


class FencedOut(SchedError):
    """A fenced write's ownership compare failed: the partition belongs to someone else now."""


class NotFound(SchedError):
    """The schedule, execution or dead letter does not exist."""


class AlreadyExists(SchedError):
    """A create found the id taken."""


class VersionMismatch(SchedError):
    """Optimistic concurrency: the stored version is not the one the caller read."""


class FailedPrecondition(SchedError):
    """The current state forbids the call (a paused schedule triggered, a running execution re-run)."""


class ResourceExhausted(SchedError):
    """A limit was hit (too many planned times in a backfill, too many schedules in a page)."""


class Unauthenticated(SchedError):
    """A call that needs a principal came without valid credentials (no token, a bad signature, expired)."""


class PermissionDenied(SchedError):
    """The caller is known but its roles do not allow the call. Never raised for another tenant's object:
    that one is `NotFound`, so that its existence does not leak (docs/operations.md, "Security")."""
