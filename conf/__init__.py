"""Hydra config tree of the sweep app (a package so Hydra can read it via importlib)."""
