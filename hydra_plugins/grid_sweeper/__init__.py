"""``hydra/sweeper=grid``: Hydra's basic grid sweeper without its up-front composition pass."""
