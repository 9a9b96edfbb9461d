"""Issue 19 item 1: a secret given in --data / --checkpoint-dir URLs (s3://KEY:SECRET@...) or in the
storage config file is found nowhere a run writes: not in metrics.jsonl, summary.json, the trace,
TensorBoard's event files, the checkpoints (raw bytes and unpickled), stdout or stderr. A resumed
run takes its credentials from the storage config, never from the checkpoint."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.trainer.harness import REPO, env_for, ok, run_here, run_trainer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _strings(value: Any) -> list[str]:
    """Every string inside an unpickled checkpoint (dict keys and values, lists, tuples)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _assert_nowhere(secrets: tuple[str, ...], out: Path, checkpoints: dict[str, bytes], *texts: str) -> None:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name.startswith("events.out.tfevents") for p in files), "no TensorBoard event file written"
    for secret in secrets:
        for path in files:
            assert secret.encode() not in path.read_bytes(), f"{secret!r} found in {path}"
        for name, data in checkpoints.items():
            assert secret.encode() not in data, f"{secret!r} found in the bytes of checkpoint {name}"
            if name.endswith(".pt"):  # (the loader-state sidecars beside them are JSON: their bytes say it all)
                ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                assert not [s for s in _strings(ckpt) if secret in s], f"{secret!r} found unpickling {name}"
        for text in texts:
            assert secret not in text, f"{secret!r} printed:\n{text[-3000:]}"


def _checkpoints(s3_server, bucket: str) -> dict[str, bytes]:
    client = s3_server.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix="ckpt/").get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def test_a_secret_in_urls_or_the_storage_config_is_found_nowhere(s3_server, tmp_path, capsys):
    bucket = s3_server.new_bucket()
    write_tar_dataset(Store(f"s3://{bucket}/ds", s3_server.options()), [12, 12], real_images=True)
    creds = f"{s3_server.key}:{s3_server.secret}@"
    secrets = (s3_server.secret, s3_server.key)
    out = tmp_path / "run"
    common = ["--num-classes", "10", "--model", "tests.trainer.fakes:sleepy", "--batch-size", "4",
              "--image-size", "8", "--num-workers", "0", "--out", str(out), "--tensorboard", str(out / "tb"),
              "--log-every", "1", "--no-live", "--dist-timeout-s", "60"]
    first = ok(run_trainer([*common, "--data", f"s3://{creds}{bucket}/ds", "--val-data", f"s3://{creds}{bucket}/ds",
                            "--checkpoint-dir", f"s3://{creds}{bucket}/ckpt",
                            "--s3-endpoint-url", s3_server.endpoint_url], nproc=2, timeout_s=150))
    metrics = (out / "metrics.jsonl").read_text()
    assert f'"data": "s3://***@{bucket}/ds"' in metrics  # the redacted URL is what is saved
    checkpoints = _checkpoints(s3_server, bucket)
    assert checkpoints, "the run stored no checkpoint"
    newest = max(name for name in checkpoints if name.endswith(".pt"))  # beside each: its loader-state sidecar
    saved = torch.load(io.BytesIO(checkpoints[newest]), map_location="cpu", weights_only=True)
    assert saved["config"]["checkpoint_dir"] == f"s3://***@{bucket}/ckpt"
    _assert_nowhere(secrets, out, checkpoints, first.stdout, first.stderr)

    # The resume: plain URLs, credentials from --storage-config only (none in the checkpoint to take).
    conf = tmp_path / "storage.toml"
    conf.write_text(f'[s3]\nendpoint_url = "{s3_server.endpoint_url}"\nkey = "{s3_server.key}"\n'
                    f'secret = "{s3_server.secret}"\nregion = "us-east-1"\n')
    second = ok(run_here([*common, "--data", f"s3://{bucket}/ds", "--checkpoint-dir", f"s3://{bucket}/ckpt",
                          "--storage-config", str(conf), "--epochs", "2"], capsys))  # 2 ranks -> 1, in this process
    assert f"resumed from s3://{bucket}/ckpt/ckpt-" in second.stdout, second.stdout[-3000:]
    _assert_nowhere(secrets, out, _checkpoints(s3_server, bucket), first.stdout, first.stderr, second.stdout,
                    second.stderr)


def test_an_error_about_a_url_with_a_secret_prints_it_redacted(s3_server, tmp_path):
    bucket = s3_server.new_bucket()
    url = f"s3://{s3_server.key}:{s3_server.secret}@{bucket}/missing"
    proc = subprocess.run([sys.executable, "-m", "trainer", "--data", url, "--s3-endpoint-url",
                           s3_server.endpoint_url, "--out", str(tmp_path / "o"), "--no-live", "--num-workers", "0"],
                          cwd=REPO, env=env_for(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"s3://***@{bucket}/missing" in proc.stderr, proc.stderr[-3000:]
    for secret in (s3_server.secret, s3_server.key):
        assert secret not in proc.stdout + proc.stderr
        assert all(secret.encode() not in p.read_bytes() for p in (tmp_path / "o").rglob("*") if p.is_file())


def test_saved_config_and_messages_keep_only_redacted_urls():
    from trainer.config import config_dict
    from trainer.flags import parse_config
    from trainer.redaction import scrub

    cfg = parse_config(["--data", "s3://AKIDEXAMPLE:wJalrXUtnFEMI@b/web=0.7", "--data", "s3://b/gold=0.3",
                        "--checkpoint-dir", "s3://AKIDEXAMPLE:wJalrXUtnFEMI@c/ckpt",
                        "--val-data", "https://h/v?X-Amz-Signature=abcdef123456&x=1"])
    saved = config_dict(cfg)
    assert saved["data"][0] == {"url": "s3://***@b/web", "weight": 0.7}
    assert saved["checkpoint_dir"] == "s3://***@c/ckpt" and "abcdef123456" not in saved["val_data"]
    assert cfg.data_label == "s3://***@b/web=0.7 + s3://b/gold=0.3"
    # A secret known from the storage options is redacted wherever it shows, even without a URL around it.
    assert scrub({"error": ["denied for wJalrXUtnFEMI"]}, ("wJalrXUtnFEMI",)) == {"error": ["denied for ***"]}
