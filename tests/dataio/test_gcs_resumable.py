"""The resumable-upload protocol of dataio/storage/gcs_resumable.py against a stub of GCS's answers (no server):
308s and their Range, a chunk cut off and resumed where the session says, cancellation idempotent, the
session recorded before the first byte and forgotten after, upload_id redacted. The real server: test_gcs_sessions."""

from __future__ import annotations

import io
import json

import pytest

from dataio.format.versions import JournalSessions, read_session, session_records
from dataio.storage import gcs_resumable
from dataio.storage.redact import redact
from dataio.storage.retry import RetryPolicy, with_retry
from dataio.storage.store import Store

_URI = "https://storage.example/upload/storage/v1/b/b/o?uploadType=resumable&name=k&upload_id=SECRETSESSION42"
_Q = 256 << 10


class _Stub:
    """Answers like GCS: POST opens a session; PUT of a chunk appends it (308 + Range, or 200 when whole);
    `cut` makes the chunks at those offsets fail after the session kept half of them."""

    def __init__(self, cut: tuple[int, ...] = (), delete_status: int | Exception = 499) -> None:
        self.held, self.cut, self.delete_status = bytearray(), set(cut), delete_status
        self.log: list[str] = []
        self.loop = None

    def split_path(self, path: str) -> tuple[str, str, None]:
        bucket, key = path.split("/", 1)
        return bucket, key, None

    _location = "https://storage.example"

    def call(self, method: str, url: str, **kwargs):
        self.log.append(f"{method} start")
        return {"Location": _URI}, b""

    def request(self, method: str, uri: str, data: bytes = b"", headers: dict | None = None):
        if method == "DELETE":
            self.log.append("DELETE")
            if isinstance(self.delete_status, Exception):
                raise self.delete_status
            return self.delete_status, {}
        spec = headers["Content-Range"].split()[1]
        span, total = spec.split("/")
        if span != "*":
            first = int(span.split("-")[0])
            assert first <= len(self.held), "a chunk may not leave a gap"
            self.log.append(f"PUT {first}")
            piece = data[len(self.held) - first:]
            if first in self.cut:
                self.cut.discard(first)
                self.held += piece[: len(piece) // 2 // _Q * _Q]
                raise ConnectionResetError("connection reset mid-chunk")
            self.held += piece
        else:
            self.log.append("PUT status")
        if len(self.held) == int(total):
            return 200, {}
        return 308, ({"Range": f"bytes=0-{len(self.held) - 1}"} if self.held else {})


@pytest.fixture
def stub(monkeypatch):
    def make(**kwargs) -> _Stub:
        fs = _Stub(**kwargs)
        monkeypatch.setattr(gcs_resumable, "_request", lambda fs_, method, uri, **kw: fs_.request(method, uri, **kw))
        return fs
    return make


def _retry(fn, what):
    return with_retry(fn, what=what, policy=RetryPolicy(deadline_s=5.0), sleep=lambda s: None)


def test_chunks_go_on_where_the_session_says_after_a_cut(stub) -> None:
    fs, data = stub(cut=(_Q * 2,)), bytes(range(256)) * (5 * _Q // 256 + 3)
    events: list[str] = []
    gcs_resumable.upload(fs, "b/k", io.BytesIO(data), len(data), _retry, chunk_bytes=2 * _Q,
                         log=lambda uri: events.append(f"log {len(fs.held)}") or "h1",
                         forget=lambda handle: events.append(f"forget {handle}"))
    assert bytes(fs.held) == data
    assert events == ["log 0", "forget h1"]  # recorded before the first byte, forgotten once whole
    assert fs.log == ["POST start", "PUT 0", "PUT 524288", "PUT status", "PUT 786432", "PUT 1310720"]


def test_a_failed_upload_is_cancelled_and_forgotten(stub) -> None:
    fs = stub(cut=(0,))
    fs.cut = {0}
    forgotten: list[str] = []

    def refuse(fn, what):  # no retries: the first failure ends the upload
        return fn()

    with pytest.raises(ConnectionResetError):
        gcs_resumable.upload(fs, "b/k", io.BytesIO(b"x" * 10), 10, refuse, log=lambda uri: "h", forget=forgotten.append)
    assert fs.log[-1] == "DELETE" and forgotten == ["h"]


@pytest.mark.parametrize("answer, status", [(499, 499), (FileNotFoundError(_URI), 404),
                                            (type("HttpError", (Exception,), {"code": 410})(), 410)])
def test_cancelling_is_idempotent(stub, answer, status) -> None:
    assert gcs_resumable.cancel(stub(delete_status=answer), _URI) == status


def test_a_refused_cancel_raises(stub) -> None:
    with pytest.raises(Exception, match="forbidden"):
        gcs_resumable.cancel(stub(delete_status=PermissionError("forbidden")), _URI)


def test_chunks_must_be_multiples_of_256_kib(stub) -> None:
    with pytest.raises(ValueError, match="multiples of 262144"):
        gcs_resumable.send(stub(), _URI, io.BytesIO(b"x"), 1, _retry, chunk_bytes=1000)


def test_the_upload_id_is_a_secret() -> None:
    assert "SECRETSESSION42" not in redact(f"FileNotFoundError: {_URI}")
    assert redact(_URI).endswith("upload_id=***")


def test_session_records_round_trip_beside_the_journal(tmp_path) -> None:
    store, log = Store(str(tmp_path)), JournalSessions(version="v000002")
    handle = log.record(store, "shards/v000002/shard-000001.tar", _URI)
    assert handle.startswith("versions/v000002/sessions/") and session_records("v000002", store.list()) == [handle]
    assert session_records("v000001", store.list()) == []  # a journal of before: no records, nothing to cancel
    assert read_session(store, handle) == ("shards/v000002/shard-000001.tar", _URI)
    store.write_bytes(handle, json.dumps({"shardify_session": 99}).encode())
    with pytest.raises(Exception, match="malformed upload session record"):
        read_session(store, handle)
    log.forget(store, handle)
    assert session_records("v000002", store.list()) == []
