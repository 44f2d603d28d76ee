"""``python -m sweep``: see ``sweep.app``."""

import sys

from sweep.app import main

if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        # The launcher has already stopped the actors (and the Ray it started) and the
        # recorder has written the results so far and marked the MLflow parent run KILLED.
        print("\nsweep interrupted: actors stopped, partial results written", file=sys.stderr)
        sys.exit(130)
