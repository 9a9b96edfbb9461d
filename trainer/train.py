"""The training run: build everything (setup), resume, train epochs with timed steps, finish.

A step is one optimizer step over grad_accum micro-batches; DDP's all-reduce runs only on the
last micro-batch (no_sync on the others) through the timing comm hook.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dataio.loader.protocol import TrainLoader
from dataio.loader.which import samples_of_step, sidecar_doc
from dataio.storage.store import RetryPolicy, Store
from trainer import checkpoint as ckpt_io
from trainer import clip, comm_hooks, data, gpt, nonfinite, runtime
from trainer.accel import Accel, accel_of
from trainer.config import TrainConfig, config_dict
from trainer.models import build_model
from trainer.recorder import Recorder
from trainer.schedule import WarmupCosine, planned_samples, replan
from trainer.skipping import apply_skips
from trainer.spikes import SpikeWatch
from trainer.timing import StepRecord, StepTimer
from trainer.validate import evaluate


@dataclass
class Run:
    """Everything one rank's training needs, built by `setup`."""

    cfg: TrainConfig
    rt: runtime.Runtime
    loader: TrainLoader
    val_loader: TrainLoader | None
    model: nn.Module  # unwrapped: what checkpoints and validation use
    net: nn.Module  # DDP-wrapped when distributed
    optimizer: torch.optim.Optimizer
    schedule: WarmupCosine
    scaler: torch.amp.GradScaler
    timer: StepTimer
    store: Store
    identity: dict[str, Any]
    steps_per_epoch: int
    recorder: Recorder
    accel: Accel  # precision, grad scaler, channels-last, compile (trainer/accel.py)
    step: int = 0
    epoch: int = 0
    last_saved_step: int = -1  # the newest checkpoint a resume can use (this run's or the one it resumed)
    checkpoints_stored: int = 0  # this run's saves the store confirmed (rank 0 counts)
    checkpoints_failed: int = 0
    val: dict[str, float] | None = field(default=None)
    spike_watch: SpikeWatch | None = None
    sample_losses: list[float] | None = None  # the last step's real samples' losses (--spike-sample-losses)


def make_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def setup(cfg: TrainConfig, rt: runtime.Runtime, *, loaders: tuple[TrainLoader, TrainLoader | None] | None = None) -> Run:
    """Open loaders (or take `loaders` = (train, val or None)), build model/optimizer/schedule and
    resume; raises on bad config. No collectives here: ranks agree it worked first, then `wrap`."""
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)  # a fixed share of the machine per rank (scaling runs)
    ckpt_io.seed_all(cfg.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    if loaders is None:
        pin = rt.device.type == "cuda"  # page-locked batches make the host->device copy asynchronous
        loader = data.open_loader(cfg, cfg.data, rank=rt.rank, world_size=rt.world_size, train=True, pin_memory=pin)
        val_loader = (data.open_loader(cfg, cfg.val_data, rank=rt.rank, world_size=rt.world_size, train=False,
                                       pin_memory=pin, label_names=loader.label_names) if cfg.val_data else None)
    else:
        loader, val_loader = loaders
    loader.set_epoch(0)
    if hasattr(loader, "history"):  # a ShardLoader: its run history counts optimizer steps (shardify which)
        loader.history.grad_accum = cfg.grad_accum
    steps_per_epoch = len(loader) // cfg.grad_accum
    if steps_per_epoch < 1:
        seqs = f" sequences of --seq-len {cfg.seq_len} tokens" if cfg.model == "gpt" else ""
        raise ValueError(
            f"{cfg.data_label}: one optimizer step needs {rt.world_size} ranks x {cfg.batch_size} x "
            f"{cfg.grad_accum} micro-steps{seqs}, more than the dataset gives (a rank's share is "
            f"{len(loader)} batches); use a smaller " + ("--seq-len, " if seqs else "")
            + "--batch-size or --grad-accum, or fewer ranks"
        )
    tokens = cfg.model == "gpt"  # token batches: the vocabulary is the model's output (trainer/gpt.py)
    pairs = cfg.model in clip.CLIP_MODELS  # image-text pairs: the captions' vocabulary is the text tower's (trainer/clip.py)
    num_classes = gpt.vocab_size_of(loader) if tokens else clip.vocab_size_of(cfg, loader) if pairs else \
        data.num_classes_of(cfg, loader)
    sizes = gpt.model_sizes(cfg) if tokens else {"context_length": data.clip_context_length(cfg)} if pairs else None
    accel = accel_of(cfg.network, rt.device)
    model = accel.model(build_model(cfg.model, num_classes=num_classes, image_size=cfg.image_size,
                                    in_features=len(cfg.feature_names), sizes=sizes).to(rt.device))
    ckpt_io.seed_all(cfg.seed + 7919 * (rt.rank + 1))  # same weights, but each rank its own random stream
    timer = StepTimer(rt.device, keep_slices=cfg.trace_steps)
    optimizer = make_optimizer(cfg, model)
    global_batch = rt.world_size * cfg.batch_size * cfg.grad_accum
    total = planned_samples(epochs=cfg.epochs, epoch_samples=steps_per_epoch * global_batch, max_steps=cfg.max_steps,
                            step=0, samples_seen=0, global_batch=global_batch)
    schedule = WarmupCosine(optimizer, base_lr=cfg.lr, total_samples=total,
                            warmup_samples=cfg.warmup_steps * global_batch, min_ratio=cfg.min_lr_ratio)
    identity = {"model": cfg.model, "num_classes": num_classes, "dataset": data.fingerprint_of(loader),
                "image_size": cfg.image_size, "features": cfg.features}
    options = data.storage_options(cfg)
    store = Store(cfg.checkpoint_url, options, checkpoint_retry(cfg, options.retry))
    comm_hooks.check(cfg.comm_hook, device=rt.device.type, gradient_bytes=comm_hooks.grad_bytes(model),
                     bucket_cap_mb=cfg.bucket_cap_mb)
    recorder = Recorder(cfg, rt, secrets=options.secrets)
    if loader.facts.mixed:
        recorder.set_sources(*data.mixture_facts(loader))
    recorder.job.update(data.job_facts(loader), global_batch=global_batch, steps_per_epoch=steps_per_epoch,
                        epoch_samples=steps_per_epoch * global_batch, grad_bytes=comm_hooks.grad_bytes(model),
                        num_threads=torch.get_num_threads(), accel=accel.describe(),
                        loader_plan=data.describe_loader(loader))
    run = Run(cfg=cfg, rt=rt, loader=loader, val_loader=val_loader, model=model, net=model, optimizer=optimizer,
              schedule=schedule, scaler=accel.scaler(), timer=timer, store=store,
              identity=identity, steps_per_epoch=steps_per_epoch, recorder=recorder, accel=accel)
    run.spike_watch = SpikeWatch(cfg.spike_factor)
    recorder.spike_keys = lambda step, ranks: spike_keys(run, step, ranks)
    recorder.gpu_decode = lambda: getattr(loader.stats, "gpu_decode", None)  # decode gpu/auto (where the loader has it)
    resume(run)
    apply_skips(run, data.storage_options(cfg))  # --skip-steps / --skip-samples (trainer/skipping.py)
    return run


def checkpoint_retry(cfg: TrainConfig, policy: RetryPolicy) -> RetryPolicy:
    """The storage options' retries (the storage config's retry_budget_s), ended within half of
    --dist-timeout-s: the other ranks wait for rank 0's save in a collective, which must not time out
    (and name rank 0 as stopped) first."""
    budget = cfg.dist_timeout_s / 2
    return replace(policy, deadline_s=budget if policy.deadline_s is None else min(policy.deadline_s, budget))


def wrap(run: Run) -> None:
    """Wrap the model in DDP (collectives: after every rank's setup succeeded) with --bucket-cap-mb and
    --comm-hook, the hook inside the timing hook."""
    cfg = run.cfg
    if run.rt.distributed:
        device_ids = [run.rt.device.index] if run.rt.device.type == "cuda" else None
        run.net = DDP(run.model, device_ids=device_ids, bucket_cap_mb=cfg.bucket_cap_mb)
        state, inner = comm_hooks.build(cfg.comm_hook)
        run.net.register_comm_hook(state, run.timer.hook.function(inner))
        run.recorder.job.update(comm_hook=cfg.comm_hook, bucket_cap_mb=cfg.bucket_cap_mb)
        grads = run.recorder.job["grad_bytes"]
        run.recorder.wire_bytes = lambda: comm_hooks.wire_bytes(cfg.comm_hook, state, grads)
    run.net = run.accel.compiled(run.net)  # --compile: around DDP, its hooks kept


def resume(run: Run) -> None:
    """Load the checkpoint --resume names (auto: the newest), on every rank; no-op when there is none."""
    cfg, rt = run.cfg, run.rt
    skipped: list[str] = []
    newest = None
    if cfg.resume == "auto":  # the newest checkpoint that loads: a truncated newest one is skipped
        newest = ckpt_io.load_newest_complete(run.store)
        found = None if newest is None else (run.store, newest[0])
    else:
        found = ckpt_io.locate(cfg.resume, run.store, data.storage_options(cfg))
    if found is None:
        if rt.is_main:
            run.recorder.truncate_keys(0)
        return
    store, name = found
    if newest is not None:
        ckpt, skipped = newest[1], newest[2]
    else:
        ckpt = ckpt_io.load(store, name)
    added = run.loader.sources_added_since(ckpt["loader"])
    ckpt_io.check_identity(ckpt, run.identity, where=store.url_of(name), sources_added=added)
    run.model.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    run.schedule.load_state_dict(ckpt["schedule"])
    if ckpt["scaler"]:  # a scaler of an fp16 run (empty from bf16 / fp32 ones: a fresh scale then)
        run.scaler.load_state_dict(ckpt["scaler"])
    run.step, run.epoch, run.last_saved_step = int(ckpt["step"]), int(ckpt["epoch"]), int(ckpt["step"])
    if ckpt["epoch_done"]:
        run.epoch += 1
        if hasattr(run.loader, "load_history"):  # the position starts afresh, the run's history goes on
            run.loader.load_history(ckpt["loader"])
    else:
        run.loader.load_state_dict(ckpt["loader"])
    replan(run, ckpt.get("config", {}), at_max=_at_max(run))
    rngs = ckpt["rng"]
    if len(rngs) == rt.world_size:
        ckpt_io.set_rng_state(rngs[rt.rank])
    else:  # another world size: fresh, deterministic per-rank streams
        ckpt_io.seed_all(cfg.seed + 1000 * run.step + rt.rank)
    if rt.is_main:
        run.recorder.truncate_keys(run.step)
        for why in skipped:
            run.recorder.warn(f"skipped checkpoint {why}")
        if ckpt.get("format_version") == 1:
            run.recorder.note(f"{store.url_of(name)} carries no checksum (an older trainer wrote it): "
                              "loaded unverified")
        if added:
            run.recorder.note(f"the mixture gained {added} source(s) since {store.url_of(name)} was saved: each "
                              "joins where --mix-schedule first weighs it")
        run.recorder.note(f"resumed from {store.url_of(name)}: step {run.step}, epoch {run.epoch} "
                          f"(saved by {ckpt['world_size']} ranks, now {rt.world_size})"
                          + (f"; skipped {len(skipped)} newer checkpoint(s) that do not load" if skipped else ""))


def save(run: Run, *, epoch_done: bool) -> None:
    """Write a checkpoint (rank 0), with every rank's RNG state; all ranks take part. A save that fails
    (disk full, permission, the store refusing it) is reported and not recorded; training goes on."""
    rngs = runtime.gather(run.rt, ckpt_io.rng_state())
    if run.rt.is_main and not nonfinite.refused_save(run):
        payload = {"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
                   "schedule": run.schedule.state_dict(), "scaler": run.scaler.state_dict(),
                   "step": run.step, "epoch": run.epoch, "epoch_done": epoch_done,
                   "loader": run.loader.state_dict(), "rng": rngs, "identity": run.identity,
                   "world_size": run.rt.world_size, "config": config_dict(run.cfg)}
        try:
            url, checksum = ckpt_io.save(run.store, run.step, payload, keep=run.cfg.keep_checkpoints)
        except ckpt_io.CheckpointWriteError as exc:
            # Not stored, so not recorded: training goes on and the next interval tries again;
            # `--resume auto` only ever sees checkpoints the store confirmed.
            run.checkpoints_failed += 1
            run.recorder.event({"kind": "checkpoint_failed", "step": run.step, "epoch": run.epoch,
                                "error": str(exc)})
            run.recorder.warn(f"checkpoint at step {run.step} FAILED and was not recorded ({exc}); "
                              f"training goes on, the next checkpoint will try again (last stored: "
                              f"{'none' if run.last_saved_step < 0 else f'step {run.last_saved_step}'})")
        else:
            run.checkpoints_stored += 1
            save_loader_sidecar(run, payload["loader"])
            run.recorder.event({"kind": "checkpoint", "step": run.step, "epoch": run.epoch, "url": url,
                                "xxh3_128": checksum})
            run.last_saved_step = run.step
    # Rank 0 knows whether the store confirmed it; the gather is also the barrier after the save.
    run.last_saved_step = runtime.gather(run.rt, run.last_saved_step)[0]


def loader_sidecar(run: Run, loader_state: dict[str, Any]) -> bytes:
    """The loader-state sidecar (dataio/loader/which.py) of the run's position: state, step, sources."""
    opened = run.loader.opened  # OpenSources (samples and tokens alike)
    stores = opened.stores if hasattr(opened, "stores") else [st for st, _ in opened]
    urls = [st.url for st in stores]  # redacted; credentials come from the storage options
    weights = [s.weight for s in run.cfg.sources] if len(urls) == len(run.cfg.sources) else [None] * len(urls)
    return sidecar_doc(step=run.step, epoch=run.epoch, grad_accum=run.cfg.grad_accum,
                       sources=list(zip(urls, weights)), loader_state=loader_state)


def spike_keys(run: Run, step: int, ranks: list[int]) -> dict[str, list[str]] | None:
    """The keys each of `ranks` trained on in `step`, from the plan and the loader's history (rank 0,
    at a report: reads only the shards holding them); None for the synthetic loader."""
    if not hasattr(run.loader, "history"):
        return None
    doc = json.loads(loader_sidecar(run, run.loader.state_dict()))
    samples = samples_of_step(doc, step, ranks=ranks, storage=data.storage_options(run.cfg))
    return {str(r): [s.key for s in samples if s.rank == r and not s.is_pad] for r in ranks}


def save_loader_sidecar(run: Run, loader_state: dict[str, Any]) -> None:
    """Beside the checkpoint, the loader state as JSON for `shardify which` (rank 0); a failure is warned."""
    if not hasattr(run.loader, "history"):
        return  # the synthetic loader: nothing to name
    doc = loader_sidecar(run, loader_state)
    try:
        ckpt_io.save_sidecar(run.store, run.step, doc)
    except ckpt_io.CheckpointWriteError as exc:
        run.recorder.warn(f"the loader-state sidecar of step {run.step} was not stored ({exc}); "
                          "`shardify which` cannot read this checkpoint")


def checkpoint_facts(run: Run) -> dict[str, Any]:
    """This run's checkpoints for the summary: stored, failed, the newest resumable step, where."""
    return {"stored": run.checkpoints_stored, "failed": run.checkpoints_failed,
            "last_stored_step": None if run.last_saved_step < 0 else run.last_saved_step, "dir": run.store.url}


def unresumable(run: Run) -> str | None:
    """The error when the run ends with no checkpoint to resume from (every save failed), else None."""
    if run.last_saved_step >= 0:
        return None
    return (f"training finished, but no checkpoint could be stored in {run.store.url} "
            f"({run.checkpoints_failed} tried, all failed; see the checkpoint_failed lines in "
            f"{run.cfg.out}/metrics.jsonl): nothing can be resumed. Free space or fix access there, or "
            "pass another --checkpoint-dir, and run again")


def train_step(run: Run, batches: Any) -> tuple[StepRecord, float, list[str]]:
    """One optimizer step over grad_accum micro-batches; returns its record, loss and real sample keys."""
    cfg, rt, timer = run.cfg, run.rt, run.timer
    timer.begin()
    loss_total, samples, read_s, decode_s, keys, losses = 0.0, 0, 0.0, 0.0, [], []
    for micro in range(cfg.grad_accum):
        batch = next(batches, None)
        if batch is None:
            raise RuntimeError(f"{cfg.data_label}: the loader ended before the {len(run.loader)} batches it promised "
                               f"(step {run.step + 1}); this is a loader bug, not a data problem")
        read_s += float(batch.get("read_s", 0.0))
        decode_s += float(batch.get("decode_s", 0.0))
        if cfg.model in clip.CLIP_MODELS:  # --- image-text pairs: contrastive loss over every rank's pairs (trainer/clip.py) ---
            loss_share, num_pairs = clip.micro_step(run, batch, micro == cfg.grad_accum - 1)
            loss_total, samples = loss_total + loss_share, samples + num_pairs
            keys.extend(k for k, m in zip(batch["__key__"], batch["mask"].tolist(), strict=True) if m)
            continue
        if "input_ids" in batch:  # --- token batches: next-token loss (trainer/gpt.py) ---
            loss_share, num_sequences = gpt.micro_step(run, batch, micro == cfg.grad_accum - 1)
            loss_total, samples = loss_total + loss_share, samples + num_sequences
            if cfg.record_keys:
                keys.extend(gpt.row_keys(batch))
            continue
        data.check_labels(batch, run.identity["num_classes"], run.loader)
        with timer.phase("h2d"):
            inputs, labels, mask = data.to_device(batch, rt.device, cfg.feature_names)
            inputs = run.accel.inputs(inputs)
        keep = mask.cpu().tolist()
        if "source" in batch:  # a mixture: real samples per source, for the report
            run.recorder.count_sources(batch["source"], mask)
        keys.extend(k for k, m in zip(batch["__key__"], keep, strict=True) if m)
        samples += sum(keep)
        last = micro == cfg.grad_accum - 1
        sync = run.net.no_sync() if (rt.distributed and not last) else _nullcontext()
        with timer.phase("fwd_bwd"), sync:
            with run.accel.autocast():
                logits = run.net(inputs)
            target = labels.masked_fill(~mask, -1)
            if cfg.spike_sample_losses:  # the same mean, with the per-sample losses kept for a spike
                per = nn.functional.cross_entropy(logits.float(), target, ignore_index=-1, reduction="none")
                losses.extend(per[mask].detach().cpu().tolist())
                loss = per.sum() / mask.sum().clamp(min=1) / cfg.grad_accum
            else:
                loss = nn.functional.cross_entropy(logits.float(), target, ignore_index=-1) / cfg.grad_accum
            # NaN gradients on every rank when this loss is not finite; as loss.backward() unless --precision fp16
            run.scaler.scale(nonfinite.carried(loss)).backward()
        loss_total += float(loss.detach())
    nonfinite.check_step(step=run.step + 1, rank=rt.rank, loss=loss_total, model=run.model, keys=keys,
                         grads_checked=not run.scaler.is_enabled())  # NonFiniteStep: stop before the update
    with timer.phase("opt"):
        run.scaler.step(run.optimizer)  # run.optimizer.step(); fp16: skipped on inf/NaN gradients
        run.scaler.update()
        run.optimizer.zero_grad(set_to_none=True)
        run.schedule.step(rt.world_size * cfg.batch_size * cfg.grad_accum)
    run.step += 1
    run.sample_losses = losses if cfg.spike_sample_losses else None
    rec = timer.end(step=run.step, epoch=run.epoch, samples=samples, read_s=read_s, decode_s=decode_s)
    return rec, loss_total, keys


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def train(run: Run) -> None:
    """Epochs from the resumed position to --epochs (or --max-steps), then validation and the summary."""
    cfg = run.cfg
    run.net.train()
    while run.epoch < cfg.epochs and not _at_max(run):
        run.loader.set_epoch(run.epoch)
        steps = len(run.loader) // cfg.grad_accum  # what is left of this epoch (all of it unless resumed)
        batches = run.timer.batches(run.loader)
        done = 0
        try:
            for done in range(1, steps + 1):
                rec, loss, keys = train_step(run, batches)
                spike = run.spike_watch.observe(run.step, loss, rank=run.rt.rank, keys=keys,
                                                sample_losses=run.sample_losses) if run.spike_watch else None
                if spike is not None:
                    run.recorder.spikes.append(spike)
                shares = data.requested_at(run.loader, run.schedule.samples_seen)
                if shares is not None:  # a scheduled mixture: the report's requested shares follow it
                    run.recorder.requested = shares
                run.recorder.step(rec, loss, keys, lr=run.schedule.lr)
                if _at_max(run):
                    break
                if cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0 and done < steps:
                    save(run, epoch_done=False)
        finally:
            batches.close()  # ends the loader's iteration now: its state and workers are consistent again
        # Leftover micro-batches (fewer than --grad-accum) are part of the documented dropped tail.
        save(run, epoch_done=done == steps)
        if run.val_loader is not None:
            if cfg.model in clip.CLIP_MODELS:  # zero-shot: the validation set's class names as caption prompts
                run.val = clip.zero_shot(run.model, run.val_loader, run.rt, tokenizer=clip.tokenizer_of(cfg, run.loader),
                                         epoch=run.epoch)
            elif cfg.model == "gpt":
                run.val = gpt.evaluate(run.model, run.val_loader, run.rt, epoch=run.epoch, accel=run.accel,
                                       doc_masking=cfg.doc_masking)
            else:
                run.val = evaluate(run.model, run.val_loader, run.rt, epoch=run.epoch, accel=run.accel,
                                   features=cfg.feature_names)
            run.recorder.validation(run.val, step=run.step, epoch=run.epoch)
        run.epoch += 1
    run.recorder.job["buckets_per_step"] = run.timer.buckets_per_step
    stats = run.loader.stats
    if run.rt.is_main and stats is not None and stats.ranged_reads:
        run.recorder.note(f"storage: {stats.hedged_reads} of {stats.ranged_reads} reads on rank 0 were hedged "
                          f"(a second request after a slow start; {stats.hedges_won} won by the hedge, "
                          f"{stats.hedges_over_budget} slow reads over the 10% budget)")
    run.recorder.checkpoints = checkpoint_facts(run)
    rep = run.recorder.finish(run.val)
    if cfg.model == "gpt" and run.rt.is_main:
        gpt.token_report(run, rep)


def _at_max(run: Run) -> bool:
    return bool(run.cfg.max_steps) and run.step >= run.cfg.max_steps
