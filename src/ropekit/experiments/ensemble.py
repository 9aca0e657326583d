"""Train several seeds of one design at once: K models stacked into one module that runs K batches in one call.

On a CPU the experiments' models are small (widths 24–64), so a training step costs more in per-operation
overhead than in arithmetic. Stacking the K seeds of one design turns each layer's K small matrix products
into one batched product (``baddbmm``) and every parameter-free operation (attention, the rotary, GELU,
pooling) into one call over K·B samples, so the overhead is paid once per step instead of K times.

The stacked model is built from K ordinary models (:func:`stack`): each parameterised leaf module —
``nn.Linear``, ``nn.LayerNorm``, ``nn.Embedding``, a patchifying ``nn.Conv2d`` (stride = kernel, no
padding) — is replaced by a stacked twin holding the K models' parameters along a new first axis, and a
parameter of shape ``(1, …)`` held directly by a module (the ViT's learned position table) becomes
``(K, …)``. Its input is the K batches concatenated along the batch axis (model k's samples are rows
``k·B … (k+1)·B − 1``) and every row stays in its own model's block through the network, so model k
computes exactly what it would alone. Anything else holding parameters (e.g. RoPE-Mixed's learned
frequencies) is refused with :class:`NotImplementedError`, and the runner trains that design one seed at a
time. :func:`unstack` gives the K ordinary models back, for evaluation.

Per model the optimisation is the one of :func:`ropekit.experiments.train.train`: the loss is the sum of the
K models' mean losses (so model k's gradient is its own), gradients are clipped per model, and AdamW,
being element-wise, updates each model's slice as it would update that model alone.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["stack", "unstack", "StackedLinear", "StackedLayerNorm", "StackedEmbedding", "StackedPatchConv",
           "clip_per_model", "per_model_loss", "supported", "SharedEval"]


class StackedLinear(nn.Module):
    """K linear layers: ``x (K·B, …, in) -> (K·B, …, out)``, weights ``(K, out, in)``."""

    def __init__(self, layers: list[nn.Linear]) -> None:
        super().__init__()
        self.k = len(layers)
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in layers]).clone())
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in layers]).clone()) if layers[0].bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(self.k, -1, shape[-1])
        w = self.weight.transpose(1, 2)
        y = torch.bmm(flat, w) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), flat, w)
        return y.reshape(*shape[:-1], y.shape[-1])

    def member(self, k: int) -> dict:
        return {"weight": self.weight[k], **({"bias": self.bias[k]} if self.bias is not None else {})}


class StackedLayerNorm(nn.Module):
    """K layer norms over the last axis, affine parameters ``(K, D)``."""

    def __init__(self, layers: list[nn.LayerNorm]) -> None:
        super().__init__()
        self.k, self.shape, self.eps = len(layers), layers[0].normalized_shape, layers[0].eps
        if len(self.shape) != 1 or not layers[0].elementwise_affine:
            raise NotImplementedError("stacking supports LayerNorm over the last axis with affine parameters")
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in layers]).clone())
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in layers]).clone()) if layers[0].bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = F.layer_norm(x, self.shape, None, None, self.eps).reshape(self.k, -1, shape[-1])
        y = y * self.weight.unsqueeze(1)
        if self.bias is not None:
            y = y + self.bias.unsqueeze(1)
        return y.reshape(shape)

    def member(self, k: int) -> dict:
        return {"weight": self.weight[k], **({"bias": self.bias[k]} if self.bias is not None else {})}


class StackedEmbedding(nn.Module):
    """K embedding tables ``(K, V, D)``; row block k of the ids looks up in table k."""

    def __init__(self, layers: list[nn.Embedding]) -> None:
        super().__init__()
        m = layers[0]
        if m.padding_idx is not None or m.max_norm is not None or m.sparse:
            raise NotImplementedError("stacking supports plain nn.Embedding only")
        self.k, self.vocab = len(layers), m.num_embeddings
        self.weight = nn.Parameter(torch.stack([e.weight.detach() for e in layers]).clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        per = ids.shape[0] // self.k
        offset = (torch.arange(self.k, device=ids.device) * self.vocab).repeat_interleave(per)
        offset = offset.view(-1, *([1] * (ids.ndim - 1)))
        return F.embedding(ids + offset, self.weight.reshape(-1, self.weight.shape[-1]))

    def member(self, k: int) -> dict:
        return {"weight": self.weight[k]}


class StackedPatchConv(nn.Module):
    """K patchifying convolutions (kernel = stride, no padding, no dilation or groups) as one batched product
    over the unfolded patches: ``(K·B, C, H, W) -> (K·B, D, H/p, W/p)``."""

    def __init__(self, layers: list[nn.Conv2d]) -> None:
        super().__init__()
        m = layers[0]
        if (m.kernel_size != m.stride or m.padding not in ((0, 0), "valid") or m.dilation != (1, 1) or m.groups != 1
                or m.padding_mode != "zeros"):
            raise NotImplementedError("stacking supports patchifying Conv2d only (kernel = stride, no padding)")
        self.k, self.patch = len(layers), m.kernel_size
        self.weight = nn.Parameter(torch.stack([c.weight.detach() for c in layers]).clone())  # (K, D, C, p, q)
        self.bias = nn.Parameter(torch.stack([c.bias.detach() for c in layers]).clone()) if m.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        p, q = self.patch
        gh, gw = h // p, w // q
        patches = x.reshape(n, c, gh, p, gw, q).permute(0, 2, 4, 1, 3, 5).reshape(self.k, -1, c * p * q)
        wt = self.weight.reshape(self.k, self.weight.shape[1], -1).transpose(1, 2)  # (K, C·p·q, D)
        y = torch.bmm(patches, wt) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), patches, wt)
        return y.reshape(n, gh, gw, -1).permute(0, 3, 1, 2)

    def member(self, k: int) -> dict:
        return {"weight": self.weight[k], **({"bias": self.bias[k]} if self.bias is not None else {})}


_LEAVES = {nn.Linear: StackedLinear, nn.LayerNorm: StackedLayerNorm, nn.Embedding: StackedEmbedding,
           nn.Conv2d: StackedPatchConv}


def _stacked_leaf(modules: list[nn.Module]) -> nn.Module | None:
    cls = _LEAVES.get(type(modules[0]))
    return None if cls is None else cls(modules)


def supported(model: nn.Module) -> str | None:
    """None when :func:`stack` can stack copies of ``model``, else the reason it cannot."""
    try:
        stack([model, copy.deepcopy(model)])
    except NotImplementedError as error:
        return str(error)
    return None


def stack(models: list[nn.Module]) -> nn.Module:
    """One module running the K ``models`` (same class and configuration) on K concatenated batches."""
    if not models:
        raise ValueError("stack: give at least one model")
    template = models[0]
    names = [n for n, _ in template.named_modules()]
    for m in models[1:]:
        if type(m) is not type(template) or [n for n, _ in m.named_modules()] != names:
            raise ValueError("stack: the models must have the same class and module structure")
    if any(True for _ in template.buffers()):
        raise NotImplementedError(f"{type(template).__name__} holds buffers; stacking handles parameters only")
    out = copy.deepcopy(template)
    by_name = [dict(m.named_modules()) for m in models]
    replace: dict[str, nn.Module] = {}
    for name, mod in template.named_modules():
        if any(name.startswith(r + ".") for r in replace):
            continue
        if type(mod) in _LEAVES:
            replace[name] = _stacked_leaf([bn[name] for bn in by_name])
            continue
        for pname, p in mod.named_parameters(recurse=False):
            if p.shape[:1] != (1,) or p.ndim < 2:
                raise NotImplementedError(f"cannot stack parameter {name + '.' if name else ''}{pname} of "
                                          f"{type(mod).__name__} (shape {tuple(p.shape)}); train this design "
                                          "one seed at a time")
    for name, new in replace.items():
        parent, _, leaf = name.rpartition(".")
        setattr(out.get_submodule(parent) if parent else out, leaf, new)
    for name, mod in out.named_modules():  # direct (1, ...) parameters: concatenate along that axis
        if isinstance(mod, tuple(_LEAVES.values())):
            continue
        for pname, p in list(mod.named_parameters(recurse=False)):
            full = f"{name}.{pname}" if name else pname
            setattr(mod, pname, nn.Parameter(torch.cat([m.get_parameter(full).detach() for m in models]).clone()))
    out.stacked_k = len(models)
    return out


def unstack(stacked: nn.Module, make) -> list[nn.Module]:
    """The K ordinary models of ``stacked``; ``make()`` builds one fresh model of the original class."""
    k = stacked.stacked_k
    models = [make() for _ in range(k)]
    for i, m in enumerate(models):
        state = {}
        for name, mod in stacked.named_modules():
            prefix = f"{name}." if name else ""
            if hasattr(mod, "member") and isinstance(mod, tuple(_LEAVES.values())):
                state.update({prefix + key: v for key, v in mod.member(i).items()})
            elif not isinstance(mod, tuple(_LEAVES.values())):
                for pname, p in mod.named_parameters(recurse=False):
                    state[prefix + pname] = p[i:i + 1]
        m.load_state_dict({key: v.detach().clone() for key, v in state.items()})
        m.eval()
    return models


def per_model_loss(logits: torch.Tensor, target: torch.Tensor, k: int) -> torch.Tensor:
    """``(K,)`` mean cross-entropy of each model's block of rows (the loss each would compute alone)."""
    loss = F.cross_entropy(logits.float(), target, reduction="none")
    return loss.reshape(k, -1).mean(1)


@torch.no_grad()
def clip_per_model(params: list[nn.Parameter], k: int, max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` for each of the K models: every stacked parameter's gradient has the model on its
    first axis. Returns the K total norms before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = torch.stack([g.reshape(k, -1).norm(dim=1) for g in grads])  # (P, K)
    total = norms.norm(dim=0)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(k, *([1] * (g.ndim - 1))))
    return total


class SharedEval(nn.Module):
    """Model k of a stacked ensemble, for an ``evaluate`` written for one model.

    The K members of one ensemble share a record of calls: member k's i-th call runs the stacked model on the
    K-fold repeated input (all K models at once) unless call i already ran with an equal input, in which case
    it returns that run's k-th block. Evaluating member 0, then 1, … (the same deterministic evaluation for
    each) therefore runs each evaluation batch through all K models once."""

    def __init__(self, stacked: nn.Module, k: int, record: list) -> None:
        super().__init__()
        self.stacked, self.k, self.record, self.calls = stacked, k, record, 0

    def forward(self, x: torch.Tensor, layout=None) -> torch.Tensor:
        i, self.calls = self.calls, self.calls + 1
        if i < len(self.record) and self.record[i][0].shape == x.shape and torch.equal(self.record[i][0], x):
            return self.record[i][1][self.k]
        K = self.stacked.stacked_k
        with torch.no_grad():
            out = self.stacked(x.repeat(K, *([1] * (x.ndim - 1))), layout)
        blocks = out.reshape(K, x.shape[0], *out.shape[1:])
        entry = (x.detach().clone(), blocks)
        if i < len(self.record):
            self.record[i] = entry
        else:
            self.record.append(entry)
        return blocks[self.k]
