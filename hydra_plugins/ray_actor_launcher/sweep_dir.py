"""One sweep directory per sweep, even when two sweeps start in the same second.

The default ``hydra.sweep.dir`` is ``multirun/<study>/<timestamp>``: two sweeps started in
the same second would share it and overwrite each other's ``multirun.yaml``, job folders
and ``results.parquet``. ``reserve`` takes an exclusive ``flock`` on ``<dir>/.sweep.lock``
for the life of this process; when another live sweep holds it, the next free
``<dir>-2``, ``<dir>-3``, ... is taken instead. A directory whose sweep has ended (its lock
is free) is reused, so rerunning a sweep into the same explicit ``hydra.sweep.dir``
resumes there. The grid sweeper reserves before it writes ``multirun.yaml``; the launcher
calls it again, gets the same directory back, and releases it when the sweep ends.
"""

from __future__ import annotations

import fcntl
import logging
from pathlib import Path
from typing import IO

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

log = logging.getLogger(__name__)

LOCK_NAME = ".sweep.lock"
_HELD: dict[Path, tuple[Path, IO[str]]] = {}  # configured dir -> (reserved dir, lock file)
MAX_SUFFIX = 1000


def reserve(configured: Path) -> Path:
    """The directory this process's sweep writes to (see the module doc)."""
    configured = configured.absolute()
    for key, (held, _) in _HELD.items():
        if configured in (key, held):  # reserved already (the sweeper, then the launcher)
            return held
    for n in range(1, MAX_SUFFIX + 1):
        candidate = configured if n == 1 else configured.with_name(f"{configured.name}-{n}")
        candidate.mkdir(parents=True, exist_ok=True)
        fh = open(candidate / LOCK_NAME, "a")  # noqa: SIM115 (held until the process ends)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            continue
        if candidate != configured:
            log.warning(f"sweep dir {configured} is in use by another running sweep; "
                        f"this sweep writes to {candidate}")
        _HELD[configured] = (candidate, fh)
        return candidate
    raise RuntimeError(f"hydra.sweep.dir={configured}: {MAX_SUFFIX} sweeps already run there")


def reserve_in_config(config: DictConfig) -> Path:
    """``reserve`` the config's ``hydra.sweep.dir`` and write the answer back into it, also as
    a Hydra override, so every job config composed from ``config`` uses it too."""
    reserved = reserve(Path(str(config.hydra.sweep.dir)))
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.sweep.dir = str(reserved)
        current = OmegaConf.to_container(config.hydra.overrides.hydra, resolve=False)
        assert isinstance(current, list)
        overrides = [o for o in current if not str(o).startswith("hydra.sweep.dir=")]
        quoted = str(reserved).replace("\\", "\\\\").replace("'", "\\'")
        config.hydra.overrides.hydra = [*overrides, f"hydra.sweep.dir='{quoted}'"]
    return reserved


def release(reserved: Path) -> None:
    """End this process's reservation of ``reserved`` (the sweep that wrote there ended)."""
    for configured, (held, fh) in list(_HELD.items()):
        if held == reserved.absolute() or configured == reserved.absolute():
            fh.close()
            del _HELD[configured]
