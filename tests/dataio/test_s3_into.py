"""S3 reads received in place (storage/s3_into.py): a hedge that wins stops the first request before its
bytes are copied in, so nothing writes into the caller's buffer after read_into returns."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dataio.errors import StorageError
from dataio.storage import presigned, s3_into
from dataio.storage.hedge import HedgePolicy, Hedger
from dataio.storage.options import StorageOptions
from dataio.storage.retry import RetryPolicy, with_retry

pytestmark = pytest.mark.timeout(60)

BODY = bytes(range(256)) * 256  # 64 KiB


class _Ranges(BaseHTTPRequestHandler):
    """Answers every GET with the asked range of BODY; the request numbered `stall_at` sends half its
    body, then waits for `release` before the rest; `fail` requests answer 503."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        server = self.server
        with server.lock:  # type: ignore[attr-defined]
            number = server.count  # type: ignore[attr-defined]
            server.count += 1  # type: ignore[attr-defined]
        if number in server.fail:  # type: ignore[attr-defined]
            self.send_response(server.fail_status)  # type: ignore[attr-defined]
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        asked = self.headers.get("Range")
        a, b = (int(x) for x in asked.removeprefix("bytes=").split("-")) if asked else (0, len(BODY) - 1)
        data = BODY[a: b + 1]
        self.send_response(206 if asked else 200)
        if asked:
            self.send_header("Content-Range", f"bytes {a}-{b}/{len(BODY)}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if number in server.cut:  # type: ignore[attr-defined]
            self.wfile.write(data[: len(data) // 2])  # half the body, then the connection closes
            self.close_connection = True
            return
        try:
            if number == server.stall_at:  # type: ignore[attr-defined]
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                server.release.wait(30)  # type: ignore[attr-defined]
                data = data[len(data) // 2:]
            self.wfile.write(data)
        except OSError:
            pass  # the client shut this connection: what a stopped request does

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=["HTTP/1.0", "HTTP/1.1"])
def ranges_server(request) -> Iterator[ThreadingHTTPServer]:
    """The server, closing each connection after its answer (the response owns the socket) or keeping it."""
    handler = type("Ranges", (_Ranges,), {"protocol_version": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.lock, server.count, server.stall_at, server.fail = threading.Lock(), 0, -1, set()  # type: ignore[attr-defined]
    server.fail_status, server.cut = 503, set()  # type: ignore[attr-defined]
    server.release = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()
    thread.join()


def _options(server: ThreadingHTTPServer, **kw: object) -> StorageOptions:
    host, port = server.server_address[:2]
    return StorageOptions(endpoint_url=f"http://{host}:{port}", key="k", secret="s", region="us-east-1", **kw)


def test_a_hedge_that_wins_stops_the_first_request_mid_body(ranges_server) -> None:
    options = _options(ranges_server, part_bytes=1 << 20, parts_in_flight=1)
    hedger = Hedger(HedgePolicy(cold_ms=100, floor_ms=0, small_floor_ms=0, burst=5))
    fast = RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0)
    warm = bytearray(10)
    s3_into.read_into(options, "b/k", 0, 10, memoryview(warm), what="warm-up", retry=fast, secrets=(),
                      hedger=hedger)  # a finished read: the hedger's clock starts
    ranges_server.stall_at = 1  # the next request sends half its body, then stalls
    dest = bytearray(len(BODY))
    started = time.perf_counter()
    totals = s3_into.read_into(options, "b/k", 0, len(BODY), memoryview(dest), what="reading s3://b/k",
                               retry=fast, secrets=(), hedger=hedger)
    assert time.perf_counter() - started < 10  # the hedge answered, not the stalled request
    assert bytes(warm) == BODY[:10] and bytes(dest) == BODY and totals == [len(BODY)]
    assert hedger.stats.hedged == 1 and hedger.stats.won == 1
    dest[:] = bytes(len(dest))
    ranges_server.release.set()  # the stalled request's other half goes out now: nowhere to land
    time.sleep(0.3)
    assert bytes(dest) == bytes(len(dest))


def test_a_failing_part_stops_the_others_and_its_error_is_raised(ranges_server) -> None:
    options = _options(ranges_server, part_bytes=4096, parts_in_flight=4)
    ranges_server.fail = set(range(100))  # every request refused: parts stop once one has given up
    once = RetryPolicy(max_attempts=1, base_delay_s=0.0, max_delay_s=0.0)
    with pytest.raises(StorageError, match="reading s3://b/k bytes .*503|reading s3://b/k bytes .*SlowDown|gave up"):
        s3_into.read_into(options, "b/k", 0, len(BODY), memoryview(bytearray(len(BODY))), what="reading s3://b/k",
                          retry=once, secrets=(), hedger=None)
    assert ranges_server.count < len(s3_into.part_spans(0, len(BODY), 4096))  # not every part was asked for


def test_retried_parts_still_land_in_place(ranges_server) -> None:
    options = _options(ranges_server, part_bytes=4096, parts_in_flight=4)
    ranges_server.fail = {0, 2, 5}  # three requests answer 503: their parts are asked again
    retry = RetryPolicy(max_attempts=4, base_delay_s=0.0, max_delay_s=0.0)  # one part may draw all three
    dest = bytearray(len(BODY))
    s3_into.read_into(options, "b/k", 0, len(BODY), memoryview(dest), what="r", retry=retry, secrets=(), hedger=None)
    assert bytes(dest) == BODY
    assert ranges_server.count == len(s3_into.part_spans(0, len(BODY), 4096)) + 3


def test_bodies_come_in_with_a_low_water_mark_and_the_connection_is_read_at_one_after(ranges_server,
                                                                                       monkeypatch) -> None:
    """All but a body's last RCVLOWAT_BYTES are received with SO_RCVLOWAT set; the rest, and the next answer on the
    kept connection, at 1: a mark left up would make those recvs wait for bytes that never come (a timeout)."""
    monkeypatch.setattr(s3_into, "RCVLOWAT_BYTES", 8 << 10)
    marks: list[int] = []
    real = s3_into._low_water

    @contextlib.contextmanager
    def watched(sock: socket.socket) -> Iterator[None]:
        with real(sock):
            marks.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
            yield
        marks.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))

    monkeypatch.setattr(s3_into, "_low_water", watched)
    options = _options(ranges_server, part_bytes=1 << 20, read_timeout_s=2.0)
    once = RetryPolicy(max_attempts=1, base_delay_s=0.0, max_delay_s=0.0)
    for a, b in [(0, len(BODY)), (3, len(BODY) - 1), (100, 20_000), (0, 10_000)]:  # the last: too short for it
        dest = bytearray(b - a)
        s3_into.read_into(options, "b/k", a, b, memoryview(dest), what="r", retry=once, secrets=(), hedger=None)
        assert bytes(dest) == BODY[a:b]
    assert marks == [8 << 10, 1] * 3


def test_options_of_a_read_into_are_kept_through_replace() -> None:
    assert dataclasses.replace(StorageOptions(), part_bytes=5).part_bytes == 5


def test_a_403_to_an_old_url_signs_it_again_and_a_403_to_a_fresh_one_is_refused(ranges_server, monkeypatch) -> None:
    options = _options(ranges_server, part_bytes=1 << 20)
    once = RetryPolicy(max_attempts=1, base_delay_s=0.0, max_delay_s=0.0)
    ranges_server.fail, ranges_server.fail_status = {0, 1}, 403
    with pytest.raises(StorageError, match="403"):  # signed just now: the store's refusal, not retried
        s3_into.read_into(options, "b/k", 0, 100, memoryview(bytearray(100)), what="r", retry=once, secrets=(),
                          hedger=None)
    assert ranges_server.count == 1
    monkeypatch.setattr(presigned, "FRESH_S", 0.0)  # every URL counts as signed a while ago
    dest = bytearray(100)
    s3_into.read_into(options, "b/k", 0, 100, memoryview(dest), what="r", retry=once, secrets=(), hedger=None)
    assert bytes(dest) == BODY[:100] and ranges_server.count == 3  # 403 once more, then the new URL's answer


def test_urls_are_path_style_on_an_endpoint_and_virtual_hosted_on_aws() -> None:
    def parts(url: str) -> tuple[str, str, dict]:
        u = urllib.parse.urlsplit(url)
        return u.netloc, u.path, urllib.parse.parse_qs(u.query)

    host, path, query = parts(presigned.sign_url(StorageOptions(endpoint_url="http://127.0.0.1:9000/", key="AK",
                                                             secret="SK"), "bucket/a b/c~d"))
    assert (host, path) == ("127.0.0.1:9000", "/bucket/a%20b/c~d") and query["X-Amz-Credential"][0].startswith("AK/")
    assert "SK" not in str(query)
    host, path, _ = parts(presigned.sign_url(StorageOptions(region="eu-west-1", key="AK", secret="SK"), "my-bucket/k"))
    assert (host, path) == ("my-bucket.s3.eu-west-1.amazonaws.com", "/k")
    host, path, query = parts(presigned.sign_url(StorageOptions(anon=True, region="eu-west-1"), "Not_DNS/k"))
    assert (host, path, query) == ("s3.eu-west-1.amazonaws.com", "/Not_DNS/k", {})  # unsigned, path style


@pytest.mark.parametrize("whole", [True, False])
def test_a_body_cut_short_is_asked_again(ranges_server, whole) -> None:
    """A connection closed mid-body (urllib3: "Connection broken: IncompleteRead") is transient: retried."""
    options = _options(ranges_server, part_bytes=1 << 20)
    ranges_server.cut = {0}
    retry = RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0)
    if whole:
        data, total = with_retry(lambda: s3_into.get_bytes(options, "b/k", None, None), what="r", policy=retry)
        assert (data, total) == (BODY, len(BODY))
    else:
        dest = bytearray(1000)
        s3_into.read_into(options, "b/k", 5, 1005, memoryview(dest), what="r", retry=retry, secrets=(), hedger=None)
        assert bytes(dest) == BODY[5:1005]
    assert ranges_server.count == 2


def _part_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(s3_into.THREAD_NAME_PREFIX)}


def test_part_threads_are_kept_for_the_next_read(ranges_server) -> None:
    options = _options(ranges_server, part_bytes=4096, parts_in_flight=4, adapt_parts=False)
    once = RetryPolicy(max_attempts=1, base_delay_s=0.0, max_delay_s=0.0)
    dest = bytearray(len(BODY))
    s3_into.read_into(options, "b/k", 0, len(BODY), memoryview(dest), what="r", retry=once, secrets=(), hedger=None)
    first = _part_threads()
    assert len(first) >= 1
    s3_into.read_into(options, "b/k", 0, len(BODY), memoryview(dest), what="r", retry=once, secrets=(), hedger=None)
    assert _part_threads() <= first  # the same threads read again: none started
    assert bytes(dest) == BODY


def test_a_read_with_no_thread_to_be_had_is_read_by_its_own_thread(ranges_server, monkeypatch) -> None:
    class NoThreads:
        def submit(self, fn, *args):
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(s3_into.threads, "pool", lambda name: NoThreads())
    options = _options(ranges_server, part_bytes=4096, parts_in_flight=4, adapt_parts=False)
    once = RetryPolicy(max_attempts=1, base_delay_s=0.0, max_delay_s=0.0)
    dest = bytearray(len(BODY))
    s3_into.read_into(options, "b/k", 0, len(BODY), memoryview(dest), what="r", retry=once, secrets=(), hedger=None)
    assert bytes(dest) == BODY
