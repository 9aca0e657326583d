"""Seeded synthetic task generators. Each task draws whole batches from an explicit ``torch.Generator``.

A batch shares one layout (so positions are computed once per batch); questions and answers vary per
sample. Nothing is downloaded.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Batch", "Vocab"]


@dataclass
class Batch:
    """Token ids ``(B, L)``, the layout string they follow, the answer id per sample ``(B,)`` and per-sample
    facts used to break accuracy down (e.g. the target cell)."""

    tokens: torch.Tensor
    layout: str
    target: torch.Tensor
    info: dict = field(default_factory=dict)

    def slice(self, start: int, stop: int) -> "Batch":
        """Samples ``start:stop`` (a rank's share of a global batch)."""
        return Batch(self.tokens[start:stop], self.layout, self.target[start:stop],
                     {k: v[start:stop] for k, v in self.info.items()})


class Vocab:
    """Named blocks of token ids: ``v.add("SYM", 12)`` then ``v["SYM"] + i``; ``len(v)`` is the size."""

    def __init__(self) -> None:
        self._start: dict[str, int] = {}
        self._size: dict[str, int] = {}
        self.n = 0

    def add(self, name: str, count: int = 1) -> "Vocab":
        self._start[name], self._size[name] = self.n, count
        self.n += count
        return self

    def __getitem__(self, name: str) -> int:
        return self._start[name]

    def size(self, name: str) -> int:
        return self._size[name]

    def __len__(self) -> int:
        return self.n
