"""The two schedulers under test behind one interface, and the per-step records they emit.

A *side* owns one scheduler + KV cache manager and exposes: ``add`` (a request),
``has_requests``, ``schedule`` (returns an opaque handle for the step plus a
:class:`SchedRecord`), ``update`` (applies a step's fake model output, returns an
:class:`UpdateRecord`), ``free_queue`` (the free-block queue, head first), ``ledger`` (ref
counts and prefix-cache index), ``prefix_stats`` and ``describe`` (state for a divergence
report). Records hold only what both schedulers expose, in the same units, so the driver can
compare them with ``==``.

The fake model samples exactly one token for every scheduled request whose prefill is
complete after the step (``not is_prefill_chunk``), and that token is the request's next
id from the workload, so prefix hashing over generated tokens agrees on both sides.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from engine.kv_cache import KVCacheManager
from engine.request import Request as OurRequest
from engine.request import RequestStatus
from engine.scheduler import ScheduledStep, Scheduler
from engine.workload import RequestSpec


@dataclass(frozen=True, slots=True)
class SchedConfig:
    """Scheduler settings applied identically to both sides."""

    num_blocks: int  # including the null block 0 (usable = num_blocks - 1)
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int = 131072
    block_size: int = 16
    long_prefill_token_threshold: int = 0
    reserve_full_isl: bool = True
    async_scheduling: bool = False
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True

    def new_kv(self) -> KVCacheManager:
        """Our KV cache manager with these settings."""
        return KVCacheManager(
            self.num_blocks, self.block_size, self.max_model_len, self.enable_prefix_caching
        )

    def scheduler_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of our ``Scheduler`` (after the KV manager) for these settings."""
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "long_prefill_token_threshold": self.long_prefill_token_threshold,
            "reserve_full_isl": self.reserve_full_isl,
            "async_scheduling": self.async_scheduling,
            "enable_chunked_prefill": self.enable_chunked_prefill,
        }


@dataclass(frozen=True, slots=True)
class SchedRecord:
    """What one ``schedule()`` call decided.

    ``scheduled``: ``(request id, tokens scheduled, computed tokens before the step)`` in
    schedule order; ``admitted``: ``(id, num_cached_tokens)`` of requests moved from waiting to
    running this step (new or resumed; their computed-before is the prefix hit);
    ``new_blocks``: for each scheduled request the block ids appended to its table this step
    (its whole table when admitted); ``num_free``/``usage`` after the call.
    """

    scheduled: tuple[tuple[str, int, int], ...]
    samples: tuple[str, ...]
    preempted: tuple[str, ...]
    admitted: tuple[tuple[str, int], ...]
    new_blocks: tuple[tuple[str, tuple[int, ...]], ...]
    num_free: int
    usage: float

    @property
    def empty(self) -> bool:
        return not self.scheduled and not self.preempted


@dataclass(frozen=True, slots=True)
class UpdateRecord:
    """State after ``update_from_output`` of one step: who finished, free blocks, usage and
    the running/waiting queues in order."""

    finished: tuple[str, ...]
    num_free: int
    usage: float
    running: tuple[str, ...]
    waiting: tuple[str, ...]


def full_token_ids(spec: RequestSpec) -> tuple[int, ...]:
    """Prompt + output ids of a request; the case builders always give ``output_ids``."""
    if spec.output_ids is None or len(spec.output_ids) < spec.output_len:
        raise ValueError(f"request {spec.request_id}: the harness needs explicit output ids")
    return tuple(spec.prompt_ids) + tuple(spec.output_ids[: spec.output_len])


class OursSide:
    """servesweep's ``engine.scheduler.Scheduler`` over ``engine.kv_cache.KVCacheManager``."""

    name = "ours"

    def __init__(self, cfg: SchedConfig) -> None:
        self.cfg = cfg
        self.kv = cfg.new_kv()
        self.sched = Scheduler(self.kv, **cfg.scheduler_kwargs())
        self.requests: list[OurRequest] = []
        self._table_len: dict[int, int] = {}
        self._clock = 0
        # How often the run hit scheduler corner cases (to show what a case exercised).
        self.events: dict[str, int] = {
            "preemptions": 0,
            "resumed admissions": 0,
            "block-aligned prompts hit up to their last block": 0,
            "outputs of requests preempted in flight": 0,
            "max duplicate-hash blocks": 0,
        }

    def add(self, spec: RequestSpec) -> None:
        full_token_ids(spec)  # same precondition as the vLLM side
        req = OurRequest(
            spec, len(self.requests), self.cfg.block_size, self.cfg.enable_prefix_caching
        )
        self.requests.append(req)
        self.sched.add_request(req)

    def has_requests(self) -> bool:
        return self.sched.has_requests()

    def schedule(self) -> tuple[ScheduledStep, SchedRecord]:
        self._clock += 1
        before = {r.index for r in self.sched.running}
        step = self.sched.schedule(self._clock)
        scheduled, admitted, new_blocks = [], [], []
        for req, n in zip(step.reqs, step.num_tokens, strict=True):
            rid = req.request_id
            scheduled.append((rid, n, req.num_computed_tokens - n))
            table = req.block_ids()
            if req.index in before:
                prev = self._table_len.get(req.index, 0)
            else:
                admitted.append((rid, req.num_cached_tokens))
                prev = 0
            new_blocks.append((rid, tuple(table[prev:])))
            self._table_len[req.index] = len(table)
        ev = self.events
        bs = self.cfg.block_size
        for req in step.preempted:
            self._table_len.pop(req.index, None)
            ev["preemptions"] += 1
        for req, n in zip(step.reqs, step.num_tokens, strict=True):
            if req.index in before:
                continue
            hit = req.num_computed_tokens - n
            if req.num_preemptions > 0:
                ev["resumed admissions"] += 1
            if hit and req.num_tokens % bs == 0 and hit == req.num_tokens - bs:
                ev["block-aligned prompts hit up to their last block"] += 1
        rec = SchedRecord(
            tuple(scheduled),
            tuple(r.request_id for r, s in zip(step.reqs, step.samples, strict=True) if s),
            tuple(sorted(r.request_id for r in step.preempted)),
            tuple(admitted),
            tuple(new_blocks),
            self.kv.pool.num_free,
            self.kv.usage(),
        )
        return step, rec

    def update(self, step: ScheduledStep) -> UpdateRecord:
        self._clock += 1
        for req, sample in zip(step.reqs, step.samples, strict=True):
            if sample and req.status == RequestStatus.PREEMPTED:
                self.events["outputs of requests preempted in flight"] += 1
        finished = self.sched.update_from_output(step, self._clock)
        for req in finished:
            self._table_len.pop(req.index, None)
        return UpdateRecord(
            tuple(sorted(r.request_id for r in finished)),
            self.kv.pool.num_free,
            self.kv.usage(),
            tuple(r.request_id for r in self.sched.running),
            tuple(r.request_id for r in self.sched.waiting),
        )

    def free_queue(self) -> tuple[int, ...]:
        return tuple(self.kv.pool.free_block_ids())

    def ledger(self) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        """Ref count of every block but the null block, and the prefix-cache index as groups
        of block ids sharing a hash (in lookup order), sorted."""
        pool = self.kv.pool
        groups = sorted(tuple(ids) for ids in pool.cache_groups())
        widest = max((len(g) for g in groups), default=0)
        if widest > self.events["max duplicate-hash blocks"]:
            self.events["max duplicate-hash blocks"] = widest
        return tuple(pool.ref_cnt[1:]), tuple(groups)

    def prefix_stats(self) -> tuple[int, int]:
        """Cumulative prefix-cache (queries, hits) over every lookup."""
        return self.kv.prefix_queries, self.kv.prefix_hits

    def describe(self, limit: int = 12) -> str:
        s = self.sched
        run = [
            f"{r.request_id}(tok={r.num_tokens},comp={r.num_computed_tokens},"
            f"ph={r.num_output_placeholders},blk={max(r.kv_num_blocks, 0)})"
            for r in s.running[:limit]
        ]
        wait = [
            f"{r.request_id}(tok={r.num_tokens},{RequestStatus(r.status).name.lower()},"
            f"pre={r.num_preemptions})"
            for r in list(s.waiting)[:limit]
        ]
        return (
            f"free={self.kv.pool.num_free} usage={self.kv.usage():.4f} "
            f"running[{len(s.running)}]={' '.join(run)}{' …' if len(s.running) > limit else ''} "
            f"waiting[{len(s.waiting)}]={' '.join(wait)}{' …' if len(s.waiting) > limit else ''}"
        )


_MODEL_DIR: str | None = None


def _tiny_model_dir(max_positions: int) -> str:
    """A folder holding only a tiny Llama ``config.json``: enough for vLLM's ``ModelConfig``
    with ``skip_tokenizer_init`` (no weights are loaded, no network is used)."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = tempfile.mkdtemp(prefix="fidelity-model-")
        cfg = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "num_hidden_layers": 1,
            "vocab_size": 32000,
            "max_position_embeddings": max_positions,
            "rms_norm_eps": 1e-5,
            "torch_dtype": "float32",
        }
        with open(os.path.join(_MODEL_DIR, "config.json"), "w") as fh:
            json.dump(cfg, fh)
    return _MODEL_DIR


def vllm_available() -> tuple[bool, str]:
    """Whether vLLM's V1 scheduler imports here; the reason when it does not."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm  # noqa: F401
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: F401
        from vllm.v1.core.sched.scheduler import Scheduler as _S  # noqa: F401
    except Exception as exc:  # ImportError, or a broken partial install
        return False, f"vLLM is not importable ({type(exc).__name__}: {exc})"
    version = getattr(vllm, "__version__", "?")
    if version != "0.19.1":
        return False, f"vLLM {version} is installed; the harness pins 0.19.1"
    return True, ""


class VllmSide:
    """vLLM 0.19.1's own ``Scheduler``/``AsyncScheduler`` and ``KVCacheManager`` on CPU,
    with a fake model runner (see the module docstring)."""

    name = "vllm"
    MAX_POSITIONS = 262144

    def __init__(self, cfg: SchedConfig) -> None:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        import torch
        from vllm import SamplingParams
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler as VScheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request as VRequest
        from vllm.v1.structured_output import StructuredOutputManager

        if cfg.max_model_len > self.MAX_POSITIONS:
            raise ValueError(f"max_model_len {cfg.max_model_len} > {self.MAX_POSITIONS}")
        self.cfg = cfg
        self._SamplingParams = SamplingParams
        self._VRequest = VRequest
        self._ModelRunnerOutput = ModelRunnerOutput
        model = ModelConfig(
            model=_tiny_model_dir(self.MAX_POSITIONS),
            skip_tokenizer_init=True,
            max_model_len=cfg.max_model_len,
            dtype="float32",
        )
        sched_cfg = SchedulerConfig(
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=cfg.max_model_len,
            is_encoder_decoder=False,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
            async_scheduling=cfg.async_scheduling,
            scheduler_reserve_full_isl=cfg.reserve_full_isl,
            policy="fcfs",
            long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        )
        cache = CacheConfig(
            block_size=cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching
        )
        vcfg = VllmConfig(
            model_config=model,
            scheduler_config=sched_cfg,
            cache_config=cache,
            device_config=DeviceConfig(device="cpu"),
        )
        kv_cfg = KVCacheConfig(
            num_blocks=cfg.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["model.layers.0.self_attn.attn"],
                    FullAttentionSpec(
                        block_size=cfg.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                    ),
                )
            ],
        )
        vcfg.cache_config.num_gpu_blocks = cfg.num_blocks
        cls = AsyncScheduler if cfg.async_scheduling else VScheduler
        self.sched = cls(
            vcfg,
            kv_cfg,
            structured_output_manager=StructuredOutputManager(vcfg),
            block_size=cfg.block_size,
            log_stats=True,
        )
        self.effective = self._effective_settings()
        init_none_hash(sha256)
        # vLLM's EngineCore gives requests a block hasher only when prefix caching is on.
        self._hasher = (
            get_request_block_hasher(cfg.block_size, sha256)
            if cfg.enable_prefix_caching
            else None
        )
        self.requests: dict[str, Any] = {}
        self._tokens: dict[str, tuple[int, ...]] = {}
        self._table_len: dict[str, int] = {}
        self._done: set[str] = set()
        self._queries = 0
        self._hits = 0

    def _effective_settings(self) -> dict[str, Any]:
        """The settings the vLLM scheduler actually runs with (vLLM may adjust the config)."""
        s = self.sched
        return {
            "max_num_seqs": s.max_num_running_reqs,
            "max_num_batched_tokens": s.max_num_scheduled_tokens,
            "max_model_len": s.max_model_len,
            "long_prefill_token_threshold": s.scheduler_config.long_prefill_token_threshold,
            "reserve_full_isl": s.scheduler_config.scheduler_reserve_full_isl,
            "async": type(s).__name__ == "AsyncScheduler",
            "enable_chunked_prefill": s.scheduler_config.enable_chunked_prefill,
            "enable_prefix_caching": s.cache_config.enable_prefix_caching,
            "num_blocks": s.kv_cache_manager.block_pool.num_gpu_blocks,
        }

    def add(self, spec: RequestSpec) -> None:
        ids = full_token_ids(spec)
        req = self._VRequest(
            spec.request_id,
            list(spec.prompt_ids),
            self._SamplingParams(max_tokens=spec.output_len, ignore_eos=True),
            None,
            arrival_time=spec.arrival_ns / 1e9,
            block_hasher=self._hasher,
        )
        self.requests[spec.request_id] = req
        self._tokens[spec.request_id] = ids
        self.sched.add_request(req)

    def has_requests(self) -> bool:
        return self.sched.has_requests()

    def _blocks(self, rid: str) -> list[Any]:
        mgr = self.sched.kv_cache_manager.coordinator.single_type_managers[0]
        return mgr.req_to_blocks[rid]

    def schedule(self) -> tuple[tuple[Any, list[bool]], SchedRecord]:
        before = {r.request_id for r in self.sched.running}
        so = self.sched.schedule()
        scheduled, admitted, new_blocks, samples, sample_flags = [], [], [], [], []
        for rid, n in so.num_scheduled_tokens.items():
            req = self.requests[rid]
            scheduled.append((rid, n, req.num_computed_tokens - n))
            table = self._blocks(rid)
            if rid in before:
                prev = self._table_len.get(rid, 0)
            else:
                admitted.append((rid, req.num_cached_tokens))
                prev = 0
            new_blocks.append((rid, tuple(b.block_id for b in table[prev:])))
            self._table_len[rid] = len(table)
            sample = not req.is_prefill_chunk
            sample_flags.append(sample)
            if sample:
                samples.append(rid)
        preempted = tuple(sorted(so.preempted_req_ids or ()))
        for rid in preempted:
            self._table_len.pop(rid, None)
        kvm = self.sched.kv_cache_manager
        rec = SchedRecord(
            tuple(scheduled),
            tuple(samples),
            preempted,
            tuple(admitted),
            tuple(new_blocks),
            kvm.block_pool.get_num_free_blocks(),
            kvm.usage,
        )
        return (so, sample_flags), rec

    def _collect_prefix_stats(self) -> None:
        """Add the stats gathered since the last take to the running totals (taking resets
        them, as ``update_from_output``'s ``make_stats`` would)."""
        st = self.sched.kv_cache_manager.make_prefix_cache_stats()
        if st is not None:
            self._queries += st.queries + st.preempted_queries
            self._hits += st.hits + st.preempted_hits

    def update(self, handle: tuple[Any, list[bool]]) -> UpdateRecord:
        so, sample_flags = handle
        ids = list(so.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid, sample in zip(ids, sample_flags, strict=True):
            if not sample:
                sampled.append([])
                continue
            req = self.requests[rid]
            toks = self._tokens[rid]
            pos = req.num_tokens
            if pos >= len(toks):  # finished/aborted in flight: vLLM ignores its output
                sampled.append([])
            else:
                sampled.append([toks[pos]])
        out = self._ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        # update_from_output's make_stats() takes (and resets) the prefix stats: read first.
        self._collect_prefix_stats()
        self.sched.update_from_output(so, out)
        finished = tuple(
            sorted(
                rid for rid in ids if rid not in self._done and self.requests[rid].is_finished()
            )
        )
        for rid in finished:
            self._done.add(rid)
            self._table_len.pop(rid, None)
        kvm = self.sched.kv_cache_manager
        return UpdateRecord(
            finished,
            kvm.block_pool.get_num_free_blocks(),
            kvm.usage,
            tuple(r.request_id for r in self.sched.running),
            tuple(r.request_id for r in self.sched.waiting)
            + tuple(r.request_id for r in self.sched.skipped_waiting),
        )

    def free_queue(self) -> tuple[int, ...]:
        q = self.sched.kv_cache_manager.block_pool.free_block_queue
        return tuple(b.block_id for b in q.get_all_free_blocks())

    def ledger(self) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        """Ref count of every block but the null block, and the prefix-cache index
        (``BlockHashToBlockMap``) as groups of block ids sharing a hash, sorted."""
        pool = self.sched.kv_cache_manager.block_pool
        groups = []
        for entry in pool.cached_block_hash_to_block._cache.values():
            if isinstance(entry, dict):
                groups.append(tuple(b.block_id for b in entry.values()))
            else:
                groups.append((entry.block_id,))
        return tuple(b.ref_cnt for b in pool.blocks[1:]), tuple(sorted(groups))

    def prefix_stats(self) -> tuple[int, int]:
        """Cumulative prefix-cache (queries, hits), first and preempted lookups together."""
        self._collect_prefix_stats()
        return self._queries, self._hits

    def describe(self, limit: int = 12) -> str:
        s = self.sched
        run = [
            f"{r.request_id}(tok={r.num_tokens},comp={r.num_computed_tokens},"
            f"ph={r.num_output_placeholders},blk={len(self._blocks(r.request_id))})"
            for r in s.running[:limit]
        ]
        waiting = list(s.waiting) + list(s.skipped_waiting)
        wait = [
            f"{r.request_id}(tok={r.num_tokens},{r.status.name.lower()},pre={r.num_preemptions})"
            for r in waiting[:limit]
        ]
        kvm = s.kv_cache_manager
        return (
            f"free={kvm.block_pool.get_num_free_blocks()} usage={kvm.usage:.4f} "
            f"running[{len(s.running)}]={' '.join(run)}{' …' if len(s.running) > limit else ''} "
            f"waiting[{len(waiting)}]={' '.join(wait)}{' …' if len(waiting) > limit else ''}"
        )
