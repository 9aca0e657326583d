"""The transformers boundary: which parameters each hooked method may take, checked when a model is patched.

A hook replaces one transformers method on one instance. When a transformers release adds or renames a
parameter of such a method, a hook that let unknown keywords through would run on inputs it never reads:
transformers 5.24 renamed ``past_key_values`` to ``cache``, and a hook that still read the old name took
every decoding step for a fresh prompt and placed each generated token at position 0, with no error.

So every hook states a :class:`Contract`: the parameters it knows (reads, or hands on knowing what they
mean), those it cannot work without, and whether it hands the stock method's ``**kwargs`` on. At patch
time :func:`check` compares the contract with the installed method's signature and refuses any parameter
it does not know, naming the method, the parameter, the transformers version and what to do. At call
time :meth:`Contract.bind` names every argument by the installed signature, so a hook never depends on
the order in which a family declares its parameters, and refuses a keyword outside its contract.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

#: the oldest and the newest transformers release the test suite has run the hooks against
TESTED_TRANSFORMERS = ("5.18.0", "5.24.0")

#: the KV-cache argument: its name since transformers 5.24, then the name before it (still accepted by
#: transformers' deprecation shim, and by the hooks, while transformers accepts it)
CACHE_NAMES = ("cache", "past_key_values")


class UnsupportedTransformersError(TypeError):
    """The installed transformers changed a method ropekit hooks in a way the hook does not know."""


def transformers_version() -> str:
    try:
        import transformers
    except ImportError:  # pragma: no cover - the hf extra is what brings transformers
        return "<not installed>"
    return str(transformers.__version__)


def _what_to_do() -> str:
    low, high = TESTED_TRANSFORMERS
    return (f"upgrade ropekit, or install a transformers release it was tested with "
            f"(pip install 'transformers>={low},<={high}')")


def _release(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string such as ``5.24.0`` or ``5.25.0.dev0``."""
    parts = [int(m.group()) for m in (re.match(r"\d+", p) for p in version.split(".")[:3]) if m]
    return tuple(parts + [0] * (3 - len(parts)))


def check_version(what: str) -> None:
    """Refuse a transformers release older than the oldest one tested: its position code differs."""
    version = transformers_version()
    if version.startswith("<"):
        return
    if _release(version) < _release(TESTED_TRANSFORMERS[0]):
        raise UnsupportedTransformersError(
            f"{what}: transformers {version} is older than the oldest release ropekit's hooks were tested "
            f"with ({TESTED_TRANSFORMERS[0]}); its Qwen-VL / LLaVA position code differs from what the hooks "
            f"expect. Upgrade transformers: pip install 'transformers>={TESTED_TRANSFORMERS[0]}'"
        )


@dataclass(frozen=True)
class Contract:
    """What one hook handles of the method it replaces.

    ``known``: every parameter the hook reads or hands on knowing what it means. ``required``: groups of
    names the method must take one of (the hook reads them; a group lists a parameter's names across
    releases). ``var_keyword``: the hook hands the stock method's own ``**kwargs`` on unread (they carry
    transformers' attention and output options); otherwise a stock ``**kwargs`` is ignored, and a keyword
    outside ``known`` reaching the hook is refused at call time.
    """

    known: frozenset
    required: tuple = ()
    var_keyword: bool = False

    def widened(self, names: Iterable[str]) -> "Contract":
        """This contract, also knowing ``names`` (parameters a model family adds that the hook hands on unread)."""
        names = frozenset(names)
        return self if names <= self.known else Contract(self.known | names, self.required, self.var_keyword)

    def check(self, cls: type, method: str) -> tuple[str, ...]:
        """The method's named parameters in order (``self`` excluded); refuses what the contract does not
        know. Raises :class:`UnsupportedTransformersError`."""
        fn = getattr(cls, method, None)
        where = f"{cls.__name__}.{method}"
        if fn is None:
            raise UnsupportedTransformersError(
                f"patch_model: transformers {transformers_version()} has no {where}, which ropekit hooks; "
                f"{_what_to_do()}"
            )
        params = list(inspect.signature(fn).parameters.values())  # follows __wrapped__ (deprecation shims)
        if params and params[0].name == "self":
            params = params[1:]
        names = []
        for p in params:
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                continue
            if p.kind is inspect.Parameter.VAR_POSITIONAL or p.name not in self.known:
                shown = ("*" if p.kind is inspect.Parameter.VAR_POSITIONAL else "") + p.name
                raise UnsupportedTransformersError(
                    f"patch_model: {where} in transformers {transformers_version()} takes a parameter "
                    f"`{shown}` that ropekit's hook for it does not handle, so patching could give silently "
                    f"wrong results; {_what_to_do()}"
                )
            names.append(p.name)
        for group in self.required:
            if not any(n in names for n in group):
                raise UnsupportedTransformersError(
                    f"patch_model: {where} in transformers {transformers_version()} has no parameter "
                    f"{' / '.join(f'`{n}`' for n in group)}, which ropekit's hook reads; {_what_to_do()}"
                )
        return tuple(names)

    def bind(self, where: str, names: tuple[str, ...], args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call's arguments by name (positionals named by the installed signature ``names``).

        A keyword that is neither a parameter of the installed method nor in the contract is refused, unless
        the hook hands ``**kwargs`` on (then it is left in the result for the stock method).
        """
        # set operations on the keys rather than a loop over them: hooks bind on every forward
        if not self.var_keyword:
            unknown = kwargs.keys() - self.known
            if unknown:
                raise UnsupportedTransformersError(
                    f"patched model: {where} was called with `{min(unknown)}`, which ropekit's hook does not handle "
                    f"(transformers {transformers_version()}); {_what_to_do()}"
                )
        if not args:
            return dict(kwargs)
        if len(args) > len(names):
            raise TypeError(f"patched model: {where} got {len(args)} positional arguments, takes at most {len(names)}")
        given = dict(zip(names, args))
        twice = given.keys() & kwargs.keys()
        if twice:
            raise TypeError(f"patched model: {where} got several values for argument {min(twice)!r}")
        given.update(kwargs)
        return given


def cache_of(given: dict) -> Any:
    """The KV cache among a call's named arguments or ``generate``'s model kwargs, under either name."""
    for name in CACHE_NAMES:
        value = given.get(name)
        if value is not None:
            return value
    return None


def cache_keyword(method: Any) -> str:
    """The keyword ``method`` (a transformers ``forward``) takes its KV cache by in the installed release:
    ``"cache"`` since 5.24, ``"past_key_values"`` before. For hand-written decoding loops that run on both."""
    params = inspect.signature(method).parameters
    for name in CACHE_NAMES:
        if name in params:
            return name
    raise UnsupportedTransformersError(
        f"{getattr(method, '__qualname__', method)} in transformers {transformers_version()} takes no KV cache "
        f"argument ({' / '.join(CACHE_NAMES)}); {_what_to_do()}"
    )


def check_all(checks: Iterable[tuple[Optional[type], str, Contract]]) -> None:
    """Run every ``(class, method, contract)`` check before anything is installed (a refusal patches nothing)."""
    for cls, method, contract in checks:
        if cls is not None:
            contract.check(cls, method)


__all__ = ["Contract", "UnsupportedTransformersError", "TESTED_TRANSFORMERS", "CACHE_NAMES", "cache_of", "cache_keyword",
           "check_version", "check_all", "transformers_version"]
