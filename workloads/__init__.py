"""Workloads: read/write the reference JSONL replay format and generate synthetic traces."""

from workloads.errors import WorkloadError
from workloads.jsonl import read_jsonl, write_jsonl
from workloads.synthetic import LengthDist, synthetic

__all__ = ["LengthDist", "WorkloadError", "read_jsonl", "synthetic", "write_jsonl"]
