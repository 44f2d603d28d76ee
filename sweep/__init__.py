"""The sweep application: Hydra configs to simulated points, recorded in MLflow and Parquet.

Importing any ``sweep`` module first makes Arrow allocate from the system allocator
(``ARROW_DEFAULT_MEMORY_POOL=system``, unless the environment chose a pool): Arrow's default
mimalloc pool keeps the pages a point's Parquet and frames freed, so a long-lived actor or
probe worker grows by them; with glibc's allocator 8 ``mem_util_grid`` points in one process
peak at 238 MiB instead of 279 (measured with ``resource.getrusage``). It must be set before
pyarrow is first imported, and processes started from here (Ray's workers) inherit it.
"""

import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
