"""``python -m sweep``: see ``sweep.app``."""

from sweep.app import main

if __name__ == "__main__":
    main()
