"""``python -m sweep.capacity +experiment=capacity_search``: max load under SLO per configuration.

The Hydra front of a capacity study (``capacity.run.run_study``; see the ``capacity``
package and docs/capacity.md). Run it *without* ``-m``: the command searches each
configuration's max rate itself over the grid in ``hydra.sweeper.params``.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from capacity.run import run_study
from sweep.gc_policy import freeze_at_exit


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run_study(cfg)


if __name__ == "__main__":
    freeze_at_exit()
    if {"-m", "--multirun"} & set(sys.argv[1:]):
        raise SystemExit("python -m sweep.capacity runs its own search over the grid in "
                         "hydra.sweeper.params: drop -m")
    main()
