"""Argument checks shared by the generators and trace readers (one message style: the caller,
the argument, what it must be, what it got)."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from workloads.errors import WorkloadError
from workloads.limits import MAX_TOKEN_ID, MAX_TOTAL_TOKENS, check_budget_arg

SEED_MAX = 2**32 - 1  # numpy's legacy RandomState takes 32-bit seeds


def check_int(who: str, name: str, value: Any, low: int, high: int) -> int:
    """An int in ``[low, high]`` (an integral float from a config counts as an int)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, Integral) or not low <= value <= high:
        raise WorkloadError(f"{who}: {name} must be an int in [{low}, {high}], got {value!r}")
    return int(value)


def check_number(who: str, name: str, value: Any, low: float, high: float,
                 *, low_open: bool = False) -> float:
    """A finite number in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise WorkloadError(f"{who}: {name} must be a finite number, got {value!r}")
    if value < low or (low_open and value == low) or value > high:
        bracket = "(" if low_open else "["
        raise WorkloadError(f"{who}: {name} must be in {bracket}{low}, {high}], got {value!r}")
    return float(value)


def check_seed(who: str, seed: Any) -> int:
    return check_int(who, "seed", seed, 0, SEED_MAX)


def check_vocab(who: str, vocab_size: Any) -> int:
    return check_int(who, "vocab_size", vocab_size, 2, MAX_TOKEN_ID + 1)


def token_budget(who: str, max_total_tokens: int | None) -> int:
    """The generator's token budget: ``max_total_tokens`` or ``MAX_TOTAL_TOKENS``."""
    check_budget_arg(max_total_tokens, who)
    return MAX_TOTAL_TOKENS if max_total_tokens is None else max_total_tokens


def check_total(who: str, n: int, total: int, budget: int) -> None:
    """Refuse ``n`` requests of ``total`` tokens above the budget (before any id is drawn)."""
    if total > budget:
        raise WorkloadError(
            f"{who}: {n} requests need {total} tokens (input + output), above the token budget "
            f"{budget}; use fewer requests or shorter prompts, or pass "
            f"{who}(..., max_total_tokens=N) if the run really needs that many"
        )


def check_model_len(who: str, index: int, n_in: int, n_out: int, max_model_len: int | None,
                    how_many: int = 1) -> None:
    if max_model_len is not None and n_in + n_out > max_model_len:
        others = f" ({how_many} requests do)" if how_many > 1 else ""
        raise WorkloadError(
            f"{who}: request {index} has {n_in} input + {n_out} output tokens > "
            f"max_model_len={max_model_len}{others}; vLLM rejects such a request: shorten the "
            "prompts or the outputs, or raise max_model_len"
        )
