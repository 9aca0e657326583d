"""Small controlled experiments that put the papers' claims to trained models (``ropekit experiment``).

Pieces: ``tasks/`` (seeded synthetic data), ``models`` (decoder with a design per layer), ``train``
(the loop), ``stats`` (intervals and verdicts), ``runner`` (designs × seeds), ``registry`` (the
experiments; each is one module such as ``crossmodal``).
"""
from .registry import experiments, get, register
from .runner import aggregate, run_experiment, summary_table

__all__ = ["experiments", "get", "register", "run_experiment", "aggregate", "summary_table"]
