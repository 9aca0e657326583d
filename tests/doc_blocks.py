"""The Python blocks of README.md and docs/*.md, found, grouped and run the way a reader runs them.

Every ```` ```python ```` block runs as written in a fresh interpreter, on its own, unless its first line is a
comment that says it continues the previous block (``# continues the previous block …``): then it runs after
that block, in the same namespace, as a reader who ran the one above would. Two more fence words exist:

- ```` ```python id=NAME ```` names a block (a runnable block another one points at);
- ```` ```python no-run twin=NAME ```` marks a block that cannot run here (it loads a pretrained checkpoint
  from the hub); ``NAME`` is the runnable block that does the same steps on a tiny model built from a
  config. Such blocks are checked for syntax and for their twin, never run.

Running: one driver interpreter (``python tests/doc_blocks.py CHAINS RESULTS``) imports what the blocks
import, then forks one child per chain of blocks: the child starts with an empty namespace in an empty
working folder, offline (``HF_HUB_OFFLINE=1``, an empty ``HF_HOME``), and pickles back the value of every
top-level expression statement, keyed by its first source line. The import is paid once and shared as a
cache; what a block needs it must still import itself, as the namespace starts empty and each chain runs in
its own process (a design it registers, a model it patches, a file it saves never reach another block).
"""
from __future__ import annotations

import ast
import functools
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONTINUES = re.compile(r"^#.*\bcontinues the previous block\b", re.I)
FENCE = re.compile(r"^```(\S*)[ \t]*(.*)$")
WORDS = re.compile(r"no-run|twin=[\w-]+|id=[\w-]+")
CHAIN_TIMEOUT_S = 180


@dataclass(frozen=True)
class Block:
    page: str      # path relative to the repository root
    line: int      # 1-based line of the opening fence
    language: str
    words: tuple   # the info string's words after the language
    source: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def word(self, key: str) -> "str | None":
        return next((w.split("=", 1)[1] for w in self.words if w.startswith(key + "=")), None)

    @property
    def no_run(self) -> bool:
        return "no-run" in self.words

    @property
    def continues(self) -> bool:
        first = next((ln for ln in self.source.splitlines() if ln.strip()), "")
        return bool(CONTINUES.match(first.strip()))


def blocks(page: Path, text: "str | None" = None) -> list[Block]:
    """Every fenced block of ``page`` (top level, not indented), in order."""
    lines = (page.read_text() if text is None else text).splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page.name}:{i + 1}: unclosed fence")
        rel = page.relative_to(ROOT).as_posix() if page.is_absolute() and ROOT in page.parents else page.name
        out.append(Block(rel, i + 1, m[1], tuple(m[2].split()), "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return out


def python_blocks(page: Path, text: "str | None" = None) -> list[Block]:
    return [b for b in blocks(page, text) if b.language == "python"]


def chains(page: Path, text: "str | None" = None) -> list[list[Block]]:
    """The runnable Python blocks of ``page``, grouped: a block that continues joins the chain before it."""
    out: list[list[Block]] = []
    previous = None
    for block in python_blocks(page, text):
        if block.continues:
            if previous is None or previous.no_run:
                raise ValueError(f"{block.where} continues a block that {'is no-run' if previous else 'does not exist'}")
            if block.no_run:
                raise ValueError(f"{block.where}: a no-run block cannot continue another")
            out[-1].append(block)
        elif not block.no_run:
            out.append([block])
        previous = block
    return out


def calls(source: str) -> list[ast.Call]:
    """Every call in ``source``, in source order."""
    found = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


# --------------------------------------------------------------------------------------------------
# running


@functools.lru_cache(maxsize=None)
def run_all() -> dict:
    """Run every chain of every page (once per test session); ``{(page, first line): result}``.

    A result is ``{"ok": bool, "error": str, "output": str, "seconds": float, "shown": {line: value}}``.
    """
    todo = [[(b.where, b.source) for b in chain] for page in PAGES for chain in chains(page)]
    with tempfile.TemporaryDirectory(prefix="ropekit-docs-") as tmp:
        spec = Path(tmp, "chains.json")
        spec.write_text(json.dumps(todo))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(Path(tmp, "hf")),
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        t0 = time.time()
        done = subprocess.run([sys.executable, __file__, str(spec), tmp], env=env, cwd=tmp, capture_output=True,
                              text=True, timeout=CHAIN_TIMEOUT_S * max(1, len(todo)))
        if done.returncode:
            raise RuntimeError(f"the docs driver failed:\n{done.stdout}\n{done.stderr}")
        results = {}
        for i, chain in enumerate(todo):
            with open(Path(tmp, f"{i}.pkl"), "rb") as f:
                results[chain[0][0]] = pickle.load(f)
        results["_seconds"] = time.time() - t0
    return results


def _preimport(todo) -> None:
    """Import, in the driver, every module the blocks import (the children share them as a cache)."""
    for chain in todo:
        for _, source in chain:
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                    try:
                        exec(compile(ast.Module([node], type_ignores=[]), "<preimport>", "exec"), {})
                    except Exception:  # the chain itself reports it
                        pass


def _value(v):
    try:
        pickle.dumps(v)
        return v
    except Exception:
        return repr(v)


def _run_chain(chain) -> dict:
    namespace = {"__name__": "__main__"}
    shown = {}
    for where, source in chain:
        lines = source.splitlines()
        for node in ast.parse(source, where).body:
            if isinstance(node, ast.Expr):
                value = eval(compile(ast.Expression(node.value), where, "eval"), namespace)
                shown[lines[node.lineno - 1]] = (_value(value), repr(value))
            else:
                exec(compile(ast.Module([node], type_ignores=[]), where, "exec"), namespace)
    return shown


def _drive(spec: str, tmp: str) -> None:
    todo = json.loads(Path(spec).read_text())
    _preimport(todo)
    for i, chain in enumerate(todo):
        work = Path(tmp, f"work{i}")
        work.mkdir()
        log = Path(tmp, f"{i}.log")
        t0 = time.time()
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: an empty namespace in an empty folder
            result = {"ok": False, "error": "", "shown": {}}
            try:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT)
                os.dup2(fd, 1), os.dup2(fd, 2)
                os.chdir(work)
                result["shown"] = _run_chain(chain)
                result["ok"] = True
            except BaseException:
                result["error"] = traceback.format_exc()
            finally:
                try:
                    sys.stdout.flush(), sys.stderr.flush()
                    try:
                        data = pickle.dumps(result)
                    except Exception:  # a value that pickles alone but not within the rest: keep the reprs
                        result["shown"] = {k: (r, r) for k, (_, r) in result["shown"].items()}
                        data = pickle.dumps(result)
                    Path(tmp, f"{i}.child.pkl").write_bytes(data)
                finally:
                    os._exit(0)
        while True:
            finished, _ = os.waitpid(pid, os.WNOHANG)
            if finished or time.time() - t0 > CHAIN_TIMEOUT_S:
                break
            time.sleep(0.05)
        if not finished:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        child = Path(tmp, f"{i}.child.pkl")
        if child.exists() and child.stat().st_size:
            result = pickle.loads(child.read_bytes())
        else:
            result = {"ok": False, "shown": {},
                      "error": f"no result (timed out after {CHAIN_TIMEOUT_S} s)" if not finished else "the child died"}
        result["output"] = log.read_text(errors="replace") if log.exists() else ""
        result["seconds"] = round(time.time() - t0, 2)
        with open(Path(tmp, f"{i}.pkl"), "wb") as f:
            pickle.dump(result, f)


if __name__ == "__main__":
    _drive(*sys.argv[1:3])
