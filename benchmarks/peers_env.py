"""The peers' own virtual environment and the formats they read, made once and reused.

MosaicML Streaming, LitData and torchvision need a torch that torchvision was built for: the
benchmark builds benchmarks/.peers-venv (git-ignored) with torch 2.14.1 + torchvision 0.29.1
(pip takes both from this machine's local wheels for Python 3.11), the peers, and shardify's own
dependencies, so that shardify also runs there under the same torch for the memory comparison.
Nothing here is used by tests or CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".peers-venv"
PACKAGES = (
    "torch==2.14.1", "torchvision==0.29.1", "mosaicml-streaming", "litdata", "webdataset",
    # shardify's own dependencies (it runs from the source tree via PYTHONPATH)
    "numpy", "pillow", "simplejpeg", "pyarrow", "fsspec", "xxhash", "psutil", "rich", "tqdm", "s3fs", "boto3",
)


def peers_python() -> Path:
    """The peers' interpreter, building the venv first if it is missing or was built for other packages."""
    python, stamp = VENV / "bin" / "python", VENV / ".packages"
    wanted = " ".join(PACKAGES)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"building {VENV} (torch 2.14.1 + torchvision 0.29.1 + peers; once, several GB) ...", flush=True)
    subprocess.run([_base_python(), "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True)
    stamp.write_text(wanted)
    return python


def _base_python() -> str:
    """The interpreter this venv was made from: the peers' venv must not inherit the project's packages."""
    return getattr(sys, "_base_executable", None) or sys.executable


def peer_env() -> dict[str, str]:
    """Environment for a child in the peers' venv: shardify and benchmarks from this source tree."""
    root = str(HERE.parent)
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root}


def prepare_peer_formats(folder: Path, work: Path) -> dict[str, str]:
    """MDS shards (Streaming) and optimized chunks (LitData) written from `folder`, cached in `work`."""
    mds, chunks = work / f"{folder.name}-mds", work / f"{folder.name}-litdata"
    done = work / f"{folder.name}-peers.done"
    if not done.exists():
        for d in (mds, chunks):
            subprocess.run(["rm", "-rf", str(d)], check=True)
        subprocess.run([str(peers_python()), "-m", "benchmarks.peers_tv", "write", str(folder), "--mds", str(mds),
                        "--litdata", str(chunks)], check=True, cwd=HERE.parent, env={**os.environ, **peer_env()})
        done.touch()
    return {"mds": str(mds), "litdata": str(chunks)}
