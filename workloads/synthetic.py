"""Synthetic workloads: Poisson / gamma / constant arrivals, in stages or not, length
distributions, seeded token ids.

Arrivals follow ``vllm bench serve`` (:mod:`workloads.arrivals`, their one definition): gaps
are Gamma(shape = burstiness, scale = 1 / (rate * burstiness)), so ``burstiness = 1`` is a
Poisson process and the coefficient of variation of the gaps is ``1 / sqrt(burstiness)``.
The first request arrives one gap after t = 0; every gap is truncated to integer ns before
accumulating. For ``burstiness == 1`` the gaps are drawn exactly as the reference ShareGPT
generator draws them (numpy's legacy ``RandomState(seed).exponential``), so ``rate = 10,
seed = 42`` with 300 requests reproduces the arrival times of the shared
``sharegpt-*-300-sps10`` workloads to the nanosecond. ``rate = inf`` puts every arrival at 0
(vLLM's default burst). ``synthetic`` takes a rate and a burstiness; ``synthetic_requests``
takes any ``workloads.arrivals.Load`` (load stages, constant arrivals) and fills it the same
way.

Input lengths, output lengths, prompt ids and prefix groups each use their own
``numpy.random.default_rng`` stream derived from the seed, so changing one length
distribution moves neither the arrivals nor the other lengths.

Every argument is range-checked, and the size of the workload against a token budget
(:mod:`workloads.limits`) before any token id is drawn: the request count before the
arrivals, the sampled lengths before the ids. Prompt ids are returned as ``array('q')``
(8 bytes per id).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np

from engine.workload import RequestSpec
from workloads.arrivals import Load, gap_arrivals
from workloads.errors import WorkloadError
from workloads.limits import (
    MAX_TOKEN_ID,
    MAX_TOKENS_PER_FIELD,
    MAX_TOTAL_TOKENS,
    PLACEHOLDER_ID_BASE,
    check_budget_arg,
    check_max_model_len_arg,
)

DEFAULT_VOCAB_SIZE = 32_000

# Log-space fits to the shared ShareGPT replay workloads (see ``LengthDist`` below).
SHAREGPT_INPUT = {"log_mu": 6.595, "log_sigma": 0.560, "min": 256, "max": 4096}
SHAREGPT_OUTPUT = {"log_mu": 6.477, "log_sigma": 0.159, "min": 512, "max": 1224}

_KINDS = ("fixed", "uniform", "lognormal", "sharegpt")


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A token-length distribution.

    - ``fixed``: always ``value``.
    - ``uniform``: integers in ``[low, high]`` inclusive.
    - ``lognormal``: ``mean`` is the distribution's mean in tokens and ``sigma`` the
      standard deviation of ``log(length)``, so ``mu = ln(mean) - sigma**2 / 2``;
      samples are rounded and clipped to ``[low, high]`` (``high = 0``: no upper clip).
    - ``sharegpt``: a lognormal shaped like the shared ShareGPT replay workloads
      (``workloads/sharegpt-{llama-3.1-8b,qwen3-32b}-300-sps10.jsonl``; the qwen3-30b-a3b
      file is byte-identical to the qwen3-32b one). Derivation: the mean and standard
      deviation of ``log(input_toks)`` and ``log(output_toks)`` over each 300-request
      file, averaged over the Llama and Qwen tokenizations: input log-mean 6.598 / 6.592,
      log-sd 0.550 / 0.570 -> ``log_mu 6.595, log_sigma 0.560`` (median ~731 tokens);
      output log-mean 6.470 / 6.485, log-sd 0.150 / 0.167 -> ``log_mu 6.477,
      log_sigma 0.159`` (median ~650). Clipping follows the generator's filters and the
      observed ranges: inputs to [256, 4096] (``--min-input-toks 256``, observed
      257-4570), outputs to [512, 1224] (``--min-output-toks 512``, observed 512-1224).
      The output fit describes these filtered replays (replies of >= 512 tokens), not
      raw ShareGPT, whose replies are much shorter. ``sharegpt`` picks the input or
      output fit by the role it is used in.
    """

    kind: str = "fixed"
    value: int = 128
    low: int = 1
    high: int = 0
    mean: float = 0.0
    sigma: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise WorkloadError(f"length distribution kind '{self.kind}': use one of {_KINDS}")
        for name in ("value", "low", "high"):
            v = getattr(self, name)
            if isinstance(v, float) and v.is_integer():
                v = int(v)
                object.__setattr__(self, name, v)
            if isinstance(v, bool) or not isinstance(v, Integral):
                raise WorkloadError(f"length '{name}' must be an integer, got {v!r}")
            if v > MAX_TOKENS_PER_FIELD:
                raise WorkloadError(
                    f"length '{name}' is {v}, above {MAX_TOKENS_PER_FIELD}: no model serves a "
                    "request this long; lower it"
                )
        for name in ("mean", "sigma"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v):
                raise WorkloadError(f"length '{name}' must be a finite number, got {v!r}")
        if self.mean > MAX_TOKENS_PER_FIELD:
            raise WorkloadError(
                f"lognormal mean {self.mean} is above {MAX_TOKENS_PER_FIELD} tokens: no model "
                "serves a request this long; lower it"
            )
        if self.kind == "fixed" and self.value < 1:
            raise WorkloadError(f"fixed length value must be >= 1, got {self.value}")
        if self.low < 1:
            raise WorkloadError(f"length 'low' must be >= 1, got {self.low}")
        if self.kind == "uniform" and self.high < self.low:
            raise WorkloadError(
                f"uniform lengths need high >= low, got low={self.low} high={self.high}"
            )
        if self.kind == "lognormal" and (self.mean <= 0 or self.sigma < 0):
            raise WorkloadError(
                f"lognormal lengths need mean > 0 and sigma >= 0, got mean={self.mean} "
                f"sigma={self.sigma}"
            )
        if self.kind == "lognormal" and 0 < self.high < self.low:
            raise WorkloadError(f"lognormal clip needs high >= low, got {self.low}..{self.high}")

    @classmethod
    def parse(cls, spec: LengthDist | int | str | dict[str, Any], role: str) -> LengthDist:
        """Accept a ``LengthDist``, an int (fixed), a kind name, or a mapping with ``kind``
        (or ``dist``) plus the fields above (what a Hydra config would hold)."""
        if isinstance(spec, LengthDist):
            return spec
        if isinstance(spec, bool):
            raise WorkloadError(f"{role}: a length distribution cannot be a bool")
        if isinstance(spec, int):
            return cls("fixed", value=spec)
        if isinstance(spec, str):
            return cls(spec)
        if isinstance(spec, dict):
            data = dict(spec)
            if "dist" in data:
                data["kind"] = data.pop("dist")
            allowed = {"kind", "value", "low", "high", "mean", "sigma"}
            unknown = sorted(set(data) - allowed)
            if unknown:
                raise WorkloadError(f"{role}: unknown key(s) {unknown}; allowed {sorted(allowed)}")
            return cls(**data)
        raise WorkloadError(f"{role}: expected an int, a kind name or a mapping, got {spec!r}")

    def min_len(self, role: str) -> int:
        """The shortest length ``sample`` can return (``role`` as in ``sample``)."""
        if self.kind == "fixed":
            return self.value
        if self.kind == "sharegpt":
            return (SHAREGPT_INPUT if role == "input" else SHAREGPT_OUTPUT)["min"]
        return self.low

    def sample(self, rng: np.random.Generator, n: int, role: str) -> np.ndarray:
        """``n`` lengths as int64; ``role`` ('input' / 'output') selects the ShareGPT fit."""
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)
        if self.kind == "lognormal":
            mu, sigma = math.log(self.mean) - self.sigma**2 / 2, self.sigma
            low, high = self.low, (self.high or None)
        else:  # sharegpt
            fit = SHAREGPT_INPUT if role == "input" else SHAREGPT_OUTPUT
            mu, sigma, low, high = fit["log_mu"], fit["log_sigma"], fit["min"], fit["max"]
        raw = np.clip(np.rint(rng.lognormal(mu, sigma, n)), low, high)
        out = np.minimum(raw, 1 << 40).astype(np.int64)
        if n and int(out.max()) > MAX_TOKENS_PER_FIELD:
            raise WorkloadError(
                f"{role}_len: the lognormal draws a length of {int(out.max())} tokens, above "
                f"{MAX_TOKENS_PER_FIELD}; set 'high' to clip it, or lower mean / sigma"
            )
        return out


def _arrivals(
    rate: float,
    burstiness: float,
    seed: int,
    num_requests: int | None,
    duration_s: float | None,
) -> np.ndarray:
    """Integer-ns arrival times (see the module docstring)."""
    if math.isinf(rate):
        if num_requests is None:
            raise WorkloadError("rate=inf needs num_requests (a duration makes no sense)")
        return np.zeros(num_requests, dtype=np.int64)
    rs = np.random.RandomState(seed)
    return gap_arrivals(rs, rate, burstiness, num_requests, duration_s)


def _number(name: str, value: Any, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value):
        raise WorkloadError(f"synthetic: {name} must be a number, got {value!r}")
    if not value > 0 or (math.isinf(value) and not allow_inf):
        what = "> 0 (inf: every arrival at t = 0)" if allow_inf else "finite and > 0"
        raise WorkloadError(f"synthetic: {name} must be {what}, got {value!r}")
    return float(value)


def _integer(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or not low <= value <= high:
        raise WorkloadError(f"synthetic: {name} must be an int in [{low}, {high}], got {value!r}")
    return int(value)


def synthetic(
    rate: float,
    num_requests: int | None = None,
    duration_s: float | None = None,
    input_len: LengthDist | int | str | dict[str, Any] = "sharegpt",
    output_len: LengthDist | int | str | dict[str, Any] = "sharegpt",
    seed: int = 0,
    burstiness: float = 1.0,
    shared_prefix_len: int = 0,
    num_prefix_groups: int = 1,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    id_prefix: str = "",
    *,
    max_model_len: int | None = None,
    max_total_tokens: int | None = None,
    placeholder_ids: bool = False,
) -> list[RequestSpec]:
    """A deterministic synthetic workload, sorted by arrival.

    Exactly one of ``num_requests`` / ``duration_s`` (all arrivals <= duration) is given.
    ``rate`` is requests/s (``inf``: all at t = 0). Prompt ids are uniform in
    ``[0, vocab_size)``; with ``shared_prefix_len > 0`` each request is assigned one of
    ``num_prefix_groups`` groups (uniformly at random) and its prompt starts with that
    group's first ``min(prompt_len, shared_prefix_len)`` ids, the rest being its own.
    ``output_ids`` are left ``None`` (the engine generates unique ones).

    ``max_model_len``: when given, a request whose input + output length exceeds it is
    refused (vLLM rejects it). ``max_total_tokens``: the token budget (prompt + output over
    all requests; default ``workloads.limits.MAX_TOTAL_TOKENS``), checked before any id is
    drawn.

    ``placeholder_ids``: no ids are drawn; each prompt is a lazy ``range`` of unique ids from
    ``workloads.limits.PLACEHOLDER_ID_BASE`` (as ``read_jsonl`` gives a trace without ids: no
    prefix shared between requests), the arrivals and lengths those of the random-id workload
    with the same arguments. Not with ``shared_prefix_len > 0``.
    """
    check_max_model_len_arg(max_model_len, "synthetic")
    check_budget_arg(max_total_tokens, "synthetic")
    budget = MAX_TOTAL_TOKENS if max_total_tokens is None else max_total_tokens
    raise_hint = "or pass synthetic(..., max_total_tokens=N) if the run really needs that many"
    if (num_requests is None) == (duration_s is None):
        raise WorkloadError("synthetic: give exactly one of num_requests or duration_s")
    in_dist = LengthDist.parse(input_len, "input_len")
    out_dist = LengthDist.parse(output_len, "output_len")
    # The most requests the budget can hold, each at its shortest.
    max_requests = max(1, budget // (in_dist.min_len("input") + out_dist.min_len("output")))
    rate = _number("rate (req/s)", rate, allow_inf=True)
    if num_requests is not None:
        if isinstance(num_requests, Integral) and num_requests > max_requests >= 1:
            raise WorkloadError(
                f"synthetic: num_requests={num_requests} cannot fit the token budget {budget} "
                f"(at most {max_requests} requests of the shortest lengths drawn); use fewer "
                f"requests, {raise_hint}"
            )
        num_requests = _integer("num_requests", num_requests, 1, max_requests)
    if duration_s is not None:
        duration_s = _number("duration_s", duration_s)
        if math.isinf(rate):
            raise WorkloadError("rate=inf needs num_requests (a duration makes no sense)")
        if rate * duration_s > max_requests:
            raise WorkloadError(
                f"synthetic: rate x duration_s = {rate * duration_s:.4g} expected requests "
                f"cannot fit the token budget {budget} (at most {max_requests} requests of the "
                f"shortest lengths drawn); lower the rate or the duration, {raise_hint}"
            )
    burstiness = _number("burstiness", burstiness)
    seed, shared_prefix_len, num_prefix_groups, vocab_size = _content_args(
        seed, shared_prefix_len, num_prefix_groups, vocab_size, budget
    )
    arrivals = _arrivals(rate, burstiness, seed, num_requests, duration_s)
    if len(arrivals) == 0:
        raise WorkloadError(
            f"synthetic: no arrival within duration_s={duration_s} at rate={rate}; "
            "raise the duration or the rate"
        )
    return _fill(arrivals, in_dist, out_dist, seed, shared_prefix_len, num_prefix_groups,
                 vocab_size, id_prefix, max_model_len, budget, raise_hint, placeholder_ids)


def synthetic_requests(
    load: Load,
    input_len: LengthDist | int | str | dict[str, Any] = "sharegpt",
    output_len: LengthDist | int | str | dict[str, Any] = "sharegpt",
    seed: int = 0,
    shared_prefix_len: int = 0,
    num_prefix_groups: int = 1,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    id_prefix: str = "",
    *,
    max_model_len: int | None = None,
    max_total_tokens: int | None = None,
) -> list[RequestSpec]:
    """``synthetic`` with any arrival process: a ``workloads.arrivals.Load`` (stages,
    ``constant`` arrivals). For a Poisson or gamma load without stages the requests are
    those of ``synthetic`` with ``burstiness = load.burstiness``, id for id."""
    check_max_model_len_arg(max_model_len, "synthetic")
    check_budget_arg(max_total_tokens, "synthetic")
    budget = MAX_TOTAL_TOKENS if max_total_tokens is None else max_total_tokens
    raise_hint = (
        "or pass synthetic_requests(..., max_total_tokens=N) if the run really needs that many"
    )
    in_dist = LengthDist.parse(input_len, "input_len")
    out_dist = LengthDist.parse(output_len, "output_len")
    max_requests = max(1, budget // (in_dist.min_len("input") + out_dist.min_len("output")))
    check_load_fits(load, max_requests, budget, "synthetic", raise_hint)
    seed, shared_prefix_len, num_prefix_groups, vocab_size = _content_args(
        seed, shared_prefix_len, num_prefix_groups, vocab_size, budget
    )
    arrivals = load.times(seed)
    if len(arrivals) == 0:
        raise WorkloadError(
            f"synthetic: the load draws no arrival ({load.expected_requests():.3g} expected); "
            "raise the duration or the rate"
        )
    return _fill(arrivals, in_dist, out_dist, seed, shared_prefix_len, num_prefix_groups,
                 vocab_size, id_prefix, max_model_len, budget, raise_hint)


def check_load_fits(load: Load, max_requests: int, budget: int, who: str, hint: str) -> None:
    """Refuse, before any arrival is drawn, a load whose expected request count exceeds the
    ``max_requests`` the token budget holds."""
    expected = load.expected_requests()
    if expected > max_requests:
        raise WorkloadError(
            f"{who}: the load's {expected:.4g} expected requests cannot fit the token budget "
            f"{budget} (at most {max_requests} requests of the shortest lengths); use fewer "
            f"requests, a lower rate or shorter stages, {hint}"
        )


def _content_args(
    seed: Any, shared_prefix_len: Any, num_prefix_groups: Any, vocab_size: Any, budget: int
) -> tuple[int, int, int, int]:
    seed = _integer("seed", seed, 0, 2**32 - 1)
    shared_prefix_len = _integer("shared_prefix_len", shared_prefix_len, 0, MAX_TOKENS_PER_FIELD)
    num_prefix_groups = _integer("num_prefix_groups", num_prefix_groups, 1, budget)
    if shared_prefix_len * num_prefix_groups > budget:
        raise WorkloadError(
            f"synthetic: {num_prefix_groups} prefix groups x shared_prefix_len "
            f"{shared_prefix_len} = {shared_prefix_len * num_prefix_groups} ids, above the "
            f"token budget {budget}; use fewer groups or shorter prefixes"
        )
    vocab_size = _integer("vocab_size", vocab_size, 2, MAX_TOKEN_ID + 1)
    return seed, shared_prefix_len, num_prefix_groups, vocab_size


def _fill(
    arrivals: np.ndarray,
    in_dist: LengthDist,
    out_dist: LengthDist,
    seed: int,
    shared_prefix_len: int,
    num_prefix_groups: int,
    vocab_size: int,
    id_prefix: str,
    max_model_len: int | None,
    budget: int,
    raise_hint: str,
    placeholder_ids: bool = False,
) -> list[RequestSpec]:
    """Lengths and prompt ids for the given arrivals (each its own seeded stream)."""
    if placeholder_ids and shared_prefix_len > 0:
        raise WorkloadError("synthetic: placeholder_ids share no prefix; use shared_prefix_len=0 "
                            "or random ids")
    n = len(arrivals)
    in_rng, out_rng, ids_rng, group_rng = (np.random.default_rng([seed, k]) for k in range(1, 5))
    in_lens = in_dist.sample(in_rng, n, "input")
    out_lens = out_dist.sample(out_rng, n, "output")
    if max_model_len is not None:
        over = np.flatnonzero(in_lens + out_lens > max_model_len)
        if len(over):
            i = int(over[0])
            raise WorkloadError(
                f"synthetic: request {i} draws {int(in_lens[i])} input + {int(out_lens[i])} "
                f"output tokens > max_model_len={max_model_len} ({len(over)} of {n} requests "
                "do; vLLM rejects them); clip input_len / output_len below it or raise "
                "max_model_len"
            )
    total = int(in_lens.sum()) + int(out_lens.sum())
    if total > budget:
        raise WorkloadError(
            f"synthetic: {n} requests draw {total} tokens (input + output), above the token "
            f"budget {budget}; use fewer requests or shorter lengths, {raise_hint}"
        )

    if placeholder_ids:
        out_specs: list[RequestSpec] = []
        base = PLACEHOLDER_ID_BASE
        for i, (length, olen) in enumerate(zip(in_lens.tolist(), out_lens.tolist(), strict=True)):
            out_specs.append(RequestSpec(f"{id_prefix}{i}", int(arrivals[i]),
                                         range(base, base + length), olen))
            base += length
        return out_specs
    flat = ids_rng.integers(0, vocab_size, size=int(in_lens.sum()), dtype=np.int64)
    prefixes: np.ndarray | None = None
    groups: np.ndarray | None = None
    if shared_prefix_len > 0:
        prefixes = ids_rng.integers(
            0, vocab_size, size=(num_prefix_groups, shared_prefix_len)
        ).astype(np.int64)
        groups = group_rng.integers(0, num_prefix_groups, size=n)

    out: list[RequestSpec] = []
    pos = 0
    for i in range(n):
        length = int(in_lens[i])
        prompt = flat[pos : pos + length]
        pos += length
        if prefixes is not None and groups is not None:
            k = min(length, shared_prefix_len)
            prompt = prompt.copy()
            prompt[:k] = prefixes[groups[i], :k]
        out.append(
            RequestSpec(
                f"{id_prefix}{i}", int(arrivals[i]), array("q", prompt.tobytes()), int(out_lens[i])
            )
        )
    return out
