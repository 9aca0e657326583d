"""A saved patched model loads as itself: through transformers' Auto classes patched, never silently as the stock model.

``save_pretrained`` of a patched model writes a ``config.json`` that only ropekit reads:

- ``model_type`` is ``"ropekit"`` (the family's own type is kept in the ``ropekit`` record), so transformers
  without ropekit refuses the checkpoint by name ("model type `ropekit` … does not recognize this architecture");
- every ``rope_type`` of the config's rope parameters is ``"ropekit"`` (the originals are kept in the record), so
  even the family's own class cannot build the stock model from it: its rotary has no ``"ropekit"`` initialiser;
- every name in ``architectures`` begins with ``Ropekit`` (``RopekitQwen2VLForConditionalGeneration``), and stays so
  when ropekit reads the config back: a serving engine that picks its model class by that name (vLLM) refuses the
  checkpoint unless ropekit's plugin registered the name, even where ropekit is installed and its config form read.

With ropekit imported (before or after transformers), ``AutoConfig`` knows the ``"ropekit"`` type: it restores the
family's config, and ``AutoModel``, ``AutoModelForImageTextToText``, ``AutoModelForCausalLM`` (and ``pipeline``,
which loads through them) build the family's model and patch it from the record. The family's own class is
refused with the way to load it; :func:`from_pretrained` loads with a class of your choice, patched.
:func:`load_stock` loads the stock model from such a checkpoint on purpose.
In memory a patched model's config keeps its family's type; only the saved form differs.
"""
from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import json
import os
import sys
from typing import Any, Optional

SAVED_TYPE = "ropekit"
#: what a saved checkpoint's ``architectures`` begin with: a serving engine that chooses its model class by this name
#: (vLLM) finds none unless ropekit's plugin registered it, so it cannot serve the checkpoint with stock positions
ARCH_PREFIX = "Ropekit"
_AUTO_CLASSES = ("AutoModel", "AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModelForMultimodalLM")
_CLASSES: dict[str, type] = {}

__all__ = ["SAVED_TYPE", "register", "from_pretrained", "load_stock", "saved_form", "restored_form"]


# --------------------------------------------------------------------------------------------------
# the saved form of a config dict, and back


def _rope_dicts(d: Any, path: tuple = ()):
    """Every rope-parameters dict (one holding ``rope_type``) under ``rope_parameters``/``rope_scaling`` keys of a
    config dict, with its path of keys."""
    if not isinstance(d, dict):
        return
    for key, value in d.items():
        if key in ("rope_parameters", "rope_scaling") and isinstance(value, dict):
            if "rope_type" in value:
                yield path + (key,), value
            for sub, inner in value.items():  # per layer type (Gemma 3: full / sliding attention)
                if isinstance(inner, dict) and "rope_type" in inner:
                    yield path + (key, sub), inner
        elif isinstance(value, dict) and not any(k in key for k in ("vision", "audio", "visual")):
            yield from _rope_dicts(value, path + (key,))  # the language model's; encoders keep their own


def saved_form(d: dict) -> dict:
    """A patched model's config dict as ``save_pretrained`` writes it (see the module doc)."""
    rec = d.get("ropekit")
    if not isinstance(rec, dict) or d.get("model_type") == SAVED_TYPE:
        return d
    d = copy.deepcopy(d)
    rec = d["ropekit"]
    rec["family"] = d["model_type"]  # not under "model_type": transformers would read this dict as the config
    rec["rope_types"] = {}
    for path, rope in _rope_dicts(d):
        rec["rope_types"][".".join(path)] = rope["rope_type"]
        rope["rope_type"] = SAVED_TYPE
    d["model_type"] = SAVED_TYPE
    if isinstance(d.get("architectures"), list):  # engines that pick a class by name refuse it unless they know ropekit
        d["architectures"] = [a if a.startswith(ARCH_PREFIX) else ARCH_PREFIX + a for a in d["architectures"]]
    return d


def restored_form(d: dict, *, keep_record: bool = True) -> dict:
    """The family's own config dict from the saved form (``keep_record=False`` also drops the patch record)."""
    rec = d.get("ropekit")
    if d.get("model_type") != SAVED_TYPE:
        return d
    if not isinstance(rec, dict) or not isinstance(rec.get("family"), str):
        raise ValueError(
            f"ropekit: config.json has model_type {SAVED_TYPE!r} but no ropekit record naming the model's own type "
            f"(config['ropekit']['family']); the file was edited or damaged"
        )
    d = copy.deepcopy(d)
    rec = d["ropekit"]
    d["model_type"] = rec.pop("family")
    types = rec.pop("rope_types", {}) or {}
    for path, rope in _rope_dicts(d):
        key = ".".join(path)
        if rope.get("rope_type") == SAVED_TYPE:
            if key not in types:
                raise ValueError(f"ropekit: config.json's rope parameters at {key!r} have no recorded rope_type; the "
                                 f"file was edited or damaged")
            rope["rope_type"] = types[key]
    if not keep_record:
        d.pop("ropekit")
        if isinstance(d.get("architectures"), list):
            d["architectures"] = [a[len(ARCH_PREFIX):] if a.startswith(ARCH_PREFIX) else a for a in d["architectures"]]
    return d


# --------------------------------------------------------------------------------------------------
# classes: a family's config that saves in ropekit's form, and models that patch themselves


class _SavesPatched:
    """Mixin for a family's config class: ``to_dict`` gives the saved form while the config holds a patch record."""

    def to_dict(self):  # noqa: D401 - transformers' method
        return saved_form(super().to_dict())


def family_config_class(base: type) -> type:
    """The config class a patched model of ``base``'s family carries: ``base`` that saves in ropekit's form."""
    name = "Ropekit" + base.__name__
    if name not in _CLASSES:
        cls = type(name, (_SavesPatched, base), {"__module__": __name__, "__doc__": _SavesPatched.__doc__})
        _CLASSES[name] = cls
        globals()[name] = cls  # picklable by name
    return _CLASSES[name]


def mark(config: Any) -> None:
    """Give a patched model's config the class that saves it in ropekit's form (its family's type in memory)."""
    if not isinstance(config, _SavesPatched):
        config.__class__ = family_config_class(type(config))


def unmark(config: Any) -> None:
    """Undo :func:`mark`: the family's own config class again."""
    if isinstance(config, _SavesPatched):
        config.__class__ = next(c for c in type(config).__mro__[1:] if not issubclass(c, _SavesPatched))


def _patched_model_class(base: type, config_class: type) -> type:
    name = "Ropekit" + base.__name__
    if name not in _CLASSES:
        def __init__(self, config, *args, **kwargs):
            base.__init__(self, config, *args, **kwargs)
            from .patch import patch_model

            patch_model(self)  # from the record in its config

        cls = type(name, (base,), {"__module__": __name__, "__init__": __init__, "config_class": config_class,
                                   "__doc__": f"{base.__name__}, patched by ropekit from its config's record."})
        _CLASSES[name] = cls
        globals()[name] = cls
        _same_checkpoint_names(cls, base)
    return _CLASSES[name]


def _same_checkpoint_names(cls: type, base: type) -> None:
    """transformers renames a family's checkpoint keys by the model's class or type, and skips classes defined
    outside it: the subclass reads and writes the family's checkpoints under the family's own renaming."""
    try:
        from transformers.conversion_mapping import (get_checkpoint_conversion_mapping,
                                                      register_checkpoint_conversion_mapping)
    except ImportError:  # a transformers without per-model renaming: nothing to share
        return
    mapping = get_checkpoint_conversion_mapping(base.__name__) or get_checkpoint_conversion_mapping(
        base.config_class.model_type)
    register_checkpoint_conversion_mapping(cls.__name__, mapping or [], overwrite=True)


def _register_models(config_class: type, base_config: type) -> None:
    """Register, for every Auto class that maps ``base_config``, a model class that patches itself."""
    import transformers

    for auto_name in _AUTO_CLASSES:
        auto = getattr(transformers, auto_name, None)
        if auto is None:
            continue
        try:
            stock = auto._model_mapping[base_config]
        except (KeyError, ValueError):
            continue
        if isinstance(stock, (list, tuple)):
            stock = stock[0]
        auto.register(config_class, _patched_model_class(stock, config_class), exist_ok=True)


def _ropekit_config_class() -> type:
    """The config class transformers' AutoConfig finds for ``model_type == "ropekit"``: it builds the family's."""
    if "RopekitConfig" in _CLASSES:
        return _CLASSES["RopekitConfig"]
    from transformers import PreTrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    class RopekitConfig(PreTrainedConfig):
        """Stands for every patched checkpoint's config: ``from_dict`` restores and returns the family's own."""

        model_type = SAVED_TYPE

        @classmethod
        def from_dict(cls, config_dict, **kwargs):
            restored = restored_form(dict(config_dict))
            family = restored["model_type"]
            try:
                base = CONFIG_MAPPING[family]
            except KeyError:
                raise ValueError(f"ropekit: the checkpoint is a patched {family!r} model, which this transformers "
                                 f"does not know") from None
            config_class = family_config_class(base)
            _register_models(config_class, base)
            return config_class.from_dict(restored, **kwargs)

    RopekitConfig.__module__ = __name__
    _CLASSES["RopekitConfig"] = RopekitConfig
    globals()["RopekitConfig"] = RopekitConfig
    return RopekitConfig


def _refuse_family_class(config, *args, **kwargs):
    raise ValueError(
        "ropekit: this checkpoint was saved from a model patched by ropekit (its rope_type is 'ropekit'); the "
        "family's own class would build the stock model from it. Load it with transformers' Auto classes "
        "(AutoModelForImageTextToText.from_pretrained / AutoModel.from_pretrained, pipeline), which patch it from "
        "its config, or load the stock model on purpose with ropekit.hf.load_stock(path)"
    )


def register() -> None:
    """Teach the imported transformers ropekit's saved form (idempotent)."""
    if "registered" in _CLASSES:
        return
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    AutoConfig.register(SAVED_TYPE, _ropekit_config_class(), exist_ok=True)
    ROPE_INIT_FUNCTIONS.setdefault(SAVED_TYPE, _refuse_family_class)
    _CLASSES["registered"] = object


class _AfterTransformers(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs :func:`register` right after ``transformers`` is imported, when ropekit was imported first."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "transformers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            try:
                register()
            except Exception:  # noqa: BLE001 - a transformers ropekit cannot read stays usable for everything else
                pass
        loader.exec_module = exec_module
        return spec


def register_when_transformers_loads() -> None:
    """:func:`register` now if transformers is imported, else as soon as it is."""
    if "transformers" in sys.modules:
        try:
            register()
        except Exception:  # noqa: BLE001 - see _AfterTransformers
            pass
    elif not any(isinstance(f, _AfterTransformers) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformers())


# --------------------------------------------------------------------------------------------------
# the stock model on purpose


def _family_config(path: str, hub: dict):
    """The family's config of a checkpoint saved from a patched model (with its patch record)."""
    from transformers import AutoConfig

    register()
    return AutoConfig.from_pretrained(path, **hub)


_HUB = ("revision", "token", "cache_dir", "local_files_only", "force_download", "subfolder", "trust_remote_code")


def from_pretrained(path: str, model_class: type, **kwargs: Any):
    """A checkpoint saved from a patched model loaded with the family's own ``model_class`` (say
    ``Qwen2_5_VLForConditionalGeneration``), patched from its record: what the Auto classes do, for a class of your
    choice. ``kwargs`` go to ``model_class.from_pretrained``."""
    from .patch import is_patched, patch_model

    config = _family_config(path, {k: kwargs[k] for k in _HUB if k in kwargs})
    model = model_class.from_pretrained(path, config=config, **kwargs)
    return model if is_patched(model) else patch_model(model)


def load_stock(path: str, model_class: Any = "AutoModelForImageTextToText", **kwargs: Any):
    """The stock (unpatched) model of a checkpoint saved from a patched model, on purpose (for comparisons): the
    family's config without the patch record, loaded with ``model_class`` (a class, or the name of a transformers
    Auto class). ``kwargs`` go to its ``from_pretrained``."""
    import transformers

    from . import persist

    config = _family_config(path, {k: kwargs[k] for k in _HUB if k in kwargs})
    persist.erase(config)
    unmark(config)
    if isinstance(getattr(config, "architectures", None), list):  # the stock model's own class names
        config.architectures = [a[len(ARCH_PREFIX):] if a.startswith(ARCH_PREFIX) else a for a in config.architectures]
    cls = getattr(transformers, model_class) if isinstance(model_class, str) else model_class
    return cls.from_pretrained(path, config=config, **kwargs)


def __getattr__(name: str) -> type:
    """The classes above by name in any process (what unpickling a config or model asks for): made on first use."""
    if name.startswith("Ropekit") and name != "RopekitConfig":
        import transformers

        base = getattr(transformers, name[len("Ropekit"):], None)
        if isinstance(base, type):
            from transformers import PreTrainedConfig

            if issubclass(base, PreTrainedConfig):
                return family_config_class(base)
            return _patched_model_class(base, family_config_class(base.config_class))
    if name == "RopekitConfig":
        return _ropekit_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
