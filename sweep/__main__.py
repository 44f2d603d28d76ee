"""``python -m sweep``: see ``sweep.app``."""

import sys

from sweep.gc_policy import freeze_at_exit, long_lived

with long_lived():  # the app's modules live as long as the process (sweep.gc_policy)
    from sweep.app import main

# Studies that search (their points depend on earlier results) run under their own driver.
SEARCH_STUDIES = ("capacity_search", "fleet_sizing")

if __name__ == "__main__":
    freeze_at_exit()
    for arg in sys.argv[1:]:
        if arg.startswith("+experiment=") and arg.split("=", 1)[1] in SEARCH_STUDIES:
            study = arg.split("=", 1)[1]
            sys.exit(
                f"{study} is a capacity search, not a grid: run it with "
                f"`python -m sweep.capacity +experiment={study}` (without -m); see docs/capacity.md"
            )
    try:
        main()
    except KeyboardInterrupt:
        # In a multirun the launcher has already stopped its actors (and the Ray it
        # started); the recorder wrote the points finished so far and marked the MLflow
        # parent run KILLED.
        print("\ninterrupted: stopped (a multirun keeps the points finished so far)",
              file=sys.stderr)
        sys.exit(130)
