"""``python -m sweep``: see ``sweep.app``."""

import sys

from sweep.app import main

if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        # In a multirun the launcher has already stopped its actors (and the Ray it
        # started); the recorder wrote the points finished so far and marked the MLflow
        # parent run KILLED.
        print("\ninterrupted: stopped (a multirun keeps the points finished so far)",
              file=sys.stderr)
        sys.exit(130)
