"""An HTTP/1.1 reverse proxy on 127.0.0.1 that adds latency and injects faults in front of S3.

Requests pass through byte for byte (the Host header included, so SigV4 signatures made for
the proxy's address still verify upstream). Each request waits `delay_s`; a seeded fraction
can be answered 503 SlowDown, have its response body cut short, its connection reset, or never
be answered (hang) — what a loader's retry logic must survive — and, on its own seeded stream,
be stalled for stall_s and then served (a straggler, what hedged reads must absorb), or have one
byte of its body flipped on the way up (what a write's checksum must catch); `error_first` answers
the first N requests 503 (a throttled burst: what a retry budget must outlast). `methods`
picks which requests the faults hit (e.g. only PUT, to fail writes). Stdlib asyncio only, one background thread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_HEAD_LIMIT = 1 << 20
_CHUNK = 1 << 16
_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate. (injected by tools.delay_proxy)</Message></Error>"
)
# The answers `error_status` can pick: (status line, body). 503 is transient; 403 a refusal no retry fixes.
_ERRORS = {
    503: (b"503 Service Unavailable", _SLOWDOWN),
    403: (b"403 Forbidden", b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
                            b"<Message>Access Denied (injected by tools.delay_proxy)</Message></Error>"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Faults:
    """What the proxy does to each request; rates are probabilities per request in [0, 1]."""

    delay_s: float = 0.05
    error_rate: float = 0.0  # answered 503 SlowDown (or error_status) without reaching upstream
    error_status: int = 503  # 503 SlowDown, or 403 AccessDenied: a store that refuses
    truncate_rate: float = 0.0  # response body cut in half, then the connection closed
    reset_rate: float = 0.0  # connection reset (RST) instead of an answer
    hang_rate: float = 0.0  # request read, never forwarded, never answered (a stuck endpoint)
    corrupt_rate: float = 0.0  # one byte of the request body flipped on its way up (bad memory, a bad NIC)
    stall_rate: float = 0.0  # request held stall_s, then served normally (a straggler), apart from the rest
    stall_s: float = 2.0
    error_first: int = 0  # the first N requests (of `methods`) answered 503 SlowDown, before the rates apply
    methods: tuple[str, ...] = ("GET",)  # which methods the three faults apply to
    seed: int = 0

    def __post_init__(self) -> None:
        if self.delay_s < 0:
            raise ValueError("delay_s must be >= 0")
        if self.error_first < 0:
            raise ValueError("error_first must be >= 0")
        if self.error_status not in _ERRORS:
            raise ValueError(f"error_status must be one of {sorted(_ERRORS)}")
        if self.stall_s < 0:
            raise ValueError("stall_s must be >= 0")
        for name in ("error_rate", "truncate_rate", "reset_rate", "hang_rate", "stall_rate", "corrupt_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")
        if self.error_rate + self.truncate_rate + self.reset_rate + self.hang_rate > 1.0:
            raise ValueError("error_rate + truncate_rate + reset_rate + hang_rate must be at most 1")


@dataclass(slots=True)
class ProxyStats:
    """Counters of what the proxy did, for tests and the CLI."""

    num_requests: int = 0
    requests: list[str] = field(default_factory=list)  # each request's line ("GET /bucket/key HTTP/1.1"), in order
    num_errors: int = 0
    num_truncated: int = 0
    num_resets: int = 0
    num_hangs: int = 0
    num_stalls: int = 0
    num_corrupted: int = 0


class _Request:
    __slots__ = ("method", "head", "body", "close")

    def __init__(self, method: str, head: bytes, body: bytes, close: bool) -> None:
        self.method, self.head, self.body, self.close = method, head, body, close


def _headers(head: bytes) -> dict[str, str]:
    """Lower-cased header names to values (the last one wins; enough for framing decisions)."""
    out = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return out


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """The raw bytes of a chunked body, framing included, through the final empty chunk."""
    parts = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        parts.append(size_line)
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            while True:  # trailers, then the blank line
                line = await reader.readuntil(b"\r\n")
                parts.append(line)
                if line == b"\r\n":
                    return b"".join(parts)
        parts.append(await reader.readexactly(size + 2))


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    method = head.split(b" ", 1)[0].decode("latin-1")
    headers = _headers(head)
    if headers.get("expect", "").lower() == "100-continue":
        # Answer the interim response ourselves and drop the header (SigV4 never signs it).
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        lines = [ln for ln in head[:-4].split(b"\r\n") if not ln.lower().startswith(b"expect:")]
        head = b"\r\n".join(lines) + b"\r\n\r\n"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    close = headers.get("connection", "").lower() == "close"
    return _Request(method, head, body, close)


class DelayProxy:
    """Latency (and optional faults) in front of `upstream_url`; a context manager with `.url`."""

    def __init__(
        self,
        upstream_url: str,
        delay_s: float = 0.05,
        *,
        error_rate: float = 0.0,
        truncate_rate: float = 0.0,
        reset_rate: float = 0.0,
        hang_rate: float = 0.0,
        stall_rate: float = 0.0,
        stall_s: float = 2.0,
        corrupt_rate: float = 0.0,
        error_first: int = 0,
        error_status: int = 503,
        methods: tuple[str, ...] = ("GET",),
        seed: int = 0,
        port: int = 0,
    ) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, got {upstream_url!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.faults = Faults(delay_s=delay_s, error_rate=error_rate, truncate_rate=truncate_rate,
                             reset_rate=reset_rate, hang_rate=hang_rate, stall_rate=stall_rate, stall_s=stall_s,
                             corrupt_rate=corrupt_rate, error_first=error_first, error_status=error_status,
                             methods=tuple(m.upper() for m in methods), seed=seed)
        self._errors_first = error_first  # how many of the first requests are still to be answered 503
        self.stats = ProxyStats()
        self._rng = random.Random(seed)
        self._stall_rng = random.Random(seed + 1)  # its own stream: stalls do not shift the other faults
        self._corrupt_rng = random.Random(seed + 2)  # and corruption its own
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    def start(self) -> DelayProxy:
        """Listen on 127.0.0.1 (port 0: a free one) in a background thread."""
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._server = self._loop.run_until_complete(
                    asyncio.start_server(self._serve, "127.0.0.1", self._port, limit=_HEAD_LIMIT))
            except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="delay-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            self._loop.close()
            raise failure[0]
        assert self._server is not None
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def stop(self) -> None:
        """Close the listener and every open connection, then join the thread."""
        if self._thread is None or self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._thread = self._loop = self._server = None

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _pick_stall(self, method: str) -> bool:
        f = self.faults
        return bool(f.stall_rate) and method in f.methods and self._stall_rng.random() < f.stall_rate

    def _pick_corrupt(self, request: _Request) -> bool:
        f = self.faults
        return (bool(f.corrupt_rate) and request.method in f.methods and len(request.body) > 0
                and self._corrupt_rng.random() < f.corrupt_rate)

    def _pick_fault(self, method: str) -> str:
        f = self.faults
        if method in f.methods and self._errors_first > 0:
            self._errors_first -= 1  # before the seeded stream: the rates' faults stay where they were
            return "error"
        if method not in f.methods or not (f.error_rate or f.truncate_rate or f.reset_rate or f.hang_rate):
            return ""
        x = self._rng.random()
        for name, rate in (("error", f.error_rate), ("truncate", f.truncate_rate), ("reset", f.reset_rate),
                           ("hang", f.hang_rate)):
            if x < rate:
                return name
            x -= rate
        return ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                request = await _read_request(reader, writer)
                if request is None:
                    return
                self.stats.num_requests += 1
                self.stats.requests.append(request.head.split(b"\r\n", 1)[0].decode("latin-1"))
                fault = self._pick_fault(request.method)
                if self.faults.delay_s:
                    await asyncio.sleep(self.faults.delay_s)
                if self._pick_stall(request.method):
                    self.stats.num_stalls += 1
                    await asyncio.sleep(self.faults.stall_s)
                if fault == "hang":
                    self.stats.num_hangs += 1
                    await asyncio.sleep(3600)  # until the client gives up or the proxy stops
                    return
                if fault == "reset":
                    self.stats.num_resets += 1
                    _reset(writer)
                    return
                if fault == "error":
                    self.stats.num_errors += 1
                    status, body = _ERRORS[self.faults.error_status]
                    writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s"
                                 % (status, len(body), b"" if request.method == "HEAD" else body))  # HEAD: no body
                    await writer.drain()
                    continue
                if up is None:
                    up = await asyncio.open_connection(*self.upstream, limit=_HEAD_LIMIT)
                if self._pick_corrupt(request):
                    self.stats.num_corrupted += 1
                    request.body = _flip_middle_byte(request.body)
                up[1].write(request.head + request.body)
                await up[1].drain()
                keep = await self._relay_response(request, up[0], writer, truncate=fault == "truncate")
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            return  # a peer went away or spoke broken HTTP: drop this connection only
        except asyncio.CancelledError:
            return  # the proxy is stopping (a stalled or hung request included): end quietly
        finally:
            self._tasks.discard(task)
            for w in (writer, up[1] if up else None):
                if w is not None:
                    w.close()

    async def _relay_response(self, request: _Request, up: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              *, truncate: bool) -> bool:
        """Copy one response to the client; False when the connection must close afterwards."""
        head = await up.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        headers = _headers(head)
        close = request.close or headers.get("connection", "").lower() == "close"
        writer.write(head)
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            await writer.drain()
            return not close
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await _read_chunked(up)
            if truncate:
                self.stats.num_truncated += 1
                writer.write(body[: len(body) // 2])
                await writer.drain()
                return False
            writer.write(body)
        elif "content-length" in headers:
            remaining = int(headers["content-length"])
            stop_at = remaining - remaining // 2 if truncate else -1  # send floor(n/2) bytes
            while remaining > 0:
                piece = await up.readexactly(min(_CHUNK, remaining))
                remaining -= len(piece)
                if truncate and remaining <= stop_at:
                    self.stats.num_truncated += 1
                    writer.write(piece[: len(piece) - (stop_at - remaining)])
                    await writer.drain()
                    return False
                writer.write(piece)
                await writer.drain()
        else:
            writer.write(await up.read())  # body runs to EOF: the upstream closes
            close = True
        await writer.drain()
        return not close


def _flip_middle_byte(body: bytes) -> bytes:
    """The body with its middle byte inverted (same length: only a checksum can tell)."""
    i = len(body) // 2
    return body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1:]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN: what a dropped connection looks like to the client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def main(argv: list[str] | None = None) -> int:
    """Run a proxy until Ctrl-C, printing its URL and counters."""
    parser = argparse.ArgumentParser(prog="python -m tools.delay_proxy", description=__doc__)
    parser.add_argument("--upstream", required=True, help="upstream http:// URL, e.g. the S3 endpoint")
    parser.add_argument("--delay-ms", type=float, default=50.0, help="latency added to every request")
    parser.add_argument("--port", type=int, default=0, help="listen port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--error-rate", type=float, default=0.0, help="fraction of GETs answered 503 SlowDown")
    parser.add_argument("--truncate-rate", type=float, default=0.0, help="fraction of GET bodies cut short")
    parser.add_argument("--reset-rate", type=float, default=0.0, help="fraction of GETs whose connection is reset")
    parser.add_argument("--hang-rate", type=float, default=0.0, help="fraction of requests never answered")
    parser.add_argument("--stall-rate", type=float, default=0.0,
                        help="fraction of requests held --stall-ms, then served (stragglers)")
    parser.add_argument("--stall-ms", type=float, default=2000.0, help="how long a stalled request waits")
    parser.add_argument("--corrupt-rate", type=float, default=0.0,
                        help="fraction of request bodies (of --methods) with one byte flipped on the way up")
    parser.add_argument("--error-status", type=int, default=503, choices=sorted(_ERRORS),
                        help="the status injected errors get: 503 SlowDown (default) or 403 AccessDenied")
    parser.add_argument("--error-first", type=int, default=0,
                        help="answer the first N requests (of --methods) with the error, then apply the rates")
    parser.add_argument("--methods", default="GET", help="comma-separated methods the faults apply to, e.g. PUT")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    proxy = DelayProxy(args.upstream, args.delay_ms / 1000, error_rate=args.error_rate,
                       truncate_rate=args.truncate_rate, reset_rate=args.reset_rate, hang_rate=args.hang_rate,
                       stall_rate=args.stall_rate, stall_s=args.stall_ms / 1000, corrupt_rate=args.corrupt_rate,
                       error_first=args.error_first, error_status=args.error_status,
                       methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()), seed=args.seed,
                       port=args.port)
    with proxy:
        print(f"proxy {proxy.url} -> {args.upstream} (+{args.delay_ms:g} ms per request)")
        print(f"  export AWS_ENDPOINT_URL={proxy.url}", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    print(f"served {proxy.stats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
