"""A progress bar for the sweep: points done and failed, with tqdm's rate and ETA."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """Counts finished and failed jobs; silent when ``enabled`` is false."""

    def __init__(self, total: int, enabled: bool, desc: str = "sweep") -> None:
        self.done = 0
        self.failed = 0
        self._bar = (
            tqdm(total=total, desc=desc, unit="pt", file=sys.stderr, dynamic_ncols=True)
            if enabled
            else None
        )
        self._show()

    def update(self, failed: bool) -> None:
        self.done += 1
        self.failed += int(failed)
        if self._bar is not None:
            self._bar.set_postfix(ok=self.done - self.failed, failed=self.failed, refresh=False)
            self._bar.update(1)

    def _show(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix(ok=self.done - self.failed, failed=self.failed, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
