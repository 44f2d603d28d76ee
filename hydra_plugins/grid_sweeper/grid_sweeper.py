"""``GridSweeper``: the BasicSweeper grid (same ``params`` syntax) minus one composition pass.

Hydra's BasicSweeper composes every job config of a batch once to validate the overrides,
and the launcher then composes each again to run it: two full compositions per grid point
(about 0.15 CPU-s each on a small machine). The ``ray_actor`` launcher composes and validates
every job of a batch before it starts anything (from the files once per config choice,
``ray_actor_launcher.compose``), so that first pass adds nothing there and this sweeper skips
it. With a launcher that composes lazily (``basic``), a bad override surfaces when its job is
reached instead of up front.
"""

# No `from __future__ import annotations` here: Hydra execs plugin modules before they are
# in sys.modules, and dataclasses then cannot resolve string annotations.

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore


@dataclass
class GridSweeperConf:
    _target_: str = "hydra_plugins.grid_sweeper.grid_sweeper.GridSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="grid", node=GridSweeperConf, provider="grid_sweeper"
)


class GridSweeper(BasicSweeper):
    """BasicSweeper whose batches are validated by the launcher, not composed twice."""

    def sweep(self, arguments: list[str]) -> Any:
        """Reserve a sweep directory of this sweep's own before ``multirun.yaml`` is written
        there (``ray_actor_launcher.sweep_dir``), then sweep as BasicSweeper does."""
        from hydra_plugins.ray_actor_launcher.sweep_dir import reserve_in_config

        assert self.config is not None
        reserve_in_config(self.config)
        return super().sweep(arguments)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """No separate composition pass: the launcher composes every job before running."""
