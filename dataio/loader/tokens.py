"""The token loader: `make_loader(url, seq_len=L, batch_size=B)` on a token dataset -> packed sequences.

The unit of the plan is the sequence (dataio/plan/tokens.py): shards permuted by (seed, epoch), their
documents concatenated in stored order, cut into sequences of L + 1 tokens ("concat") or from each
document start ("aligned", padded and masked), shuffled within windows; every rank gets equal steps,
every token is in exactly one sequence but a tail under one global batch. Batch j of an iteration comes
from plan worker j % num_workers, as the plan assigns it, so the order, the state and a resume at any
world size and number of workers are those of the plan. worker_mode "auto" (and num_workers=0) builds
the batches in the caller's thread, advancing each plan worker's stream in turn while its reads run
ahead in prefetch threads (object storage); "threads" gives each plan worker a builder thread;
"processes" runs each in a DataLoader worker process (token_procs.py). The state counts batches as they
leave `__iter__`.
"""

from __future__ import annotations

import json
import queue
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from dataio.errors import StateError
from dataio.format.manifest import Manifest
from dataio.loader.config import LoaderConfig, Source, read_ahead_bytes
from dataio.loader.history import HistoryKeeper
from dataio.loader.position import PlanPosition
from dataio.loader.protocol import DatasetFacts
from dataio.loader.startup import agree_on_dataset
from dataio.loader.state import make_state
from dataio.loader.token_batches import TokenJob, worker_batches
from dataio.loader.token_open import open_token_sources, token_facts
from dataio.loader.token_procs import TokenProcesses
from dataio.plan.token_fit import token_shortfall
from dataio.plan.token_mix import token_mix_num_steps, token_mixture
from dataio.plan.tokens import SequenceOrder, TokenPlanConfig
from dataio.plan.types import PlanConfig, PlanState, Topology
from dataio.readers.tokens import TokenShards, TokenSources
from dataio.storage.cache import DiskCache
from dataio.storage.store import Store

_STOP_POLL_S = 0.1


class TokenLoader(PlanPosition):
    """Iterate once per epoch (`set_epoch(e)` first); `len()` is the steps per rank; Stateful."""

    label_names = None  # TrainLoader (protocol.py): token batches carry no labels but the next tokens
    stats = None

    def __init__(self, sources: list[Source], config: LoaderConfig, *, topology: Topology, in_process: bool = False,
                 kv_store: Any = None) -> None:
        if any(s.repeat is not None for s in sources):
            raise ValueError("token mixtures take weights (token shares), not repeat=; give each Source a weight")
        if in_process and topology.num_workers != 1:
            raise ValueError("in_process (num_workers=0) plans exactly one worker")
        assert config.seq_len is not None
        self.config, self.topology, self.in_process = config, topology, in_process
        self.seq_len, self.packing = config.seq_len, config.packing

        def opener() -> tuple[tuple[list[tuple[Store, Manifest]], str], str]:
            opened, fingerprint = open_token_sources(sources, config)
            return (opened, fingerprint), fingerprint

        if kv_store is not None:
            opened, self.fingerprint = agree_on_dataset(
                opener, rank=topology.rank, world_size=topology.world_size, timeout_s=config.startup_timeout_s,
                kv_store=kv_store)
        else:
            opened, self.fingerprint = opener()[0]
        self.store, self.manifest = opened[0]  # the first source's (the only one's)
        self.opened = opened
        info = self.manifest.tokens
        assert info is not None
        cache = (DiskCache(config.cache_dir, limit_bytes=config.cache_limit_bytes)
                 if config.cache_dir is not None and config.cache_limit_bytes is not None else None)
        reader = TokenSources([TokenShards(st, m, verify_checksums=config.verify_checksums, cache=cache)
                               for st, m in opened])
        seq_bytes = (self.seq_len + 1) * info.np_dtype.itemsize
        window = config.shuffle_window if config.shuffle_window_bytes is None else max(
            1, min(config.shuffle_window, config.shuffle_window_bytes // seq_bytes))
        self.plan_config = PlanConfig(seed=config.seed, batch_size=config.batch_size, tail=config.tail,
                                      shuffle=config.shuffle, shuffle_window=window)
        plan = TokenPlanConfig(seq_len=self.seq_len, packing=self.packing, plan=self.plan_config)
        doc_lengths = tuple(self._doc_lengths(src) for src in reader.shards)
        for src, docs in zip(reader.shards, doc_lengths):
            try:
                SequenceOrder(docs, plan, 0)  # aligned packing refuses a seq_len above every document
            except ValueError as exc:
                raise ValueError(f"{src.store.url}: {exc}") from None
        # One dataset is a mixture of one (Mixture.single): one path below here; plan/token_mix.py plans it
        # as plan/tokens.py does, and its state has no 'mixture' key (state.py).
        self.mixture = token_mixture(doc_lengths, plan, names=[st.url for st, _ in opened],
                                     weights=[1.0 if s.weight is None else s.weight for s in sources],
                                     fingerprints=[m.fingerprint for _, m in opened],
                                     schedule=config.mix_schedule)  # pieces last a number of sequences
        self.job = TokenJob(reader=reader, config=plan, doc_lengths=doc_lengths, mixture=self.mixture,
                            with_docs=config.fields is None or "doc_ids" in config.fields,
                            pad_id=info.tokenizer.eos_id, prefetch_bytes=read_ahead_bytes(config, decoding=False),
                            max_in_flight=config.max_in_flight)
        self.num_classes = info.tokenizer.vocab_size  # TrainLoader: a model's output is a vocabulary
        self._state, self._delivered, self._finished = PlanState(epoch=0), 0, False
        self._active_steps: int | None = None
        self._token = 0
        self._threads: _Workers | TokenProcesses | None = None
        self.history = HistoryKeeper()  # every pass of the run, for `shardify which` and spikes (loader/history.py)
        short = token_shortfall(num_tokens=sum(sum(m.shard_num_tokens) for _, m in opened), seq_len=self.seq_len,
                                batch_size=config.batch_size, world_size=topology.world_size, tail=config.tail,
                                packing=self.packing)
        if short is not None and len(self) == 0:  # 0 batches, silently, otherwise (a mixture may repeat)
            warnings.warn(f"{', '.join(st.url for st, _ in opened)}: {short}", UserWarning, stacklevel=3)

    # --- TrainLoader (protocol.py) ------------------------------------------------------------
    @property
    def facts(self) -> DatasetFacts:
        """Identity, sequences per epoch, bytes per sequence, the sources and their shares."""
        return token_facts(self.opened, fingerprint=self.fingerprint, seq_len=self.seq_len, mixture=self.mixture)

    def where(self, batch: dict[str, Any], i: int) -> str:
        """Token batches name no shard per sequence: a corrupt block is named when it is read."""
        return ""

    def _doc_lengths(self, shards: TokenShards) -> tuple[np.ndarray, ...]:
        """What the plan cuts: concat needs only each shard's tokens, aligned every document's length."""
        if self.packing == "aligned":
            return tuple(shards.document_lengths(range(shards.manifest.num_shards)))
        return tuple(np.asarray([n] if n else [], dtype=np.int64) for n in shards.manifest.shard_num_tokens)

    # --- length (topology, epoch and history: loader/position.py) -------------------------
    def _position(self) -> PlanState:
        if self._delivered == 0:
            return self._state
        t = self.topology
        return self._state.advanced(world_size=t.world_size, num_workers=t.num_workers, batches=self._delivered)

    def _next_start(self) -> PlanState:
        return PlanState(epoch=self._state.epoch) if self._finished else self._position()

    def _steps_from(self, state: PlanState) -> int:
        return token_mix_num_steps(self.job.doc_lengths, self.mixture, config=self.job.config,
                                   world_size=self.topology.world_size, state=state)

    def __len__(self) -> int:
        if self._active_steps is not None:
            return self._active_steps
        return self._steps_from(self._next_start())

    @property
    def tokens_per_batch(self) -> int:
        """Tokens of input each rank batch carries (batch_size x seq_len)."""
        return self.config.batch_size * self.seq_len

    # --- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        start = self._next_start()
        self._record_history(new_pass=self._finished)
        self._state, self._delivered, self._finished = start, 0, False
        steps = self._steps_from(start)
        self._token += 1
        self._active_steps = steps
        self._stop_threads()
        if self.in_process:
            batches: Iterator[dict[str, Any]] = worker_batches(self.job, self.topology.slot(0), start)
        elif self.config.worker_mode == "threads":
            self._threads = _Workers(self.job, self.topology, start, depth=self.config.prefetch_factor)
            batches = self._threads.batches(steps)
        elif self.config.worker_mode == "processes":  # DataLoader workers, one per plan worker (token_procs.py)
            self._threads = TokenProcesses(self.job, self.topology, start, prefetch_factor=self.config.prefetch_factor,
                                           context=self.config.multiprocessing_context)
            batches = self._threads.batches(steps)
        else:  # "auto": the workers' streams interleaved in this thread, their reads run ahead in prefetch threads
            batches = _interleaved(self.job, self.topology, start, steps)
        return self._deliver(batches, self._token, steps)

    def _deliver(self, batches: Iterator[dict[str, Any]], token: int, steps: int) -> Iterator[dict[str, Any]]:
        try:
            for batch in batches:
                if token != self._token:
                    raise RuntimeError("this loader started a newer iteration; an old iterator cannot continue")
                if self.config.pin_memory:
                    batch = {k: v.pin_memory() for k, v in batch.items()}
                self._delivered += 1  # counted as it leaves: the state is what the caller got
                yield batch
                if self._delivered == steps:
                    break
            self._finished = self._delivered == steps
        finally:
            if token == self._token:
                self._active_steps = None
                self._stop_threads()

    def _stop_threads(self) -> None:
        if self._threads is not None:
            self._threads.close()
            self._threads = None

    # --- Stateful (torch.distributed.checkpoint) -------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What has been delivered so far, in a form any rank of any topology can load."""
        state = make_state(self._position(), fingerprint=self.fingerprint, plan_config=self.plan_config,
                           mixture=self.mixture, epoch_complete=self._finished and self._active_steps is None)
        state["tokens"] = json.dumps({"seq_len": self.seq_len, "packing": self.packing})
        return self._with_history(state)

    def load_history(self, state_dict: dict[str, Any]) -> None:
        """Take only the run's history from a saved state (an epoch-end checkpoint, not resumed)."""
        self.history.load(state_dict, self._state, fingerprint=self.fingerprint, plan=self.plan_config)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a state saved by any rank of any topology; StateError says what does not fit."""
        if self._active_steps is not None:
            raise RuntimeError("load_state_dict during an iteration; call it between epochs")
        mine = {"seq_len": self.seq_len, "packing": self.packing}
        saved = state_dict.get("tokens") if isinstance(state_dict, dict) else None
        if saved is None or json.loads(saved) != mine:
            raise StateError(f"cannot resume: the state was saved by a loader of {saved or 'samples, not tokens'}, "
                             f"this one reads {mine}; build the loader with the same seq_len and packing")
        super().load_state_dict(state_dict)

    def close(self) -> None:
        """Stop the reader threads now."""
        self._stop_threads()

    def __enter__(self) -> TokenLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _interleaved(job: TokenJob, topology: Topology, start: PlanState, steps: int) -> Iterator[dict[str, Any]]:
    """Batch j from plan worker j % num_workers, each worker's stream advanced in this thread: a token
    batch is a few copies, cheaper than handing it between threads (the GIL's switch interval)."""
    streams = [worker_batches(job, topology.slot(w), start) for w in range(topology.num_workers)]
    try:
        for j in range(steps):
            yield next(streams[j % len(streams)])
    finally:
        for stream in streams:
            stream.close()


class _Workers:
    """num_workers reader threads, each running its plan worker's batches into its own bounded queue."""

    def __init__(self, job: TokenJob, topology: Topology, start: PlanState, *, depth: int) -> None:
        self._stop = threading.Event()
        self._queues = [queue.Queue(maxsize=max(1, depth)) for _ in range(topology.num_workers)]
        self._threads = [threading.Thread(target=self._run, args=(job, topology, start, w), daemon=True,
                                          name=f"dataio-tokens-{w}") for w in range(topology.num_workers)]
        for t in self._threads:
            t.start()

    def _run(self, job: TokenJob, topology: Topology, start: PlanState, w: int) -> None:
        try:
            for batch in worker_batches(job, topology.slot(w), start):
                if not self._put(w, ("batch", batch)):
                    return
        except BaseException as exc:  # noqa: BLE001 - raised in the consuming thread at this worker's turn
            self._put(w, ("error", exc))

    def _put(self, w: int, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queues[w].put(item, timeout=_STOP_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def batches(self, steps: int) -> Iterator[dict[str, Any]]:
        """Batch j from worker j % num_workers, for j < steps."""
        for j in range(steps):
            w = j % len(self._queues)
            while True:
                try:
                    kind, value = self._queues[w].get(timeout=_STOP_POLL_S)
                    break
                except queue.Empty:
                    if not self._threads[w].is_alive() and self._queues[w].empty():
                        raise RuntimeError(f"token worker {w} ended before batch {j} of {steps}") from None
            if kind == "error":
                raise value
            yield value

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
