"""What resume costs: hashing a point, and loading the finished-run index of an experiment.

    python benchmarks/reliability_resume.py [--runs 500]

Composes the default point once and times ``sweep.config_hash.point_hash`` on it. Then it
fills a fresh sqlite MLflow store with ``--runs`` finished point runs, shaped like the
recorder's (the default point's flattened config as params, 60 metrics, the hash tag),
and times ``sweep.resume.FinishedIndex.load``. A resumed sweep pays the load once, plus one hash per
point. Prints the measured numbers.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from sweep.config_hash import HASH_KEY, point_hash
from sweep.recorder import flatten, task_config
from sweep.resume import FinishedIndex
from sweep.schema import register
from sweep.store_lock import open_tracker

CONF = Path(__file__).resolve().parents[1] / "conf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        point = task_config(compose("config"))
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        point_hash(point)
    hash_us = (time.perf_counter() - t0) / n * 1e6
    print(f"point_hash: {hash_us:.0f} us per point")

    params = {k: v for k, v in flatten(point).items()}
    metrics = {f"metric_{i}": float(i) for i in range(60)}
    with tempfile.TemporaryDirectory() as tmp:
        tracker = open_tracker(f"sqlite:///{Path(tmp) / 'mlflow.db'}", "bench")
        t0 = time.perf_counter()
        for i in range(args.runs):
            run = tracker.create_run(f"job-{i}", {HASH_KEY: f"{i:024x}"})
            tracker.log_params(run, params)
            tracker.log_metrics(run, metrics)
            tracker.finish(run, "FINISHED")
        fill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        index = FinishedIndex.load(tracker.client, tracker.experiment_id)
        load_s = time.perf_counter() - t0
    assert len(index) == args.runs
    print(f"store filled with {args.runs} runs in {fill_s:.1f} s "
          f"({fill_s / args.runs * 1000:.0f} ms per run, {len(params)} params, {len(metrics)} metrics)")
    print(f"FinishedIndex.load: {load_s:.2f} s for {args.runs} finished runs "
          f"({load_s / args.runs * 1000:.1f} ms per run)")


if __name__ == "__main__":
    main()
