"""The workload error type."""

from __future__ import annotations

from engine.specs import ConfigError


class WorkloadError(ConfigError):
    """A workload file or generator argument is wrong; the message names where and the fix."""
