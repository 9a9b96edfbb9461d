"""--skip-steps A:B and --skip-samples FILE: after the resume, the loader drops those samples from the
rest of the run (ShardLoader.skip; dataio/loader/skips.py resolves them to ids on every rank alike).
The skip is a note on the console and in the report, and a {"kind": "skip"} record in metrics.jsonl.
"""

from __future__ import annotations

from typing import Any

from dataio.loader.skips import ids_of_lines, ids_of_skipped_steps
from dataio.storage.store import Store


def apply_skips(run: Any, storage: Any) -> None:
    """Skip what --skip-steps / --skip-samples name (no-op without them); ValueError/StateError say why not."""
    cfg, loader = run.cfg, run.loader
    if not (cfg.skip_steps or cfg.skip_samples):
        return
    if not hasattr(loader, "skip"):
        raise ValueError("--skip-steps and --skip-samples need a dataset of image or table samples (not synthetic: "
                         "data, not token datasets)")
    urls = [st.url for st in loader.opened.stores]
    ids, record = [], {"kind": "skip", "step": run.step}
    if cfg.skip_steps:
        stores = _sidecar_stores(run, storage)
        step_ids, where = ids_of_skipped_steps(stores, cfg.skip_steps, urls, storage)
        ids += step_ids.tolist()
        record.update(steps=cfg.skip_steps, step_samples=len(step_ids), named_by=where)
    if cfg.skip_samples:
        with open(cfg.skip_samples) as f:
            file_ids = ids_of_lines(f.readlines(), loader.opened.stores, loader.opened.manifests,
                                    where=cfg.skip_samples)
        ids += file_ids.tolist()
        record.update(samples_file=cfg.skip_samples, file_samples=len(file_ids))
    loader.skip(ids)
    record["skipped_total"] = sum(b - a for a, b in loader.skipped)
    what = (f"steps {cfg.skip_steps} ({record.get('step_samples', 0)} samples)" if cfg.skip_steps else "") + (
        " and " if cfg.skip_steps and cfg.skip_samples else "") + (
        f"{record.get('file_samples', 0)} samples of {cfg.skip_samples}" if cfg.skip_samples else "")
    record["text"] = (f"{what} from step {run.step + 1} on: {record['skipped_total']} samples skipped in all, each "
                      "later epoch shrinks by those it holds; the loader state keeps skipping")
    run.recorder.event(record)
    run.recorder.skips.append(record)
    run.recorder.note(f"skipping {record['text']}")


def _sidecar_stores(run: Any, storage: Any) -> list[Store]:
    """Where the loader-state sidecars naming the steps may be: the --resume checkpoint's folder, then
    the run's checkpoint directory."""
    stores = []
    if run.cfg.resume not in ("auto", "none"):
        folder = run.cfg.resume.rstrip("/").rpartition("/")[0]
        stores.append(Store(folder or ".", storage))
    return stores + [run.store]
