"""Workloads: the reference JSONL replay format, synthetic loads (rates, stages) and the
generators people use (inference-perf's shared_prefix, vllm bench serve's random and
prefix_repetition)."""

from workloads.arrivals import ARRIVALS, Load, Stage
from workloads.errors import WorkloadError
from workloads.inference_perf import shared_prefix
from workloads.jsonl import read_jsonl, write_jsonl
from workloads.synthetic import LengthDist, synthetic, synthetic_requests
from workloads.vllm_datasets import prefix_repetition, vllm_random

__all__ = [
    "ARRIVALS",
    "LengthDist",
    "Load",
    "Stage",
    "WorkloadError",
    "prefix_repetition",
    "read_jsonl",
    "shared_prefix",
    "synthetic",
    "synthetic_requests",
    "vllm_random",
    "write_jsonl",
]
