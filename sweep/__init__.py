"""The sweep application: Hydra configs to simulated points, recorded in MLflow and Parquet.

Importing any ``sweep`` module first makes Arrow allocate from the system allocator
(``ARROW_DEFAULT_MEMORY_POOL=system``, unless the environment chose a pool): Arrow's default
mimalloc pool keeps the pages a point's Parquet and frames freed, so a long-lived actor or
probe worker grows by them; with glibc's allocator 8 ``mem_util_grid`` points in one process
peak at 238 MiB instead of 279 (measured with ``resource.getrusage``). It must be set before
pyarrow is first imported, and processes started from here (Ray's workers) inherit it.

It also keeps numpy's OpenBLAS to one thread (``OPENBLAS_NUM_THREADS=1``, unless the
environment chose a number), as Ray does for its workers (``OMP_NUM_THREADS`` set to the
actor's one CPU): nothing here multiplies matrices, and at import OpenBLAS starts a server
thread per further core that spins before it sleeps, about 0.1 CPU-s a process on two cores
(``python -c "import numpy"``: 0.31–0.36 against 0.21–0.26 CPU-s; one ``python -m sweep``
point, 3.8–4.3 against 3.6–3.9 CPU-s) taken from the core that starts Ray beside it.
"""

import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
