"""What a process pays to load a latency bundle the first time: each sweep actor, the sweep's
driver (its preflight) and each capacity probe worker load the bundles of the points they
run once.

Each measurement is a fresh Python process of the tree measured that loads the bundles below
(``profiles.bundle.load_bundle``, its in-process cache cleared) and reports the CPU seconds
of the load alone, imports excluded: the roofline bundle of ``mem_util_grid`` (Llama-3.1-8B
on one L40S, generated once into a temporary cache before timing) and, when
``$SERVESWEEP_DATA`` has them, the measured RTX PRO 6000 bundles. With ``--compare REV`` the
same on git revision REV (``revision_tree.checkout``), alternating, ``--repeat`` times.

    python benchmarks/bundle_load.py [--compare REV] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

MEASURE = r"""
import json, os, sys, time
from pathlib import Path
from profiles.bundle import clear_bundle_cache, load_bundle
from profiles.catalog import load_hardware, load_model
from profiles.roofline.generate import ensure_bundle
cache = Path(sys.argv[1])
roofline = ensure_bundle(load_hardware("L40S"), load_model("meta-llama/Llama-3.1-8B"), 1,
                         cache=cache)
measured = Path(os.environ.get("SERVESWEEP_DATA", "")) / "llmservingsim" / "profiles"
dirs = [roofline] + sorted(p.parent for p in measured.glob("*/*/*/*/meta.yaml"))
clear_bundle_cache()
out = {}
for d in dirs:
    c0 = time.process_time()
    load_bundle(d)
    out[str(d.relative_to(cache) if d.is_relative_to(cache) else d.relative_to(measured))] = (
        time.process_time() - c0)
print(json.dumps(out))
"""


def _measure(tree: Path, cache: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(cache)], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the measurement failed:\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", metavar="REV")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": REPO}
        if args.compare:
            from revision_tree import checkout

            trees[args.compare] = checkout(args.compare, Path(tmp) / "rev")
        caches = {name: Path(tmp) / f"cache_{i}" for i, name in enumerate(trees)}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for name, tree in trees.items():  # warm: generate the roofline bundle, fill caches
            _measure(tree, caches[name])
        for _ in range(args.repeat):
            for name, tree in trees.items():
                runs[name].append(_measure(tree, caches[name]))
    bundles = list(runs["this tree"][0])
    print(f"CPU ms to load a bundle in a fresh process, median of {args.repeat} (min..max)")
    print(f"  {'bundle':<58}" + "".join(f"{name:>22}" for name in trees))
    for bundle in bundles:
        cells = []
        for name in trees:
            values = [1e3 * r[bundle] for r in runs[name]]
            cells.append(f"{statistics.median(values):8.1f} ({min(values):.1f}..{max(values):.1f})")
        print(f"  {bundle[-58:]:<58}" + "".join(f"{c:>22}" for c in cells))
    if args.compare:
        ours = sum(statistics.median(r[b] for r in runs["this tree"]) for b in bundles)
        theirs = sum(statistics.median(r[b] for r in runs[args.compare]) for b in bundles)
        print(f"  all bundles: {1e3 * ours:.1f} against {1e3 * theirs:.1f} ms "
              f"({theirs / ours:.2f}x)")


if __name__ == "__main__":
    main()
