"""Which storage errors are worth another try, and the retry loop that raises StorageError.

The StorageError keeps its cause (`raise ... from` the last error), or a redacted stand-in when
the cause's text holds a credential; a missing path raises StorageNotFoundError (`not_found`).
"""

from __future__ import annotations

import errno
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from dataio.errors import StorageError, StorageNotFoundError
from dataio.storage.redact import chain_needs_redacting, redact

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter for transient storage errors, within a time budget.

    deadline_s bounds one call's tries as a whole: no new try starts once the time spent, the
    next backoff and (after a timeout) another try as long as the last would pass it. The first
    request of a command or loader runs under FIRST_REQUEST_DEADLINE_S (Store.first_request),
    so a stuck endpoint fails it within 30 s; later calls get deadline_s (2 minutes).
    """

    max_attempts: int = 5
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0
    deadline_s: float | None = 120.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("need 0 <= base_delay_s <= max_delay_s")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError("deadline_s must be positive (or None: no budget)")

    def delay_s(self, attempt: int) -> float:
        """Seconds to sleep before try number `attempt + 1` (attempt counts from 1)."""
        return random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)))


# How long the first request to a store (the shardify reachability check, the loader's manifest
# read) may take, all tries together: a wrong or stuck endpoint is reported this quickly.
FIRST_REQUEST_DEADLINE_S = 30.0


class ShortReadError(OSError):
    """Fewer bytes arrived than the index or manifest promised; transient until proven otherwise."""


class UnconfirmedWriteError(OSError):
    """After an upload the store does not show the object as written (absent, other size or ETag)."""


_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_NOT_FOUND = (FileNotFoundError,)  # s3fs raises it for a missing key and for a missing bucket
_TRANSIENT_WORDS = (
    "503", "500", "502", "504", "slowdown", "slow down", "service unavailable", "internalerror",
    "requesttimeout", "throttl", "reduce your request rate", "connection reset", "timed out",
    "timeout", "server disconnected", "broken pipe", "connection aborted", "payload",
    "internal error", "connection was closed",
    # The store's own check of a body damaged on the way (Content-MD5, x-amz-content-sha256 or
    # a flexible checksum): the bytes we hold are right, so sending them again is the fix.
    "baddigest", "did not match what we received", "sha256mismatch", "xamzcontentsha256mismatch",
    "checksum you specified did not match",
)
# s3fs turns HTTP 503/SlowDown into OSError(EBUSY) and 500/InternalError into OSError(EREMOTEIO).
_TRANSIENT_ERRNOS = (
    errno.ECONNRESET, errno.ETIMEDOUT, errno.EPIPE, errno.EIO, errno.EBUSY,
    getattr(errno, "EREMOTEIO", errno.EIO), errno.ECONNREFUSED, errno.ECONNABORTED,
)
_TRANSIENT_CLASS_NAMES = frozenset({
    "HTTPClientError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "IncompleteReadError", "ResponseStreamingError", "ClientConnectionError", "ClientPayloadError",
    "ServerTimeoutError", "IncompleteRead",
})


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: timeouts, resets, 5xx and throttling, short reads."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, (ShortReadError, UnconfirmedWriteError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    # botocore's and aiohttp's connection errors do not derive from the builtin ConnectionError.
    if any(cls.__name__ in _TRANSIENT_CLASS_NAMES for cls in type(exc).__mro__):
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in _TRANSIENT_WORDS)


def _timed_out(exc: BaseException) -> bool:
    """True when a try ended by a timeout (so the next one may well take as long)."""
    if isinstance(exc, TimeoutError) or (isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT):
        return True
    return "timeout" in type(exc).__name__.lower() or "timed out" in str(exc).lower()


def with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy,
    secrets: tuple[str, ...] = (),
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `fn`, retrying transient errors within the policy's attempts and deadline; then raise
    StorageError naming `what`, the attempts and the seconds spent."""
    began = time.monotonic()
    for attempt in range(1, policy.max_attempts + 1):
        tried = time.monotonic()
        try:
            return fn()
        except _PERMANENT as exc:
            error = StorageNotFoundError if isinstance(exc, _NOT_FOUND) else StorageError
            raise error(
                f"{redact(what, secrets)}: {type(exc).__name__}: {redact(str(exc), secrets)}; "
                "check that the path exists and that the credentials may read it"
            ) from safe_cause(exc, secrets)
        except Exception as exc:  # noqa: BLE001 - classified right below
            if not is_transient(exc):
                raise StorageError(
                    f"{redact(what, secrets)}: {type(exc).__name__}: {redact(str(exc), secrets)}"
                ) from safe_cause(exc, secrets)
            delay = policy.delay_s(attempt)
            now = time.monotonic()
            out_of_time = policy.deadline_s is not None and (
                now - began + delay + (now - tried if _timed_out(exc) else 0.0) > policy.deadline_s
            )
            if attempt == policy.max_attempts or out_of_time:
                budget = "" if policy.deadline_s is None else f" (budget {policy.deadline_s:g} s)"
                raise StorageError(
                    f"{redact(what, secrets)}: gave up after {attempt} attempts in {now - began:.1f} s"
                    f"{budget}; last error {type(exc).__name__}: {redact(str(exc), secrets)}"
                ) from safe_cause(exc, secrets)
            sleep(delay)
    raise AssertionError("unreachable")


class RedactedError(Exception):
    """Stands in as the cause of a StorageError whose real cause's text held a credential."""


def safe_cause(exc: BaseException, secrets: tuple[str, ...]) -> BaseException:
    """`exc` itself, or a stand-in with its redacted text when a traceback would show a credential."""
    if not chain_needs_redacting(exc, secrets):
        return exc
    stand_in = RedactedError(f"{type(exc).__name__}: {redact(str(exc), secrets)}")
    stand_in.__suppress_context__ = True
    return stand_in
