"""Storage: redaction, option precedence, retry classification, short reads, atomic publish."""

from __future__ import annotations

import gc
import os
import pickle
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataio import StorageError, StorageNotFoundError
from dataio.storage.options import StorageOptions
from dataio.storage.paths import check_relative, check_relative_many
from dataio.storage.redact import redact
from dataio.storage.retry import RetryPolicy, ShortReadError, is_transient, with_retry
from dataio.storage.store import Store

NO_WAIT = RetryPolicy(max_attempts=4, base_delay_s=0.0, max_delay_s=0.0)


# --- redaction ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,gone",
    [
        ("s3://AKIAXYZ:supersecret@bucket/key", ["AKIAXYZ", "supersecret"]),
        ("https://user:pw1234@host/path", ["user", "pw1234"]),
        ("https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA123%2F2024&X-Amz-Signature=abcdef0123",
         ["AKIA123", "abcdef0123"]),
        ("http://h/p?token=tok-9999&x=1", ["tok-9999"]),
        ("error at https://h/p?sig=deadbeef: boom", ["deadbeef"]),
    ],
)
def test_redact_removes_credentials_from_urls(text, gone):
    out = redact(text)
    for secret in gone:
        assert secret not in out
    assert "***" in out


def test_redact_removes_known_secrets_and_keeps_the_rest():
    out = redact("failed for key AKIAVERYSECRET with secret s3cr3t-value at s3://b/k", ("AKIAVERYSECRET", "s3cr3t-value"))
    assert "AKIAVERYSECRET" not in out and "s3cr3t-value" not in out
    assert "s3://b/k" in out
    assert redact("abc", ("abc",)) == "abc"  # too short to be a secret: replacing it would mangle text


def test_options_and_store_repr_hide_credentials():
    options = StorageOptions(endpoint_url="http://127.0.0.1:9", key="AKIAHIDDEN", secret="hidden-secret")
    assert "AKIAHIDDEN" not in repr(options) and "hidden-secret" not in repr(options)
    store = Store("s3://AKIAHIDDEN:hidden-secret@bucket/prefix", options)
    for text in (repr(store), store.url, store.url_of("a.tar")):
        assert "AKIAHIDDEN" not in text and "hidden-secret" not in text
    assert store.url_of("a.tar").endswith("bucket/prefix/a.tar")


def test_storage_errors_hide_credentials(moto_s3):
    secret = "very-secret-value-123"
    options = StorageOptions(endpoint_url=moto_s3.endpoint_url, key="AKIAERRORTEST", secret=secret)
    store = Store(f"s3://{moto_s3.new_bucket()}/p", options, RetryPolicy(max_attempts=1))

    def fail() -> None:
        raise OSError(f"request with AKIAERRORTEST/{secret} to https://h/x?X-Amz-Signature=abc123 failed")

    with pytest.raises(StorageError) as err:
        with_retry(fail, what=f"reading s3://AKIAERRORTEST:{secret}@b/k", policy=store.retry,
                   secrets=options.secrets)
    text = str(err.value)
    assert secret not in text and "AKIAERRORTEST" not in text and "abc123" not in text
    with pytest.raises(StorageError) as err:
        store.read("missing.bin")
    assert secret not in str(err.value) and "missing.bin" in str(err.value)


# --- option resolution -------------------------------------------------------------------------


def _toml(tmp_path, body: str) -> str:
    path = tmp_path / "storage.toml"
    path.write_text(body)
    return str(path)


def test_resolve_precedence_flags_then_config_then_env(tmp_path):
    config = _toml(tmp_path, '[s3]\nendpoint_url = "http://conf:1"\nkey = "conf-key"\nsecret = "conf-secret"\n')
    env = {"AWS_ENDPOINT_URL": "http://env:2", "AWS_ACCESS_KEY_ID": "env-key",
           "AWS_SECRET_ACCESS_KEY": "env-secret", "AWS_REGION": "eu-west-1"}
    got = StorageOptions.resolve(endpoint_url="http://flag:3", config_path=config, env=env)
    assert got.endpoint_url == "http://flag:3"  # flag beats config and env
    assert (got.key, got.secret) == ("conf-key", "conf-secret")  # config beats env
    assert got.region == "eu-west-1"  # only env has it
    only_env = StorageOptions.resolve(env=env)
    assert (only_env.endpoint_url, only_env.key) == ("http://env:2", "env-key")
    assert StorageOptions.resolve(env={"AWS_ENDPOINT_URL_S3": "http://s3:4", "AWS_ENDPOINT_URL": "x"}).endpoint_url == "http://s3:4"
    assert StorageOptions.resolve() == StorageOptions()  # no ambient environment read implicitly


def test_resolve_refuses_unknown_keys_missing_and_bad_files(tmp_path):
    with pytest.raises(ValueError, match="unknown keys.*endpoint"):
        StorageOptions.resolve(config_path=_toml(tmp_path, '[s3]\nendpiont_url = "typo"\n'))
    with pytest.raises(ValueError, match="does not exist"):
        StorageOptions.resolve(config_path=str(tmp_path / "nope.toml"))
    with pytest.raises(ValueError, match="not valid TOML"):
        StorageOptions.resolve(config_path=_toml(tmp_path, "[s3\n"))
    with pytest.raises(ValueError, match="both"):
        StorageOptions(key="only-key")
    with pytest.raises(ValueError):
        StorageOptions(read_timeout_s=0)


def test_fsspec_kwargs_carry_timeouts_in_botocore_config():
    kwargs = StorageOptions(endpoint_url="http://e:1", key="k1234", secret="s1234", connect_timeout_s=2,
                            read_timeout_s=7).fsspec_kwargs("s3")
    assert kwargs["config_kwargs"]["connect_timeout"] == 2 and kwargs["config_kwargs"]["read_timeout"] == 7
    assert kwargs["client_kwargs"]["endpoint_url"] == "http://e:1"
    assert StorageOptions().fsspec_kwargs("file") == {}


# --- retry -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc,transient",
    [
        (ConnectionResetError("reset by peer"), True),
        (TimeoutError("read timed out"), True),
        (ShortReadError("got 3 bytes, expected 9"), True),
        (OSError("An error occurred (SlowDown): 503 Please reduce your request rate"), True),
        (RuntimeError("Response payload is not completed"), True),
        (FileNotFoundError("no such key"), False),
        (PermissionError("access denied"), False),
        (ValueError("bad argument"), False),
    ],
)
def test_transient_classification(exc, transient):
    assert is_transient(exc) is transient


def test_transient_errors_are_retried_with_backoff_then_succeed():
    calls, sleeps = [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("connection reset by peer")
        return "ok"

    policy = RetryPolicy(max_attempts=5, base_delay_s=0.1, max_delay_s=5.0)
    assert with_retry(flaky, what="reading x", policy=policy, sleep=sleeps.append) == "ok"
    assert len(calls) == 3 and len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.1 and 0 <= sleeps[1] <= 0.2  # full jitter under a doubling cap


def test_retry_gives_up_after_max_attempts_with_a_clear_message():
    sleeps: list[float] = []

    def always() -> None:
        raise TimeoutError("timed out")

    with pytest.raises(StorageError, match=r"reading s3://b/k: gave up after 4 attempts.*TimeoutError"):
        with_retry(always, what="reading s3://b/k", policy=NO_WAIT, sleep=sleeps.append)
    assert len(sleeps) == 3


def test_missing_files_are_not_retried():
    calls = []

    def missing() -> None:
        calls.append(1)
        raise FileNotFoundError("s3://b/missing")

    with pytest.raises(StorageError, match="check that the path exists"):
        with_retry(missing, what="reading s3://b/missing", policy=NO_WAIT, sleep=lambda s: None)
    assert calls == [1]


def test_storage_errors_keep_their_cause_and_say_not_found():
    def missing() -> None:
        raise FileNotFoundError("s3://b/missing")

    with pytest.raises(StorageError) as err:
        with_retry(missing, what="reading s3://b/missing", policy=NO_WAIT, sleep=lambda s: None)
    assert err.value.not_found and isinstance(err.value.__cause__, FileNotFoundError)

    def refused() -> None:
        raise PermissionError("access denied")

    with pytest.raises(StorageError) as err:
        with_retry(refused, what="reading s3://b/k", policy=NO_WAIT, sleep=lambda s: None)
    assert not err.value.not_found and isinstance(err.value.__cause__, PermissionError)

    def flaky() -> None:
        raise TimeoutError("timed out")

    with pytest.raises(StorageError) as err:
        with_retry(flaky, what="reading s3://b/k", policy=NO_WAIT, sleep=lambda s: None)
    assert not err.value.not_found and isinstance(err.value.__cause__, TimeoutError)
    restored = pickle.loads(pickle.dumps(StorageNotFoundError("gone")))  # the flag survives a worker's pipe
    assert restored.not_found and isinstance(restored, StorageError)


def test_a_cause_holding_credentials_is_replaced_by_its_redacted_text():
    import traceback

    secret = "very-secret-value-456"

    def fail() -> None:
        try:
            raise ValueError(f"signed https://h/x?X-Amz-Signature={secret}")
        except ValueError as inner:
            raise OSError("connection reset") from inner

    with pytest.raises(StorageError) as err:
        with_retry(fail, what="reading s3://b/k", policy=NO_WAIT, sleep=lambda s: None, secrets=(secret,))
    shown = "".join(traceback.format_exception(err.value))
    assert secret not in shown and "connection reset" in shown and err.value.__cause__ is not None


def test_retry_policy_is_validated():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay_s=2, max_delay_s=1)
    assert all(0 <= RetryPolicy(base_delay_s=1, max_delay_s=3).delay_s(a) <= 3 for a in range(1, 20))


# --- paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "/abs", "../up", "a/../../b", "a//b", "./a", "s3://b/k", "C:/x", "a\\b"])
def test_unsafe_relative_paths_are_refused(bad):
    with pytest.raises(ValueError):
        check_relative(bad)


def test_store_refuses_paths_that_leave_the_prefix(tmp_path):
    store = Store(str(tmp_path))
    with pytest.raises(ValueError):
        store.read("../etc/passwd")
    with pytest.raises(ValueError):
        store.child("..")


# --- local disk --------------------------------------------------------------------------------


def test_local_round_trip_ranges_and_listing(tmp_path):
    store = Store(str(tmp_path / "ds"), retry=NO_WAIT)
    store.write_bytes("shards/a.bin", bytes(range(100)))
    store.write_bytes("b.txt", b"hi")
    assert store.read("shards/a.bin", 10, 20) == bytes(range(10, 20))
    assert store.read("shards/a.bin", 5, 5) == b""
    assert store.size("shards/a.bin") == 100 and store.exists("b.txt") and not store.exists("c")
    assert store.list() == ["b.txt", "shards/a.bin"]
    assert store.child("shards").read("a.bin", expect_size=100) == bytes(range(100))
    assert Store(f"file://{tmp_path}/ds").read("b.txt") == b"hi"
    assert Store(str(tmp_path / "absent")).list() == []
    store.remove("b.txt")
    store.remove("b.txt")  # removing twice is fine
    assert store.list() == ["shards/a.bin"]


def test_short_read_is_detected(tmp_path):
    """An object store's short read is retried (another try may get it all); a local file's fails at
    once: it does not grow by asking again (a cut shard failed only after the 120 s budget before)."""
    store = Store(f"memory://{tmp_path.name}", retry=RetryPolicy(max_attempts=2, base_delay_s=0.0))
    store.write_bytes("x.bin", b"12345")
    with pytest.raises(StorageError, match=r"x.bin.*gave up after 2 attempts.*ShortReadError.*got 5 bytes, expected 9"):
        store.read("x.bin", expect_size=9)
    with pytest.raises(StorageError, match="ShortReadError"):
        store.read("x.bin", 2, 9)  # a range past the end is short too
    assert store.read("x.bin", expect_size=5) == b"12345"
    local = Store(str(tmp_path), retry=RetryPolicy(max_attempts=5, base_delay_s=10.0, max_delay_s=10.0))
    local.write_bytes("x.bin", b"12345")
    began = time.monotonic()
    with pytest.raises(StorageError, match=r"x.bin: TruncatedFileError: got 5 bytes, expected 9: the file is shorter"):
        local.read("x.bin", expect_size=9)  # would take 40 s if it were retried
    with pytest.raises(StorageError, match="TruncatedFileError"):
        local.read("x.bin", 2, 9)
    assert time.monotonic() - began < 5 + 5  # no back-off was waited (a deadline of ours: 10 s per try)


def test_missing_local_file_fails_fast(tmp_path):
    store = Store(str(tmp_path), retry=RetryPolicy(max_attempts=5, base_delay_s=10.0, max_delay_s=10.0))
    with pytest.raises(StorageError, match="FileNotFoundError.*check that the path exists"):
        store.read("nope.bin")  # would take 40 s if it were retried
    with pytest.raises(StorageError) as err:
        store.read("nope.bin")
    assert err.value.not_found and isinstance(err.value.__cause__, FileNotFoundError)


def _no_temp_left(directory) -> list[str]:
    return [n for n in os.listdir(directory) if ".tmp" in n]


def test_local_atomic_publish_failing_writer_leaves_nothing(tmp_path):
    store = Store(str(tmp_path))
    with pytest.raises(RuntimeError, match="writer died"):
        with store.open_atomic("shards/s.tar") as f:
            f.write(b"partial" * 1000)
            raise RuntimeError("writer died")
    assert os.listdir(tmp_path / "shards") == []
    store.write_bytes("shards/s.tar", b"old")
    with pytest.raises(RuntimeError):
        with store.open_atomic("shards/s.tar") as f:
            f.write(b"new but partial")
            raise RuntimeError("writer died")
    assert store.read("shards/s.tar") == b"old"  # readers still see the whole old object
    assert _no_temp_left(tmp_path / "shards") == []
    with store.open_atomic("shards/s.tar") as f:
        f.write(b"new")
        assert store.read("shards/s.tar") == b"old"  # nothing visible before the block ends
    assert store.read("shards/s.tar") == b"new" and _no_temp_left(tmp_path / "shards") == []


def test_store_pickles_without_its_client(tmp_path):
    store = Store(str(tmp_path), StorageOptions(key="k1234", secret="s1234"), NO_WAIT)
    store.write_bytes("a", b"1")  # opens the filesystem
    clone = pickle.loads(pickle.dumps(store))
    assert clone._fs is None and clone.read("a") == b"1"
    assert clone.options == store.options and clone.retry == store.retry


# --- memory:// ---------------------------------------------------------------------------------


def test_memory_store_round_trip_and_atomic_write():
    store = Store(f"memory://shardify-test-{uuid.uuid4().hex}/ds", retry=NO_WAIT)
    store.write_bytes("a/b.bin", b"abc")
    assert store.read("a/b.bin") == b"abc" and store.read("a/b.bin", 1, 3) == b"bc"
    assert store.list() == ["a/b.bin"]
    with pytest.raises(RuntimeError):
        with store.open_atomic("c.bin") as f:
            f.write(b"partial")
            raise RuntimeError("writer died")
    assert not store.exists("c.bin")
    assert store.prefix_exists()


# --- S3 (real SeaweedFS) -----------------------------------------------------------------------


def test_s3_atomic_publish_leaves_no_object_on_error(s3_server):
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options(), NO_WAIT)
    with pytest.raises(RuntimeError, match="writer died"):
        with store.open_atomic("small.bin") as f:
            f.write(b"x" * 1000)
            raise RuntimeError("writer died")
    big = os.urandom(1 << 20) * 6  # > 5 MiB: s3fs starts a multipart upload before the error
    with pytest.raises(RuntimeError, match="writer died"):
        with store.open_atomic("big.bin") as f:
            f.write(big)
            f.flush()
            raise RuntimeError("writer died")
    gc.collect()  # an abandoned s3fs file must not upload itself when collected
    assert store.list() == []
    store.write_bytes("big.bin", big)
    assert store.size("big.bin") == len(big) and store.read("big.bin", 5_000_000, 5_000_010) == big[5_000_000:5_000_010]
    uploads = s3_server.client().list_multipart_uploads(Bucket=store.raw_url.split("/")[2])
    assert not uploads.get("Uploads")  # the aborted multipart upload is gone too


def test_s3_missing_object_and_short_read(s3_server):
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options(), RetryPolicy(max_attempts=2, base_delay_s=0.0))
    with pytest.raises(StorageError, match="FileNotFoundError"):
        store.read("nope.bin")
    store.write_bytes("x.bin", b"12345")
    with pytest.raises(StorageError, match="ShortReadError"):
        store.read("x.bin", expect_size=6)
    assert store.prefix_exists() and store.list() == ["x.bin"]


_PATH_ALPHABET = st.sampled_from(["a", "b", ".", "..", "/", ":", "\\", "\n", "x.tar", "//", "s3://"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_PATH_ALPHABET, max_size=5).map("".join), min_size=1, max_size=4))
def test_bulk_path_check_agrees_with_the_single_check(paths):
    def one(rel):
        try:
            check_relative(rel)
            return True
        except ValueError:
            return False

    try:
        check_relative_many(paths)
        bulk_ok = True
    except ValueError:
        bulk_ok = False
    assert bulk_ok == all(one(p) for p in paths)
