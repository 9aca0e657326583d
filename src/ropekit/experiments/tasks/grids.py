"""Grid question answering over images and videos of symbol tokens (vectorised, seeded).

An image is an ``h×w`` grid of symbols drawn uniformly from ``K`` symbols (each cell is a distractor
for every question but one); a video is ``t`` such frames. Text follows: filler words (the *gap*),
then a three-token question whose answer is the next token.

Questions (``kind``):

- ``at``       ``Q_AT ROW_r COL_c``  → the symbol at (r, c) of the image
- ``present``  ``Q_PRESENT SYM_s``   → ``YES`` / ``NO`` (half the samples ask for a present symbol)
- ``where``    ``Q_WHERE SYM_s``     → ``CELL_k``, k = r·w + c; s occurs exactly once in the image
- ``which``    ``Q_WHICH SYM_s``     → ``IMG_i``; s occurs exactly once over all images
- ``needle``   ``Q_NEEDLE``          → ``CELL_k`` of the one ``NEEDLE`` token in the video

Every answer is a function of the tokens alone (tests check it by brute force).
"""
from __future__ import annotations

import torch

from . import Batch, Vocab

__all__ = ["grid_vocab", "image_batch", "video_batch", "KINDS"]

KINDS = ("at", "present", "where", "which", "needle")
Q_LEN = 3


def grid_vocab(symbols: int = 12, fillers: int = 8, max_side: int = 8, max_images: int = 4) -> Vocab:
    """The shared vocabulary: symbols, fillers, question words, answers (rows/cols/cells/images)."""
    v = Vocab().add("PAD").add("BOS").add("SEP").add("NEEDLE").add("SYM", symbols).add("FILL", fillers)
    for q in ("Q_AT", "Q_PRESENT", "Q_WHERE", "Q_WHICH", "Q_NEEDLE", "YES", "NO"):
        v.add(q)
    return v.add("ROW", max_side).add("COL", max_side).add("CELL", max_side * max_side).add("IMG", max_images)


def _unique_at(img: torch.Tensor, rows: torch.Tensor, cell: torch.Tensor, K: int, g: torch.Generator) -> torch.Tensor:
    """Make ``img[rows, cell]`` the only occurrence of its symbol in each row of ``img`` (B, N)."""
    s = img[rows, cell]
    clash = img == s[:, None]
    clash[rows, cell] = False
    shift = torch.randint(1, K, img.shape, generator=g)
    return torch.where(clash, (img + shift) % K, img)


def _text(v: Vocab, B: int, gap: int, g: torch.Generator) -> torch.Tensor:
    return v["FILL"] + torch.randint(v.size("FILL"), (B, gap), generator=g)


def image_batch(v: Vocab, B: int, *, h: int, w: int, gap: int, images: int = 1, kinds=("at", "present", "where"),
                g: torch.Generator, at_side: int | None = None) -> Batch:
    """``B`` samples of ``BOS img (SEP img)* FILL^gap question``; ``images > 1`` asks ``which``.

    ``at_side`` limits the rows/cols asked by ``at`` (to ask only coordinates seen in training when the
    grid is larger than the training grid).
    """
    K, N = v.size("SYM"), h * w
    if images < 1 or images > v.size("IMG"):
        raise ValueError(f"`images` must be in 1..{v.size('IMG')}, got {images}")
    if max(h, w) > v.size("ROW"):
        raise ValueError(f"grid {h}x{w} exceeds the vocabulary's max side {v.size('ROW')}")
    img = torch.randint(K, (B, images * N), generator=g)
    rows = torch.arange(B)
    q = torch.full((B, Q_LEN), v["PAD"], dtype=torch.long)
    cell = torch.full((B,), -1, dtype=torch.long)
    img_idx = torch.zeros(B, dtype=torch.long)
    if images > 1:
        kind = torch.full((B,), KINDS.index("which"))
        img_idx = torch.randint(images, (B,), generator=g)
        cell = torch.randint(N, (B,), generator=g)
        img = _unique_at(img, rows, img_idx * N + cell, K, g)
        s = img[rows, img_idx * N + cell]
        q[:, 0], q[:, 1] = v["Q_WHICH"], v["SYM"] + s
        target = v["IMG"] + img_idx
    else:
        choice = torch.tensor([KINDS.index(k) for k in kinds])
        kind = choice[torch.randint(len(choice), (B,), generator=g)]
        side_h, side_w = (min(h, at_side), min(w, at_side)) if at_side else (h, w)
        r = torch.randint(side_h, (B,), generator=g)
        c = torch.randint(side_w, (B,), generator=g)
        k_any = torch.randint(N, (B,), generator=g)
        is_where = kind == KINDS.index("where")
        img = torch.where(is_where[:, None], _unique_at(img, rows, k_any, K, g), img)
        # present: half the time a symbol from the image, else one that is absent (if any)
        present = torch.zeros(B, K, dtype=torch.bool)
        present[rows[:, None], img] = True
        absent_pick = torch.where(present, -1.0, torch.rand(B, K, generator=g)).argmax(1)
        ask_present = (torch.rand(B, generator=g) < 0.5) | present.all(1)
        s_present = torch.where(ask_present, img[rows, k_any], absent_pick)
        at_cell = r * w + c
        target = torch.where(kind == KINDS.index("at"), v["SYM"] + img[rows, at_cell],
                             torch.where(is_where, v["CELL"] + k_any,
                                         torch.where(present[rows, s_present], v["YES"], v["NO"])))
        cell = torch.where(kind == KINDS.index("at"), at_cell, torch.where(is_where, k_any, cell))
        q[:, 0] = torch.where(kind == KINDS.index("at"), v["Q_AT"],
                              torch.where(is_where, v["Q_WHERE"], v["Q_PRESENT"]))
        q[:, 1] = torch.where(kind == KINDS.index("at"), v["ROW"] + r,
                              v["SYM"] + torch.where(is_where, img[rows, k_any], s_present))
        q[:, 2] = torch.where(kind == KINDS.index("at"), v["COL"] + c, q[:, 2])
    parts = [torch.full((B, 1), v["BOS"])]
    for i in range(images):
        if i:
            parts.append(torch.full((B, 1), v["SEP"]))
        parts.append(v["SYM"] + img[:, i * N:(i + 1) * N])
    parts += [_text(v, B, gap, g), q]
    layout = " ".join(["T1"] + [("T1 " if i else "") + f"I{h}x{w}" for i in range(images)] + [f"T{gap + Q_LEN}"])
    return Batch(torch.cat(parts, 1), layout, target, {"kind": kind, "cell": cell, "image": img_idx})


def video_batch(v: Vocab, B: int, *, t: int, h: int, w: int, gap: int, g: torch.Generator,
                frame: torch.Tensor | None = None) -> Batch:
    """``B`` samples of ``BOS video FILL^gap Q_NEEDLE PAD PAD``: where (which cell) is the one needle?

    ``frame`` fixes the needle's frame per sample (default: uniform over the ``t`` frames).
    """
    K, N = v.size("SYM"), h * w
    if max(h, w) > v.size("ROW"):
        raise ValueError(f"frame {h}x{w} exceeds the vocabulary's max side {v.size('ROW')}")
    vid = v["SYM"] + torch.randint(K, (B, t * N), generator=g)
    f = torch.randint(t, (B,), generator=g) if frame is None else frame
    cell = torch.randint(N, (B,), generator=g)
    vid[torch.arange(B), f * N + cell] = v["NEEDLE"]
    q = torch.full((B, Q_LEN), v["PAD"], dtype=torch.long)
    q[:, 0] = v["Q_NEEDLE"]
    tokens = torch.cat([torch.full((B, 1), v["BOS"]), vid, _text(v, B, gap, g), q], 1)
    info = {"kind": torch.full((B,), KINDS.index("needle")), "cell": cell, "frame": f}
    return Batch(tokens, f"T1 V{t}x{h}x{w} T{gap + Q_LEN}", v["CELL"] + cell, info)
