"""Workloads: the reference JSONL replay format, synthetic loads (rates, stages), the
generators people use (inference-perf's shared_prefix, vllm bench serve's random and
prefix_repetition) and production-trace readers (Azure LLM inference, BurstGPT, Mooncake)."""

from workloads.arrivals import ARRIVALS, Load, Stage
from workloads.csv_traces import read_azure, read_burstgpt
from workloads.errors import WorkloadError
from workloads.inference_perf import shared_prefix
from workloads.jsonl import read_jsonl, write_jsonl
from workloads.mooncake import read_mooncake
from workloads.replay import Replay
from workloads.synthetic import LengthDist, synthetic, synthetic_requests
from workloads.vllm_datasets import prefix_repetition, vllm_random

__all__ = [
    "ARRIVALS",
    "LengthDist",
    "Load",
    "Replay",
    "Stage",
    "WorkloadError",
    "prefix_repetition",
    "read_azure",
    "read_burstgpt",
    "read_jsonl",
    "read_mooncake",
    "shared_prefix",
    "synthetic",
    "synthetic_requests",
    "vllm_random",
    "write_jsonl",
]
