"""Hypothesis profiles for the suite.

``ci`` (the default) is derandomized: every property test draws the same examples on every run and every
machine, so the suite never flakes and a failure reproduces as is. ``dev`` draws fresh random examples
each run, for hunting new defects:

    HYPOTHESIS_PROFILE=dev python -m pytest tests/test_properties.py --hypothesis-seed=3

(``--hypothesis-seed`` only matters under ``dev``; the derandomized profile ignores it.) Per-test budgets
(``max_examples``) stay with the tests; neither profile keeps an example database on disk.
"""
import os

from hypothesis import settings

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite in one worker per core (pytest-xdist): each worker's torch on one thread, so the
    # workers do not fight over the cores with thread pools of their own
    import torch

    torch.set_num_threads(1)

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True, database=None)
settings.register_profile("dev", derandomize=False, deadline=None, print_blob=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
