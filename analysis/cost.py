"""Cost per token, defined once: what a deployment costs per million output tokens served
within the SLO.

**Definition.** ``usd_per_m_output_tokens = usd_per_hour / (good_output_tok_s x 3600) x 1e6``:
the deployment's price per hour (GPUs x price per GPU-hour) over the output tokens per hour
of the requests that met the SLO (``analysis.slo.good_requests``), measured over the
steady-state window below. When no request met the SLO the cost is unattainable: NaN (never
inf; MLflow would store inf as 1.797e308). ``raw_usd_per_m_output_tokens`` is the same price
over *all* finished output tokens in the window, whatever their latency: a throughput figure,
never the cost of meeting the SLO.

**Steady-state window.** Requests are counted by *arrival*: with ``t0`` the first and ``t1``
the last arrival of the run, the window is ``[t0 + WARMUP_FRACTION x (t1 - t0), t1)``, and
``good_output_tok_s`` is the output tokens of the good requests that arrived in it, divided by
its length. The first tenth of the arrivals is warm-up (the system starts empty, so early
requests see shorter queues than in steady state), and counting by arrival keeps the drain out:
requests still finishing after the last arrival count with the load that produced them, not
against a stretched duration. In a steady state every arriving request is served, so this is
the rate at which the deployment serves good tokens, i.e. ``rate x good share x mean output
tokens``. A run whose arrivals span no time (a burst, every request at once, the capacity
search's saturation probe) has no steady state: its window is the benchmark duration, first
arrival to last completion, with every request counted.

Every figure of a cost (sweep metrics, ``results.parquet``, the capacity tables and report,
the fleet table) comes from ``usd_per_m_output_tokens`` and ``cost_metrics`` here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.metrics import RequestMetrics, benchmark_duration_s

WARMUP_FRACTION = 0.1
COST_KEYS = (
    "num_gpus", "usd_per_hour", "window_s", "window_requests", "good_output_tok_s",
    "usd_per_m_output_tokens", "window_output_tok_s", "raw_usd_per_m_output_tokens",
    "good_output_tok_s_per_gpu",
)


@dataclass(frozen=True)
class Window:
    """The steady-state window of one run (ns) and which requests it counts."""

    start_ns: float
    end_ns: float
    counted: np.ndarray  # bool per request: arrived in the window (burst: every request)

    @property
    def seconds(self) -> float:
        return max(self.end_ns - self.start_ns, 0.0) / 1e9


def steady_state_window(pm: RequestMetrics) -> Window:
    """The window of the module docstring."""
    arrival = pm.arrival_ns
    if len(arrival) == 0:
        return Window(0.0, 0.0, np.zeros(0, bool))
    t0, t1 = float(arrival.min()), float(arrival.max())
    if t1 > t0:
        start = t0 + WARMUP_FRACTION * (t1 - t0)
        return Window(start, t1, (arrival >= start) & (arrival < t1))
    end = t0 + benchmark_duration_s(pm) * 1e9
    return Window(t0, end, np.ones(len(arrival), bool))


def output_tok_s(pm: RequestMetrics, mask: np.ndarray, window: Window) -> float:
    """Output tokens per second of the finished requests in ``mask`` counted by ``window``
    (0 for an empty window)."""
    if window.seconds <= 0:
        return 0.0
    counted = mask & pm.finished & window.counted
    return float(pm.output_len[counted].sum()) / window.seconds


def usd_per_m_output_tokens(usd_per_hour: float, tok_s: float) -> float:
    """USD per million output tokens at ``tok_s`` output tokens/s; NaN when ``tok_s`` is not
    positive (no token was served: the cost is unattainable, not infinite)."""
    if not tok_s > 0 or not math.isfinite(tok_s):
        return math.nan
    return usd_per_hour / (tok_s * 3600.0) * 1e6


def cost_metrics(pm: RequestMetrics, good: np.ndarray, usd_per_hour: float,
                 num_gpus: int) -> dict[str, float]:
    """The cost figures of one run (keys ``COST_KEYS``): the deployment's ``usd_per_hour``
    and ``num_gpus``, the window, ``good_output_tok_s`` (the good requests' output tokens/s)
    and ``usd_per_m_output_tokens`` on it, and the raw-throughput figures beside them."""
    window = steady_state_window(pm)
    good_tok_s = output_tok_s(pm, good, window)
    all_tok_s = output_tok_s(pm, np.ones(len(pm), bool), window)
    return {
        "num_gpus": float(num_gpus),
        "usd_per_hour": float(usd_per_hour),
        "window_s": window.seconds,
        "window_requests": float(window.counted.sum()),
        "good_output_tok_s": good_tok_s,
        "usd_per_m_output_tokens": usd_per_m_output_tokens(usd_per_hour, good_tok_s),
        "window_output_tok_s": all_tok_s,
        "raw_usd_per_m_output_tokens": usd_per_m_output_tokens(usd_per_hour, all_tok_s),
        "good_output_tok_s_per_gpu": good_tok_s / num_gpus if num_gpus > 0 else math.nan,
    }
