"""Synthetic workloads: Poisson / gamma arrivals, length distributions, seeded token ids.

Arrivals follow ``vllm bench serve``: gaps are Gamma(shape = burstiness,
scale = 1 / (rate * burstiness)), so ``burstiness = 1`` is a Poisson process and the
coefficient of variation of the gaps is ``1 / sqrt(burstiness)``. The first request arrives
one gap after t = 0; every gap is truncated to integer ns before accumulating. For
``burstiness == 1`` the gaps are drawn exactly as the reference ShareGPT generator draws
them (numpy's legacy ``RandomState(seed).exponential``), so ``rate = 10, seed = 42`` with
300 requests reproduces the arrival times of the shared ``sharegpt-*-300-sps10`` workloads
to the nanosecond. ``rate = inf`` puts every arrival at 0 (vLLM's default burst).

Input lengths, output lengths, prompt ids and prefix groups each use their own
``numpy.random.default_rng`` stream derived from the seed, so changing one length
distribution moves neither the arrivals nor the other lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.workload import RequestSpec
from workloads.errors import WorkloadError

NS_PER_S = 1_000_000_000
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
        return np.minimum(raw, 1 << 40).astype(np.int64)


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

    def gaps(n: int) -> np.ndarray:
        if burstiness == 1.0:
            g = rs.exponential(1.0 / rate, n)
        else:
            g = rs.gamma(burstiness, 1.0 / (rate * burstiness), n)
        return (g * NS_PER_S).astype(np.int64)  # truncate each gap, like the reference

    if num_requests is not None:
        return np.cumsum(gaps(num_requests))
    horizon = int(duration_s * NS_PER_S)
    chunk = max(64, int(rate * duration_s * 1.2) + 16)
    out = np.cumsum(gaps(chunk))
    while out[-1] <= horizon:
        out = np.concatenate([out, out[-1] + np.cumsum(gaps(chunk))])
    return out[out <= horizon]


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
) -> list[RequestSpec]:
    """A deterministic synthetic workload, sorted by arrival.

    Exactly one of ``num_requests`` / ``duration_s`` (all arrivals <= duration) is given.
    ``rate`` is requests/s (``inf``: all at t = 0). Prompt ids are uniform in
    ``[0, vocab_size)``; with ``shared_prefix_len > 0`` each request is assigned one of
    ``num_prefix_groups`` groups (uniformly at random) and its prompt starts with that
    group's first ``min(prompt_len, shared_prefix_len)`` ids, the rest being its own.
    ``output_ids`` are left ``None`` (the engine generates unique ones).
    """
    if (num_requests is None) == (duration_s is None):
        raise WorkloadError("synthetic: give exactly one of num_requests or duration_s")
    if num_requests is not None and (type(num_requests) is not int or num_requests < 1):
        raise WorkloadError(f"synthetic: num_requests must be an int >= 1, got {num_requests!r}")
    if duration_s is not None and not duration_s > 0:
        raise WorkloadError(f"synthetic: duration_s must be > 0, got {duration_s!r}")
    if not rate > 0:
        raise WorkloadError(f"synthetic: rate (req/s) must be > 0, got {rate!r}")
    if not burstiness > 0:
        raise WorkloadError(f"synthetic: burstiness must be > 0, got {burstiness!r}")
    if shared_prefix_len < 0 or num_prefix_groups < 1:
        raise WorkloadError(
            "synthetic: shared_prefix_len must be >= 0 and num_prefix_groups >= 1, got "
            f"{shared_prefix_len} / {num_prefix_groups}"
        )
    if vocab_size < 2:
        raise WorkloadError(f"synthetic: vocab_size must be >= 2, got {vocab_size}")
    in_dist = LengthDist.parse(input_len, "input_len")
    out_dist = LengthDist.parse(output_len, "output_len")

    arrivals = _arrivals(float(rate), float(burstiness), seed, num_requests, duration_s)
    n = len(arrivals)
    if n == 0:
        raise WorkloadError(
            f"synthetic: no arrival within duration_s={duration_s} at rate={rate}; "
            "raise the duration or the rate"
        )
    in_rng, out_rng, ids_rng, group_rng = (np.random.default_rng([seed, k]) for k in range(1, 5))
    in_lens = in_dist.sample(in_rng, n, "input")
    out_lens = out_dist.sample(out_rng, n, "output")

    flat = ids_rng.integers(0, vocab_size, size=int(in_lens.sum()), dtype=np.int64).tolist()
    prefixes: list[list[int]] = []
    groups: list[int] = []
    if shared_prefix_len > 0:
        prefixes = (
            ids_rng.integers(0, vocab_size, size=(num_prefix_groups, shared_prefix_len))
            .astype(np.int64)
            .tolist()
        )
        groups = group_rng.integers(0, num_prefix_groups, size=n).tolist()

    out: list[RequestSpec] = []
    pos = 0
    for i in range(n):
        length = int(in_lens[i])
        prompt = flat[pos : pos + length]
        pos += length
        if prefixes:
            k = min(length, shared_prefix_len)
            prompt[:k] = prefixes[groups[i]][:k]
        out.append(
            RequestSpec(f"{id_prefix}{i}", int(arrivals[i]), tuple(prompt), int(out_lens[i]))
        )
    return out
