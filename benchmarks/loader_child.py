"""The loader benchmark's child process: one configuration, run for its epochs, in one or more forms.

A form is how the training loop consumes a RAW batch of shardify. "packed": the PackedBytes as
they come (payload counted from their sizes). The per-sample forms, what the peers deliver and
most user code asks for: "views" walks every sample's zero-copy memoryview, "to_list" copies each
into `bytes`, and "to_list, before" is the copy the code did before views existed (the whole
buffer into one `bytes`, then a slice per sample: two copies), kept here to measure the change
in the same run. Epoch 1 is packed; the later epochs cycle through the forms (one each, in turn)
so that load drifts hit every form alike.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

PEERS_TV = ("streaming", "litdata", "imagefolder")
PEERS_S3 = ("s3torchconnector", "obstore")  # benchmarks/s3_peers.py: RAW from S3 only
FORMS = ("packed", "views", "to_list", "to_list, before")


def build_loader(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The loader a spec names and a function counting (samples, payload bytes) in one batch."""
    from benchmarks import loader_peers as peers

    kind, task = spec["loader"], spec["task"]
    common = {"task": task, "batch_size": spec["batch_size"], "num_workers": spec["num_workers"]}
    if kind == "shardify":
        return peers.shardify_loader(spec["url"], options=spec.get("options"), **common)
    if kind == "shardify-dali":
        return peers.shardify_loader(spec["url"], decode="dali", **common)
    if kind == "webdataset":
        return peers.webdataset_loader(spec["tars"], **common)
    if kind == "plain":
        return peers.plain_loader(spec["folder"], **common)
    if kind == "pagecache":
        from benchmarks.loader_data import page_cache_read

        return page_cache_read(spec["tars"], spec["counts"])
    if kind in PEERS_S3:
        from benchmarks import s3_peers

        return getattr(s3_peers, f"{kind}_loader")(spec["tars"], batch_size=spec["batch_size"],
                                                   num_workers=spec["num_workers"])
    if kind in PEERS_TV:
        from benchmarks import peers_tv

        source = {"streaming": spec.get("mds"), "litdata": spec.get("litdata"), "imagefolder": spec["folder"]}[kind]
        builder = getattr(peers_tv, f"{kind}_loader")
        return builder(source, **common), peers._count_raw if task == "raw" else peers._count_decoded
    raise ValueError(f"unknown loader {kind!r}")


def per_sample_count(form: str) -> Any:
    """Count a shardify RAW batch as code consuming it per sample does: every item's length, in `form`."""
    from dataio.batch import PackedBytes

    def items(packed: PackedBytes) -> Any:
        if form == "views":
            return packed  # iterating yields the zero-copy views
        if form == "to_list":
            return packed.to_list()
        buf, offs = packed.data.numpy().tobytes(), packed.offsets.tolist()  # "to_list, before"
        return [buf[offs[i]: offs[i + 1]] for i in range(len(offs) - 1)]

    def count(batch: dict) -> tuple[int, int]:
        fields = [v for v in batch.values() if isinstance(v, PackedBytes)]
        return int(batch["mask"].sum()), sum(len(item) for packed in fields for item in items(packed))

    return count


def _import_library(kind: str) -> None:
    """Import the loader's library before the clock starts: time to first batch is the library's
    own start-up (opening the dataset, starting workers, the first batch), not Python's imports."""
    import torch  # noqa: F401

    from benchmarks import loader_peers  # noqa: F401

    # dataio's loader is a lazy attribute (`import dataio` stays light for the CLI): import what
    # `from dataio import make_loader` imports, as `import webdataset` imports its whole loader.
    loader = ["dataio", "dataio.loader.shard_loader"]
    names = {"shardify": loader, "shardify-dali": [*loader, "nvidia.dali"], "webdataset": ["webdataset"],
             "streaming": ["streaming", "torchvision"], "litdata": ["litdata", "torchvision"],
             "imagefolder": ["torchvision"]}
    if kind in PEERS_S3:
        from benchmarks import s3_peers

        s3_peers.ensure_installed()
        names[kind] = ["s3torchconnector" if kind == "s3torchconnector" else "obstore"]
    for name in names.get(kind, []):
        __import__(name)


def _epoch(loader: Any, count: Any, max_batches: int | None, started: float, ttfb: list[float]) -> dict[str, Any]:
    t0, cpu0, n, nbytes = time.perf_counter(), _tree_cpu_s(), 0, 0
    for i, batch in enumerate(loader):
        if not ttfb:
            ttfb.append(time.perf_counter() - started)
        k, b = count(batch)
        n, nbytes = n + k, nbytes + b
        if max_batches is not None and i + 1 >= max_batches:
            break
    return {"samples": n, "bytes": nbytes, "seconds": time.perf_counter() - t0, "cpu_s": _tree_cpu_s() - cpu0}


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run a spec's epochs: epoch 1 packed, then `epochs - 1` per form; rates per form."""
    _import_library(spec["loader"])
    start = time.perf_counter()
    loader, count = build_loader(spec)
    forms = spec.get("forms", ["packed"])
    counts = {f: count if f == "packed" else per_sample_count(f) for f in forms}
    ttfb: list[float] = []
    plan = ["packed"] + [forms[i % len(forms)] for i in range(max(0, spec["epochs"] - 1) * len(forms))]
    epochs = []
    for number, form in enumerate(plan):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(number)
        epochs.append({"form": form, **_epoch(loader, counts[form], spec.get("max_batches"), start, ttfb)})
    out = {"first_epoch_samples_per_s": epochs[0]["samples"] / epochs[0]["seconds"], "ttfb_s": ttfb[0],
           "first_epoch_samples_per_cpu_s": epochs[0]["samples"] / max(epochs[0]["cpu_s"], 1e-9), "epochs": epochs}
    for form in forms:
        steady = [e for e in epochs[1:] if e["form"] == form] or epochs[:1]
        seconds, samples = sum(e["seconds"] for e in steady), sum(e["samples"] for e in steady)
        cpu_s = sum(e["cpu_s"] for e in steady)
        suffix = "" if form == "packed" else f" {form}"
        out[f"samples_per_s{suffix}"] = samples / seconds
        if form == "packed":
            out["mb_per_s"] = sum(e["bytes"] for e in steady) / seconds / 1e6
            out["samples_per_cpu_s"] = samples / cpu_s if cpu_s > 0 else 0.0
    return out


def _tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and its live descendants (the workers)."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total
