"""The patch a model carries in its config, so that a saved and reloaded model can be patched again.

:func:`~ropekit.hf.patch_model` writes a small JSON-able record under ``model.config.ropekit``
(:data:`CONFIG_KEY`): the design (or AGE pair), the AGE schedule, the allocation, every design's options,
the design each decoder layer resolved to, the ``mrope_section`` used and the ropekit version.
``save_pretrained`` writes it into ``config.json`` with the rest of the config; ``from_pretrained`` reads
it back as a plain config attribute (stock transformers ignores it), and ``patch_model(model)`` with no
design patches the model again from it. :func:`~ropekit.hf.unpatch_model` removes the record.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from torch import nn

CONFIG_KEY = "ropekit"
FORMAT = 2  # bump when the record's fields change meaning (2: config.json saved in ropekit's form, hf/auto.py)

__all__ = ["CONFIG_KEY", "saved_patch", "record", "erase", "arguments", "check_restored"]


def _jsonable(value: Any, what: str) -> Any:
    """``value`` as JSON would give it back (tuples become lists); a TypeError naming ``what`` otherwise."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"patch_model: {what} {value!r} cannot be recorded in the model config (it must be JSON-able: "
            f"numbers, strings, bools, lists, dicts): {e}"
        ) from None


def record(
    config: Any, *, design: Any, age: Any, allocation: Any, options: Mapping[str, Mapping[str, Any]],
    layers: list[str], allocations: Mapping[str, str], sections: list[int], native: Optional[str] = None,
) -> None:
    """Write the patch's record on ``config`` (the top-level model config). ``native``: the layout of the family's
    own M-RoPE the patch used, recorded for families whose layout changed within the tested transformers releases."""
    from .. import __version__

    rec = {
        "format": FORMAT,
        "version": __version__,
        "design": design if isinstance(design, str) else list(design),
        "age": age if age is None or isinstance(age, str) else list(age),
        "allocation": allocation if allocation is None or isinstance(allocation, str) else dict(allocation),
        "options": {k: dict(v) for k, v in options.items()},
        "layers": list(layers),
        "allocations": dict(allocations),
        "sections": [int(s) for s in sections],
    }
    if native is not None:
        rec["native"] = native
    setattr(config, CONFIG_KEY, _jsonable(rec, "the patch (design options, age, allocation)"))


def erase(config: Any) -> None:
    """Remove the record from ``config`` (no-op when there is none)."""
    if CONFIG_KEY in getattr(config, "__dict__", {}):
        delattr(config, CONFIG_KEY)


def saved_patch(model: nn.Module) -> Optional[dict]:
    """The ropekit record in ``model.config`` (a dict), or None when the config holds none."""
    return getattr(getattr(model, "config", None), CONFIG_KEY, None)


def arguments(model: nn.Module, config: Any) -> dict:
    """``patch_model`` keyword arguments that restore the patch recorded in ``config``.

    A ValueError when there is no record (the model was never patched, or saved unpatched) or the record
    is not one this ropekit can read.
    """
    rec = getattr(config, CONFIG_KEY, None)
    if rec is None:
        raise ValueError(
            f"patch_model: no design given and {type(model).__name__}'s config holds no ropekit patch "
            f"(config.{CONFIG_KEY} is written by patch_model and saved by save_pretrained); pass a design, "
            f"e.g. patch_model(model, 'circle', age='alternate')"
        )
    if not isinstance(rec, Mapping) or not {"design", "age", "allocation", "options", "layers"} <= set(rec):
        raise ValueError(
            f"patch_model: config.{CONFIG_KEY} is not a ropekit patch record (got {rec!r}); remove it or pass a design"
        )
    fmt = rec.get("format", FORMAT)
    if isinstance(fmt, bool) or not isinstance(fmt, int):
        raise ValueError(
            f"patch_model: config.{CONFIG_KEY}['format'] must be an int (the record format; this ropekit writes and "
            f"reads {FORMAT}), got {fmt!r}: the config was edited or damaged; remove config.{CONFIG_KEY} or pass "
            f"a design"
        )
    if fmt > FORMAT:
        raise ValueError(
            f"patch_model: config.{CONFIG_KEY} was written by ropekit {rec.get('version')} in record format "
            f"{rec['format']}, newer than this ropekit reads ({FORMAT}); upgrade ropekit or pass a design"
        )
    design = rec["design"] if isinstance(rec["design"], str) else tuple(rec["design"])
    return dict(design=design, age=rec["age"], allocation=rec["allocation"], options=rec["options"])


def check_restored(config_record: Mapping[str, Any], layers: list[str], allocations: Mapping[str, str],
                   sections: list[int]) -> None:
    """After restoring: the layers, allocations and sections must be the ones recorded (same model shape)."""
    want = (config_record["layers"], config_record.get("allocations", allocations),
            config_record.get("sections", sections))
    got = (list(layers), dict(allocations), [int(s) for s in sections])
    if (list(want[0]), dict(want[1]), list(want[2])) != got:
        raise ValueError(
            f"patch_model: the patch recorded in config.{CONFIG_KEY} (layers {want[0]}, allocations {want[1]}, "
            f"sections {want[2]}) does not resolve to the same geometry on this model (layers {got[0]}, "
            f"allocations {got[1]}, sections {got[2]}); was the config edited? pass the design explicitly"
        )
