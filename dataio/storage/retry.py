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
from typing import Any, TypeVar

from dataio.errors import StorageError, StorageNotFoundError
from dataio.storage.redact import chain_needs_redacting, redact

T = TypeVar("T")

# How long one call (a read, an upload with its confirmation) may retry transient errors in all.
DEFAULT_DEADLINE_S = 120.0


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter for transient storage errors, until a time budget is spent.

    deadline_s bounds one call's tries as a whole, however many that takes: a try starts while the
    time spent and (after a timeout) another try as long as the last fit in it; the backoff before
    it is shortened to fit. The first request of a command or loader runs under
    FIRST_REQUEST_DEADLINE_S (Store.first_request), so a stuck endpoint fails it within 30 s.
    max_attempts optionally caps the count too; max_unreachable_attempts caps the tries that found
    no server at all (connection refused, unknown host). None: the budget alone decides.
    """

    deadline_s: float | None = DEFAULT_DEADLINE_S
    max_attempts: int | None = None
    max_unreachable_attempts: int | None = None
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_attempts", "max_unreachable_attempts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None: no cap)")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("need 0 <= base_delay_s <= max_delay_s")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError("deadline_s must be positive (or None: no budget)")
        if self.deadline_s is None and self.max_attempts is None:
            raise ValueError("give deadline_s or max_attempts: retries must end")

    def delay_s(self, attempt: int) -> float:
        """Seconds to sleep before try number `attempt + 1` (attempt counts from 1): full jitter."""
        return random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** min(attempt - 1, 60)))

    def ends_at(self, began: float) -> float | None:
        """The monotonic time by which a call begun at `began` stops retrying (None: no budget)."""
        return None if self.deadline_s is None else began + self.deadline_s


# How long the first request to a store (the shardify reachability check, the loader's manifest
# read) may take, all tries together: a wrong or stuck endpoint is reported this quickly.
FIRST_REQUEST_DEADLINE_S = 30.0
# Tries of a first request that found no server (refused, unknown host): a wrong --endpoint-url
# is reported in about a second, not after the budget; later calls wait for a restarting server.
FIRST_REQUEST_UNREACHABLE_ATTEMPTS = 3


class ShortReadError(OSError):
    """Fewer bytes arrived than the index or manifest promised; transient until proven otherwise."""


class TruncatedFileError(OSError):
    """A local file is shorter than the index or manifest promised: no later try reads more of it."""


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
    # 409s that ask for another try: a conflicting operation (or conditional write) in progress.
    "operationaborted", "conditionalrequestconflict",
)
# s3fs turns HTTP 503/SlowDown into OSError(EBUSY), 500/InternalError into OSError(EREMOTEIO), and
# an error code it does not know into OSError(EIO): a 4xx among those is told apart by _refused.
_TRANSIENT_ERRNOS = (
    errno.ECONNRESET, errno.ETIMEDOUT, errno.EPIPE, errno.EIO, errno.EBUSY,
    getattr(errno, "EREMOTEIO", errno.EIO), errno.ECONNREFUSED, errno.ECONNABORTED,
)
_TRANSIENT_CLASS_NAMES = frozenset({
    "HTTPClientError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "IncompleteReadError", "ResponseStreamingError", "ClientConnectionError", "ClientPayloadError",
    "ServerTimeoutError", "IncompleteRead",
})
# HTTP 4xx answers worth another try: a request timeout, too many requests.
_TRANSIENT_4XX = (408, 429)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: timeouts, resets, 5xx and throttling, short reads."""
    if isinstance(exc, (StorageError, TruncatedFileError, *_PERMANENT)):
        return False  # a StorageError is what an inner call's own retries ended with
    if isinstance(exc, (ShortReadError, UnconfirmedWriteError, ConnectionError, TimeoutError)):
        return True
    text = f"{type(exc).__name__} {exc} {_error_code(exc)}".lower()
    if _refused(exc) and not any(word in text for word in _TRANSIENT_WORDS):
        return False  # the store said no (a 4xx), e.g. an error code s3fs maps to EIO
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    status = _status(exc)
    if status is not None and (status >= 500 or status in _TRANSIENT_4XX):
        return True  # gcsfs and Azure say 503 in a status, not always in the text
    # botocore's and aiohttp's connection errors do not derive from the builtin ConnectionError.
    if any(cls.__name__ in _TRANSIENT_CLASS_NAMES for cls in type(exc).__mro__):
        return True
    return any(word in text for word in _TRANSIENT_WORDS)


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its causes (s3fs raises a translated error from botocore's), at most 5 deep."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < 5 and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _response(exc: BaseException) -> dict[str, Any]:
    """The HTTP answer a botocore ClientError in `exc`'s chain carries; {} when none does."""
    for e in _chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            return response
    return {}


def _error_code(exc: BaseException) -> str:
    return str(_response(exc).get("Error", {}).get("Code", ""))


def _status(exc: BaseException) -> int | None:
    """The HTTP status the store answered with: botocore's response, gcsfs's HttpError.code, Azure's
    HttpResponseError.status_code; None when no answer is known."""
    status = _response(exc).get("ResponseMetadata", {}).get("HTTPStatusCode")
    for e in _chain(exc):
        if isinstance(status, int):
            break
        status = getattr(e, "status_code", None) if type(e).__name__ != "HttpError" else getattr(e, "code", None)
    return status if isinstance(status, int) else None


def _refused(exc: BaseException) -> bool:
    """True when the store answered with a 4xx status other than 408 and 429."""
    status = _status(exc)
    return isinstance(status, int) and 400 <= status < 500 and status not in _TRANSIENT_4XX


def _unreachable(exc: BaseException) -> bool:
    """True when no server was found at all: the connection refused, or the host name unknown."""
    for e in _chain(exc):
        if isinstance(e, ConnectionRefusedError) or type(e).__name__ in ("EndpointConnectionError", "gaierror"):
            return True
        if isinstance(e, OSError) and e.errno == errno.ECONNREFUSED:
            return True
    return False


def _timed_out(exc: BaseException) -> bool:
    """True when a try ended by a timeout (so the next one may well take as long)."""
    if isinstance(exc, TimeoutError) or (isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT):
        return True
    return "timeout" in type(exc).__name__.lower() or "timed out" in str(exc).lower()


def _backoff_s(policy: RetryPolicy, exc: BaseException, counts: tuple[int, int], tried: float,
               ends_at: float | None) -> float | None:
    """Seconds to wait before the next try; None when the budget (or a cap) is spent.
    counts: (tries so far, of them unreachable); tried: when the last one started."""
    attempt, unreachable = counts
    if policy.max_attempts is not None and attempt >= policy.max_attempts:
        return None
    if policy.max_unreachable_attempts is not None and unreachable >= policy.max_unreachable_attempts:
        return None
    delay = policy.delay_s(attempt)
    if ends_at is None:
        return delay
    now = time.monotonic()
    # After a timeout the next try may well take as long again: it must fit in the budget too.
    left = ends_at - now - (now - tried if _timed_out(exc) else 0.0)
    return None if left <= 0 else min(delay, left)


def with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy,
    secrets: tuple[str, ...] = (),
    sleep: Callable[[float], None] = time.sleep,
    ends_at: float | None = None,
) -> T:
    """Call `fn`, retrying transient errors with backoff until the policy's budget is spent (or, given,
    until the monotonic time `ends_at`: what every hedged copy of one call shares); then raise
    StorageError naming `what`, the attempts and the seconds spent. A StorageError from `fn` (an
    inner call that spent the same budget) passes through unchanged."""
    began = time.monotonic()
    ends_at = policy.ends_at(began) if ends_at is None else ends_at
    attempt = unreachable = 0
    while True:
        attempt += 1
        tried = time.monotonic()
        try:
            return fn()
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified right below
            if not is_transient(exc):
                raise _refusal(exc, what, secrets) from safe_cause(exc, secrets)
            unreachable += _unreachable(exc)
            wait_s = _backoff_s(policy, exc, (attempt, unreachable), tried, ends_at)
            if wait_s is None:
                budget = "" if policy.deadline_s is None else f" (budget {policy.deadline_s:g} s)"
                raise StorageError(
                    f"{redact(what, secrets)}: gave up after {attempt} attempts in {time.monotonic() - began:.1f} s"
                    f"{budget}; last error {type(exc).__name__}: {redact(str(exc), secrets)}"
                ) from safe_cause(exc, secrets)
            sleep(wait_s)


def _refusal(exc: BaseException, what: str, secrets: tuple[str, ...]) -> StorageError:
    """The StorageError for an error not worth another try (a missing path: StorageNotFoundError)."""
    text = f"{redact(what, secrets)}: {type(exc).__name__}: {redact(str(exc), secrets)}"
    if isinstance(exc, _PERMANENT):
        error = StorageNotFoundError if isinstance(exc, _NOT_FOUND) else StorageError
        return error(f"{text}; check that the path exists and that the credentials may read it")
    return StorageError(text)


class RedactedError(Exception):
    """Stands in as the cause of a StorageError whose real cause's text held a credential."""


def safe_cause(exc: BaseException, secrets: tuple[str, ...]) -> BaseException:
    """`exc` itself, or a stand-in with its redacted text when a traceback would show a credential."""
    if not chain_needs_redacting(exc, secrets):
        return exc
    stand_in = RedactedError(f"{type(exc).__name__}: {redact(str(exc), secrets)}")
    stand_in.__suppress_context__ = True
    return stand_in
