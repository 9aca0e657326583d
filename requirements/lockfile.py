"""Write and apply the suite's lock files (the Makefile's helper; standard library and pip only).

    python requirements/lockfile.py freeze --title TEXT      the running environment as a lock, on stdout
    python requirements/lockfile.py constraints LOCK          LOCK as this environment applies it, on stdout
    python requirements/lockfile.py constraints LOCK --relax transformers==5.25.0
    python requirements/lockfile.py newest transformers       the newest release pip finds

Run it with the interpreter of the environment it is about (``.venv/bin/python requirements/...``).

torch is never in a lock: the Makefile's TORCH_VERSION / TORCH_SPEC / TORCH_INDEX_URL choose the build. A
torch build may pin or cap some of its own dependencies (a CUDA wheel pins its triton and its CUDA
libraries, each release other versions); those follow the build too: ``freeze`` leaves them (and any
``nvidia-*`` / ``cuda-*`` library) out, and ``constraints`` drops a lock's lines for what the installed
torch pins or caps, so a lock written with one torch build never fights another.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import platform
import re
import subprocess
import sys

try:  # packaging comes with most environments; pip always carries a copy
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pragma: no cover - a bare venv
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

#: never pinned by a lock: the project itself, the installer, and torch (the Makefile's choice)
NEVER = {"ropekit", "pip", "torch"}


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): case, '-', '_' and '.' do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _applies(req: Requirement) -> bool:
    """The requirement holds in this environment for a plain install (no extra asked for)."""
    return req.marker is None or req.marker.evaluate({**default_environment(), "extra": ""})


def _bounded(requirements: list[str]) -> dict[str, str]:
    """{name: specifier} of the requirements that cap the version (``==``, ``<``, ``<=``, ``~=``)."""
    caps = {}
    for line in requirements:
        req = Requirement(line)
        if _applies(req) and any(s.operator in ("==", "===", "<", "<=", "~=") for s in req.specifier):
            caps[canonical(req.name)] = str(req.specifier)
    return caps


def torch_owned() -> dict[str, str]:
    """What the installed torch build pins or caps itself (empty when torch is not installed): a CUDA
    wheel's triton, its CUDA libraries. A lock's line for one of them would fight any other torch build."""
    try:
        return _bounded(importlib.metadata.requires("torch") or [])
    except importlib.metadata.PackageNotFoundError:
        return {}


def _cuda(name: str) -> bool:
    """A CUDA runtime distribution (``nvidia-*``, ``cuda-*``): only ever there for a CUDA torch build."""
    return name.startswith(("nvidia-", "cuda-"))


def _pip(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"lockfile.py: pip {' '.join(args)} failed:\n{done.stderr.strip()}")
    return done.stdout


def freeze(title: str) -> str:
    """The running environment's packages, one ``name==version`` a line, less NEVER and torch's own pins."""
    left_out = NEVER | set(torch_owned())
    pins, skipped = [], []
    for line in _pip("freeze", "--all", "--exclude-editable").splitlines():
        name, sep, version = line.partition("==")
        if not sep:  # a direct reference (name @ url) has no version a lock could repeat
            skipped.append(line)
        elif canonical(name) not in left_out and not _cuda(canonical(name)):
            pins.append(f"{name}=={version}")
    for line in skipped:
        print(f"lockfile.py: left out of the lock (not a released version): {line}", file=sys.stderr)
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "none"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    header = [
        f"# {title}",
        f"# Written by `make lock` on {when} (Python {platform.python_version()}, torch {torch}, {sys.platform});"
        " do not edit by hand.",
        "# Not here: ropekit, pip, torch and what a torch build pins itself (the Makefile's TORCH_* decide those).",
    ]
    return "\n".join(header + sorted(pins, key=canonical)) + "\n"


def _lock_lines(path: str) -> list[tuple[str, str]]:
    """(canonical name, line) for every pin of a lock file."""
    lines = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                lines.append((canonical(Requirement(line).name), line))
    return lines


def _release(spec: str) -> dict:
    """pip's metadata of the release it would install for ``spec`` (nothing is installed)."""
    report = _pip("install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed", "--report", "-", spec)
    return json.loads(report)["install"][0]["metadata"]


def constraints(lock: str, relax: str | None = None) -> str:
    """The lock as this environment applies it.

    Lines for what the installed torch pins or caps, and for CUDA libraries, are dropped (the torch build
    decides them). With
    ``relax="transformers==X"``: the lock's own line for that package goes, and so does every pin that
    X's requirements rule out (X then brings the versions it needs; everything else stays locked).
    """
    dropped = dict.fromkeys(torch_owned(), "the installed torch build decides it")
    if relax:
        wanted = Requirement(relax)
        dropped[canonical(wanted.name)] = f"replaced by {relax}"
        needs = {}
        for line in _release(relax).get("requires_dist") or []:
            req = Requirement(line)
            if _applies(req):
                needs[canonical(req.name)] = req.specifier
    out = []
    for name, line in _lock_lines(lock):
        if relax and name in needs and not needs[name].contains(Version(line.split("==", 1)[1]), prereleases=True):
            dropped[name] = f"{relax} needs {name}{needs[name]}"
        if _cuda(name):
            dropped.setdefault(name, "a CUDA library: the torch build decides it")
        if name in dropped:
            print(f"lockfile.py: not constraining {line} ({dropped[name]})", file=sys.stderr)
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("freeze", help="the running environment as a lock")
    p.add_argument("--title", required=True, help="the first comment line: what the lock is for")
    p = sub.add_parser("constraints", help="a lock as this environment applies it")
    p.add_argument("lock")
    p.add_argument("--relax", metavar="NAME==VERSION", help="install this release instead of the locked one")
    p = sub.add_parser("newest", help="the newest release of a package that pip finds")
    p.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "freeze":
        sys.stdout.write(freeze(args.title))
    elif args.command == "constraints":
        sys.stdout.write(constraints(args.lock, args.relax))
    else:
        print(_release(args.name)["version"])


if __name__ == "__main__":
    main()
