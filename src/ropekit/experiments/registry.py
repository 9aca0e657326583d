"""The experiments ropekit can run: ``register`` one, ``get`` it by name, ``experiments()`` lists them."""
from __future__ import annotations

import importlib

from .base import Experiment

__all__ = ["register", "get", "experiments"]

_EXPERIMENTS: dict[str, Experiment] = {}
# modules that define (and register) experiments; imported lazily on first lookup
MODULES = ("ropekit.experiments.crossmodal", "ropekit.experiments.video", "ropekit.experiments.resolution",
           "ropekit.experiments.isotropy", "ropekit.experiments.shapebias",
           "ropekit.experiments.pointcloud")


def register(exp: Experiment) -> Experiment:
    _EXPERIMENTS[exp.name] = exp
    return exp


def _load() -> None:
    for m in MODULES:
        importlib.import_module(m)


def experiments() -> list[str]:
    _load()
    return list(_EXPERIMENTS)


def get(name: str) -> Experiment:
    _load()
    if name not in _EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(_EXPERIMENTS)} "
                         f"(`ropekit experiment --list` says what each tests)")
    return _EXPERIMENTS[name]
