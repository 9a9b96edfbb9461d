"""S3 ranged reads straight into a caller's buffer: a span cut into parts read in parallel, each part's
body received by recv_into at its place in the buffer (no `bytes` object, no copy), each retried and
hedged on its own, all under one retry budget.

Why: the RAW path's windows came as one GET per shard piece, the body read into a `bytes` (urllib3
parses it in 16 KiB reads, then joins them) and copied into the window buffer: ~3 passes over every
byte under the GIL, and one connection per piece. Here http.client's own readinto fills the buffer
from the socket (urllib3's readinto reads into a temporary and copies), and a piece of 64 MB comes as
parts on several connections (the CRT client's scheme); how many at once, over all of the process's
reads, is tune.py's to measure (each body in flight costs CPU), and a thread wakes per RCVLOWAT_BYTES.

A part's first request writes into the caller's memory; a hedge (a second request for a straggler)
writes into its own, and if a hedge wins, the first is stopped (its socket shut, so a stalled
recv returns) before the hedge's bytes are copied in: no request writes into the buffer after
read_into returns, which is what lets the caller reuse it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from dataio.errors import StorageError
from dataio.storage import presigned, threads, tune
from dataio.storage.hedge import Hedger
from dataio.storage.presigned import pool as _pool
from dataio.storage.options import StorageOptions
from dataio.storage.retry import RetryPolicy, ShortReadError, with_retry

THREAD_NAME_PREFIX = "dataio-s3-parts"
CHUNK_BYTES = 4 << 20  # one recv_into at most this: a stopped request notices between them
# A receiving thread is woken once this much of a body has arrived (SO_RCVLOWAT), not per packet (0: off).
RCVLOWAT_BYTES = 256 << 10
STOP_WAIT_S = 5.0  # a stopped request's recv returns at once (its socket shut); this only bounds a bug


class Superseded(Exception):
    """A part's first request, stopped because a hedge of it won or another part failed (never retried)."""


class _Guard:
    """Who may write into one part's place in the caller's buffer, and until when.

    The first request to claim the part writes in place; later ones (hedges) get memory of their own.
    stop() makes sure the one writing in place has stopped: no write lands after it returns."""

    def __init__(self, dest: memoryview, cancel: threading.Event) -> None:
        self.dest, self.cancel = dest, cancel
        self.cond = threading.Condition()
        self.claimed = self.stopped = False
        self.writing: Any = None  # the urllib3 response whose body is being received in place

    def claim(self) -> tuple[memoryview, bool]:
        """Where this request writes, and whether that is the caller's buffer."""
        with self.cond:
            if self.claimed:
                return memoryview(bytearray(len(self.dest))), False
            self.claimed = True
            return self.dest, True

    def begin(self, raw: Any) -> None:
        with self.cond:
            if self.stopped or self.cancel.is_set():
                raise Superseded("stopped before its body was read")
            self.writing = raw

    def end(self) -> None:
        with self.cond:
            self.writing = None
            self.cond.notify_all()

    def halted(self) -> bool:
        return self.stopped or self.cancel.is_set()

    def stop(self) -> None:
        """Stop the request writing in place (shut its socket) and wait until it has stopped writing."""
        with self.cond:
            self.stopped = True
            if self.writing is not None:
                _shut(self.writing)
            self.cond.wait_for(lambda: self.writing is None, timeout=STOP_WAIT_S)
            assert self.writing is None, "a stopped request is still writing into the caller's buffer"


def _shut(raw: Any) -> None:
    """Shut the socket under a urllib3 response: a recv blocked on it returns now. socket.shutdown of the
    plain class (an SSLSocket's own shutdown would drop its SSL object under the reading thread)."""
    sock = _socket_of(raw)
    if sock is not None:
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass  # closed already


def _socket_of(raw: Any) -> Any:
    """The socket under a urllib3 response (plain or TLS; None where it cannot be found)."""
    sock = getattr(getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None), "_sock", None)
    if sock is None:  # http.client's response reads through its own file of the socket; else the pool's connection
        sock = getattr(getattr(raw, "_connection", None), "sock", None)
    return sock


class HttpStatusError(OSError):
    """An S3 answer other than 206 to a ranged GET (judged by retry.is_transient from its status_code)."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def get_bytes(options: StorageOptions, path: str, start: int | None, end: int | None) -> tuple[bytes, int | None]:
    """(bytes [start, end) of the object at `path` ("bucket/key"), the whole object when both are None; the
    object's whole size from the answer's Content-Range (or Content-Length), None where it gives none).
    Errors as s3fs raises them: FileNotFoundError, PermissionError, ShortReadError past the end."""
    ranged = not (start is None and end is None)
    first = start or 0
    raw = _get(options, path, {"Range": f"bytes={first}-{'' if end is None else end - 1}"} if ranged else {})
    if raw.status != (206 if ranged else 200):
        raise _status_error(raw, path, first, end)
    try:
        with _broken_is_transient():
            data = raw.read()
    except BaseException:
        raw.close()
        raise
    raw.release_conn()
    if ranged:
        return data, total_of(raw.headers.get("Content-Range"))
    length = raw.headers.get("Content-Length")
    return data, int(length) if length and length.isdigit() else None


def get_listing(options: StorageOptions, bucket: str, query: str) -> bytes:
    """The body of a GET of `bucket` with `query` (a ListObjectsV2 page); errors as get_bytes raises them."""
    with _broken_is_transient():
        raw = _pool(options).request("GET", presigned.sign_url(options, bucket, query), preload_content=False,
                                     decode_content=True, redirect=False, retries=False)
        if raw.status != 200:
            raise _status_error(raw, bucket, 0, None)
        try:
            return bytes(raw.read())
        finally:
            raw.release_conn()


def _get(options: StorageOptions, path: str, headers: dict[str, str]) -> Any:
    """urllib3's answer to a GET of the object's presigned URL, its body not read; a 403 to a URL signed a while
    ago (its credentials may have rotated) is asked again with a new one."""
    url, fresh = presigned.url(options, path)
    with _broken_is_transient():
        raw = _pool(options).request("GET", url, headers=headers, preload_content=False, decode_content=False,
                                     redirect=False, retries=False)
        if raw.status == 403 and not fresh:
            _done_with(raw)
            presigned.forget(options, path)
            url, _ = presigned.url(options, path)
            raw = _pool(options).request("GET", url, headers=headers, preload_content=False, decode_content=False,
                                         redirect=False, retries=False)
    return raw


@contextlib.contextmanager
def _broken_is_transient() -> Iterator[None]:
    """urllib3's ProtocolError (a connection reset or cut short mid-answer: "Connection broken:
    IncompleteRead(...)") raised as the ConnectionError it is, which RetryPolicy retries."""
    from urllib3.exceptions import ProtocolError

    try:
        yield
    except ProtocolError as exc:
        raise ConnectionError(f"connection broken: {exc}") from exc


def total_of(content_range: str | None) -> int | None:
    """The whole object's size from a Content-Range answer ("bytes 0-99/1234"); None if not stated."""
    total = (content_range or "").rpartition("/")[2].strip()
    return int(total) if total.isdigit() else None


def get_into(options: StorageOptions, path: str, start: int, end: int, dest: memoryview,
             guard: _Guard | None = None) -> int | None:
    """One GET of bytes [start, end) of `path` ("bucket/key"), its body received into dest[: end - start];
    the object's whole size from Content-Range. Errors as get_bytes raises them."""
    raw = _get(options, path, {"Range": f"bytes={start}-{end - 1}"})
    if raw.status != 206:
        raise _status_error(raw, path, start, end)
    answered = str(raw.headers.get("Content-Range") or "")
    if not answered.startswith(f"bytes {start}-{end - 1}/"):  # a server that cut the Range
        raw.close()
        raise ShortReadError(f"asked for bytes {start}-{end - 1}, answered {answered or 'no Content-Range'}")
    got = _receive(raw, dest[: end - start], guard)
    if got != end - start:
        raw.close()
        raise ShortReadError(f"got {got} bytes, expected {end - start}")
    raw.release_conn()
    return total_of(answered)


def _status_error(raw: Any, path: str, start: int, end: int | None) -> Exception:
    """What an unexpected answer means, as s3fs would raise it (the body's error code named)."""
    status = raw.status
    if status in (200, 206):  # the server ignored the Range (or answered a whole read with a part)
        raw.close()
        return ShortReadError(f"asked for bytes {start}-{'' if end is None else end - 1}, answered HTTP {status}")
    body = raw.read(64 << 10)
    _done_with(raw)
    code = _xml_code(body)
    if status == 404:
        return FileNotFoundError(path)
    if status == 403:
        return PermissionError(f"{path}: {code or status}")
    if status == 416:  # the object is shorter than the index says
        return ShortReadError(f"the object ends before byte {start}")
    return HttpStatusError(f"{path}: HTTP {status} {code}".rstrip(), status)


def _done_with(raw: Any) -> None:
    """The rest of an error answer read and its connection pooled again (closed if that fails)."""
    try:
        raw.drain_conn()
        raw.release_conn()
    except Exception:  # noqa: BLE001 - the connection is closed instead
        raw.close()


def _xml_code(body: bytes) -> str:
    """The <Code> of an S3 error body ('' when none)."""
    text = body.decode("utf-8", "replace")
    a = text.find("<Code>")
    b = text.find("</Code>", a)
    return text[a + 6: b] if a >= 0 and b > a else ""


def _receive(raw: Any, dest: memoryview, guard: _Guard | None) -> int:
    """Receive the body into `dest` (socket to buffer: http.client's readinto; urllib3's would copy). On plain
    TCP all but its last RCVLOWAT_BYTES with the socket's low-water mark at RCVLOWAT_BYTES (see _low_water)."""
    fp = getattr(raw, "_fp", None)
    read = fp.readinto if fp is not None and hasattr(fp, "readinto") else raw.readinto
    want = len(dest)
    sock = _plain_socket(raw) if RCVLOWAT_BYTES and want > 2 * RCVLOWAT_BYTES else None
    if guard is not None:
        guard.begin(raw)
    try:
        got = 0
        if sock is not None:
            with _low_water(sock):
                got = _fill(read, dest, 0, want - RCVLOWAT_BYTES, guard)
        return _fill(read, dest, got, want, guard)
    except BaseException:
        raw.close()
        raise
    finally:
        if guard is not None:
            guard.end()


def _fill(read: Callable[[memoryview], int], dest: memoryview, got: int, upto: int, guard: _Guard | None) -> int:
    """dest[got: upto] filled by `read` in chunks of at most CHUNK_BYTES; the count filled up to (short: the body ended)."""
    while got < upto:
        if guard is not None and guard.halted():
            raise Superseded("stopped while its body was read")
        with _broken_is_transient():
            n = read(dest[got: min(upto, got + CHUNK_BYTES)])
        if not n:
            break
        got += n
    return got


def _plain_socket(raw: Any) -> socket.socket | None:
    """The plain TCP socket under a urllib3 response (None for TLS, or where it cannot be found)."""
    sock = _socket_of(raw)
    plain = type(sock) is socket.socket and sock.family in (socket.AF_INET, socket.AF_INET6)
    return sock if plain and hasattr(socket, "SO_RCVLOWAT") else None


@contextlib.contextmanager
def _low_water(sock: socket.socket) -> Iterator[None]:
    """The socket's SO_RCVLOWAT at RCVLOWAT_BYTES inside, 1 (the default) after: the receiving thread is woken
    (and its recv returns) once that much has arrived, not for every packet: on loopback at 2 busy cores
    each wake-up is a poll, a recv and the GIL taken back. Only while at least that much of the body is
    still to come (the caller's part): a recv must never wait for bytes the server will not send, and
    the next answer's headers on the kept connection are read with the mark at 1 again."""
    marked = False
    with contextlib.suppress(OSError):  # shut already (stopped), or a platform without it: read as before
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RCVLOWAT_BYTES)
        marked = True
    try:
        yield
    finally:
        if marked:
            with contextlib.suppress(OSError):  # shut or closed meanwhile: the connection is not reused
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


def part_spans(start: int, end: int, part_bytes: int) -> list[tuple[int, int]]:
    """[start, end) as parts of about part_bytes (equal, the last one shorter by less than the count)."""
    num = max(1, round((end - start) / part_bytes))
    size = -(-(end - start) // num)
    return [(a, min(end, a + size)) for a in range(start, end, size)]


def read_into(options: StorageOptions, path: str, start: int, end: int, dest: memoryview, *, what: str,
              retry: RetryPolicy, secrets: tuple[str, ...], hedger: Hedger | None) -> list[int | None]:
    """Bytes [start, end) of `path` into dest[: end - start] in parallel parts of options.part_bytes, up to
    options.parts_in_flight at once (with adapt_parts: as many as tune.py measures worth it, counted over all
    of this process's reads of the endpoint; this thread reads too); each part retried (one budget for all
    of them and their hedges; its deadline from when it starts) and hedged; the whole sizes the answers
    stated. The first error is raised once every part has stopped writing."""
    tuner = tune.tuner_for(options) if options.adapt_parts else None
    cut = tuner.plan() if tuner is not None else tune.PartPlan(part_bytes=options.part_bytes,
                                                                in_flight=options.parts_in_flight)
    parts = part_spans(start, end, cut.part_bytes)
    cancel = threading.Event()
    totals: list[int | None] = [None] * len(parts)
    errors: list[BaseException] = []
    taken = iter(range(len(parts)))
    lock = threading.Lock()

    def worker() -> None:
        while not cancel.is_set():
            with lock:
                i = next(taken, None)
            if i is None:
                return
            a, b = parts[i]
            with tuner.slot(cancel) if tuner is not None else contextlib.nullcontext(True) as holding:
                if not holding:
                    return  # another part failed while this one waited for its turn
                began = time.monotonic()
                try:
                    totals[i] = _part(options, path, a, b, dest[a - start: b - start], cancel,
                                      what=f"{what} bytes {a}-{b}", retry=retry, secrets=secrets, hedger=hedger,
                                      ends_at=retry.ends_at(began))
                    if tuner is not None:
                        tuner.finished(b - a, time.monotonic() - began)
                except BaseException as exc:  # noqa: BLE001 - raised by the caller once all have stopped
                    if tuner is not None and not isinstance(exc, Superseded):
                        tuner.failed()
                    with lock:
                        errors.append(exc)
                    cancel.set()

    _in_parallel(worker, min(cut.in_flight, len(parts)) - 1)
    if errors:
        raise next((e for e in errors if not isinstance(e, Superseded)), errors[0])
    return totals


def _in_parallel(worker: Callable[[], None], helpers: int) -> None:
    """worker() in this thread and in `helpers` threads of the process's part pool (kept between reads); returns
    once every one that started has returned (one that had not started by then is cancelled: no parts were left)."""
    pool, started = threads.pool(THREAD_NAME_PREFIX), []
    for _ in range(max(0, helpers)):
        try:
            started.append(pool.submit(worker))
        except RuntimeError:  # no thread to be had now: fewer helpers, this thread reads the rest
            break
    try:
        worker()
    finally:
        for future in started:
            if not future.cancel():
                future.result()  # worker() raises nothing: errors are collected


def _part(options: StorageOptions, path: str, start: int, end: int, dest: memoryview, cancel: threading.Event,
          *, what: str, retry: RetryPolicy, secrets: tuple[str, ...], hedger: Hedger | None,
          ends_at: float | None) -> int | None:
    """One part, retried and (with a hedger) hedged; the caller's memory written by one request only."""
    guard = _Guard(dest, cancel)

    def attempt() -> tuple[memoryview, bool, int | None]:
        target, in_place = guard.claim()
        try:
            return target, in_place, with_retry(
                lambda: _try(options, path, start, end, target, guard if in_place else None, cancel),
                what=what, policy=retry, secrets=secrets, ends_at=ends_at)
        except StorageError:
            if guard.halted():  # stopped on purpose (with_retry reports a Superseded as a refusal)
                raise Superseded(what) from None
            raise

    if hedger is None:
        _, _, total = attempt()
        return total
    target, in_place, total = hedger.call(attempt, end - start)
    if not in_place:  # a hedge won: the first request stops before its bytes are copied in
        guard.stop()
        dest[:] = target
    return total


def _try(options: StorageOptions, path: str, start: int, end: int, dest: memoryview, guard: _Guard | None,
         cancel: threading.Event) -> int | None:
    if cancel.is_set():
        raise Superseded("another part of the read failed")
    return get_into(options, path, start, end, dest, guard)

