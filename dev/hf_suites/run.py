#!/usr/bin/env python3
"""Run transformers' own model test suites with every model they build patched stock-equivalently.

For each model type ropekit supports (``ropekit.hf.supported_models()``), or those named on the command line, this
runs transformers' ``tests/models/<family>/test_modeling_<family>.py`` twice, once stock and once with
``conftest_suite.py``'s hook patching every model the tests construct (``vanilla`` on the 1-D families, ``tmrope``
on the Omni thinkers, ``mrope`` with ``continuation="spatial"`` elsewhere), and reports the tests that pass stock
and fail patched, grouped by the first line of their error. See docs/development.md, "transformers' own model
suites". Development tooling only: not part of ``make test``.

Where the test code comes from (nothing of it is kept in this repository):

- ``tests/models/<family>/``, ``tests/generation/``, ``tests/exporters/``, ``tests/utils/``, the ``*_tester.py``
  helpers and ``utils/test_module/``: a transformers git mirror (``--mirror``, ``--ref``), which
  the search tool's ``fetch github:zucchini-nlp/transformers`` brings to /work/.mirror/;
- the top-level ``tests/test_*.py`` (test_modeling_common.py, test_configuration_common.py, ...): transformers'
  sdist of the installed release (``pip download --no-binary :all: transformers==<installed>``), so that the
  common tests match the library they run against; they replace the mirror's where both have them.

Everything goes to a scratch folder (``--scratch``, /tmp/hf_suites by default): the extracted tests, an overlay
venv on top of this repository's ``.venv`` with what transformers' tests import that ropekit's venv lacks
(requests, httpx, parameterized, pytest-timeout; the .venv itself is not touched), raw per-test results
(``results/<family>.<stock|patched>.jsonl``) and the report (``report.md``).

    .venv/bin/python dev/hf_suites/run.py qwen2_vl llava          # two families, stock and patched
    .venv/bin/python dev/hf_suites/run.py --all                   # every supported family (hours on 2 cores)
    .venv/bin/python dev/hf_suites/run.py qwen2_vl --reuse-stock  # rerun only the patched suite
    .venv/bin/python dev/hf_suites/run.py --report-only           # rewrite report.md from the results kept
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DEFAULT_MIRROR = Path("/work/.mirror/zucchini-nlp+transformers/repo")
EXTRA_PACKAGES = ["requests", "httpx", "parameterized", "pytest-timeout"]
# the mirror's test folders that the model suites import (besides tests/models/<family>/)
SHARED_TEST_PATHS = ["tests/exporters", "tests/generation", "tests/utils", "tests/tensor_parallel",
                     "tests/models/__init__.py", "utils/test_module", "utils/fetch_hub_objects_for_ci.py"]
# model types whose suite lives under another folder name
SUITE_DIR = {"qwen2_5_omni_thinker": "qwen2_5_omni", "qwen3_omni_moe_thinker": "qwen3_omni_moe"}
# modules a suite imports at its top for its slow tests alone, stubbed (conftest_suite.py) where the .venv lacks them
STUBS = {"qwen2_5_omni_thinker": ["librosa"], "qwen3_omni_moe_thinker": ["librosa"]}
MODES = ("stock", "patched")


def sh(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def supported_models(python: str) -> list[str]:
    out = sh([python, "-c", "import ropekit; print(' '.join(ropekit.hf.supported_models()))"]).stdout
    return out.split()


def installed_transformers(python: str) -> str:
    return sh([python, "-c", "import transformers; print(transformers.__version__)"]).stdout.strip()


def suite_dir(model_type: str) -> str:
    return SUITE_DIR.get(model_type, model_type)


# --------------------------------------------------------------------------------------------------
# the scratch folder


def overlay_venv(scratch: Path, base_python: str) -> str:
    """A venv whose site-packages put ropekit's .venv behind its own, with only the missing test dependencies
    installed into it. Returns its python."""
    venv = scratch / "venv"
    python = venv / "bin" / "python"
    stamp = venv / ".ropekit-stamp"
    want = " ".join(EXTRA_PACKAGES) + " " + base_python
    if stamp.exists() and stamp.read_text() == want:
        return str(python)
    shutil.rmtree(venv, ignore_errors=True)
    base_site = sh([base_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    interpreter = sh([base_python, "-c", "import sys; print(sys._base_executable)"]).stdout.strip()
    sh([interpreter, "-m", "venv", "--without-pip", str(venv)])
    site = sh([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # addsitedir (not a bare path) so that the .venv's own .pth files, ropekit's editable install among them, apply
    Path(site, "_ropekit_venv.pth").write_text(f"import site; site.addsitedir({base_site!r})\n")
    print(f"[hf_suites] installing {', '.join(EXTRA_PACKAGES)} where the .venv lacks them, into {venv}", flush=True)
    sh([str(python), "-m", "pip", "install", "-q", *EXTRA_PACKAGES])
    stamp.write_text(want)
    return str(python)


def sdist_tests(scratch: Path, python: str, version: str) -> Path:
    """transformers' sdist of the installed release (it ships the top-level tests/test_*.py)."""
    dest = scratch / "sdist"
    tar = dest / f"transformers-{version}.tar.gz"
    if not tar.exists():
        dest.mkdir(parents=True, exist_ok=True)
        print(f"[hf_suites] pip download transformers=={version} (sdist: the common tests of that release)", flush=True)
        sh([python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", f"transformers=={version}",
            "-d", str(dest)])
    return tar


def _imports(python: str, tree: Path, stem: str) -> bool:
    return subprocess.run([python, "-c", f"import tests.{stem}"], cwd=tree, capture_output=True).returncode == 0


def prepare_tree(scratch: Path, mirror: Path, ref: str, families: list[str], sdist: Path, python: str) -> Path:
    tree = scratch / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    git = ["git", "--git-dir", str(mirror)]
    top = [p for p in sh(git + ["ls-tree", "--name-only", ref, "tests/"]).stdout.split() if p.endswith(".py")]
    dirs = sorted({f"tests/models/{suite_dir(f)}" for f in families})
    paths = top + SHARED_TEST_PATHS + dirs
    archive = subprocess.run(git + ["archive", ref, *paths], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    version = sdist.name[len("transformers-"):-len(".tar.gz")]
    mirror_copies = {p: (tree / p).read_bytes() for p in top}
    subprocess.run(["tar", "-xzf", str(sdist), "-C", str(tree), "--strip-components=1", "--wildcards",
                    f"transformers-{version}/tests/*.py"], check=True)
    # a release's common test file that imports a tests module neither source has (the sdist ships only the
    # top-level files) stays the mirror's copy
    kept = []
    for path in sorted((tree / "tests").glob("*.py")):
        rel = f"tests/{path.name}"
        wanted = re.findall(r"^\s*from (?:\.|tests\.)([\w.]+) import", path.read_text(), flags=re.M)
        missing = [m for m in wanted if not (tree / "tests" / (m.replace(".", "/") + ".py")).exists()
                   and not (tree / "tests" / m.replace(".", "/")).is_dir()]
        if not missing:
            continue
        if rel in mirror_copies:
            path.write_bytes(mirror_copies[rel])
            if _imports(python, tree, path.stem):
                kept.append(f"{rel} from the mirror (the release's imports {', '.join(missing)})")
                continue
        # neither copy imports here (the distributed mixins: FSDP, tensor parallel): a stub with empty mixin classes
        # under the names the other test files import from it; their tests need several devices anyway
        names = set()
        for other in (tree / "tests").rglob("*.py"):
            for group in re.findall(rf"from (?:\.+|tests\.){path.stem} import (\([^)]*\)|[\w, ]+)", other.read_text()):
                names.update(n.strip() for n in group.strip("()").split(",") if n.strip())
        path.write_text("# stub written by ropekit's dev/hf_suites/run.py: neither copy of this file imports here\n"
                        + "".join(f"class {n}:\n    pass\n\n\n" for n in sorted(names)))
        kept.append(f"{rel} stubbed ({', '.join(sorted(names)) or 'empty'}; the release's imports "
                    f"{', '.join(missing)}, the mirror's does not import with this transformers)")
    (tree / "kept_from_mirror.txt").write_text("\n".join(kept) + "\n")
    # test_pipeline_mixin imports the library's source from <repo>/src/transformers
    lib = sh([python, "-c", "import transformers, os; print(os.path.dirname(transformers.__file__))"]).stdout.strip()
    (tree / "src").mkdir()
    (tree / "src" / "transformers").symlink_to(lib)
    shutil.copy(HERE / "conftest_suite.py", tree / "conftest.py")
    # the mirror's testing_utils, from which conftest.py takes the plain constants its testers import that the
    # installed release lacks (_TEXT_MODEL_TESTER_DEFAULTS)
    (tree / "mirror_testing_utils.py").write_text(
        sh(git + ["show", f"{ref}:src/transformers/testing_utils.py"]).stdout)
    (tree / "pytest.ini").write_text("[pytest]\naddopts =\n")  # no ini of ropekit's applies here
    return tree


# --------------------------------------------------------------------------------------------------
# running


def run_suite(tree: Path, python: str, family: str, mode: str, results: Path, args) -> dict:
    test_file = f"tests/models/{suite_dir(family)}/test_modeling_{suite_dir(family)}.py"
    out = results / f"{family}.{mode}.jsonl"
    log = results / f"{family}.{mode}.log"
    out.unlink(missing_ok=True)
    Path(f"{out}.shims").unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=getattr(args, "pythonpath", ""), ROPEKIT_HF_SUITES_RESULTS=str(out),
               ROPEKIT_HF_SUITES_PATCH="1" if mode == "patched" else "0", ROPEKIT_HF_SUITES_STUBS=",".join(STUBS.get(family, [])),
               ROPEKIT_HF_SUITES_DESIGN=args.design or "",
               OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads), PYTHONDONTWRITEBYTECODE="1")
    cmd = [python, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
           f"--timeout={args.test_timeout}", "-rN"]
    if args.k:
        cmd += ["-k", args.k]
    print(f"[hf_suites] {family} {mode}: {' '.join(cmd[1:])}", flush=True)
    start = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT,
                                timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    meta = {"family": family, "mode": mode, "rc": rc, "seconds": round(time.time() - start), "command": " ".join(cmd[1:])}
    (results / f"{family}.{mode}.meta.json").write_text(json.dumps(meta))
    print(f"[hf_suites] {family} {mode}: rc={rc} in {meta['seconds']} s", flush=True)
    return meta


# --------------------------------------------------------------------------------------------------
# the report


def load(results: Path, family: str, mode: str):
    path = results / f"{family}.{mode}.jsonl"
    if not path.exists():
        return None, None
    recs = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        recs[rec["id"]] = rec
    meta_path = results / f"{family}.{mode}.meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return recs, meta


def _shims(results: Path, family: str, mode: str) -> list[str]:
    path = results / f"{family}.{mode}.jsonl.shims"
    return path.read_text().split() if path.exists() else []


def cause(error: str) -> str:
    """The error line with the numbers, tensors and quoted values that vary from test to test blanked out."""
    s = error.strip()
    s = re.sub(r"tensor\(.*", "tensor(...)", s)
    s = re.sub(r"\d+(\.\d+)?", "N", s)
    return s[:220]


def short(nodeid: str) -> str:
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def report(results: Path, families: list[str], header: str) -> str:
    shims = sorted({n for f in families for m in MODES for n in _shims(results, f, m)})
    if shims:
        header += (f"\n\nShims (conftest.py): constants the mirror's test helpers import that "
                   f"transformers.testing_utils lacks, taken from the mirror's testing_utils.py, and (stub) empty "
                   f"modules for imports only the slow tests use: {', '.join(shims)}")
    lines = [header, "", "| family | tests | pass stock | pass patched | fail patched (pass stock) | fail both | "
             "pass patched only | patched models | run |", "|---|---|---|---|---|---|---|---|---|"]
    details = []
    for fam in families:
        stock, smeta = load(results, fam, "stock")
        patched, pmeta = load(results, fam, "patched")
        if not stock or not patched:
            why = "not run"
            for mode, recs in (("stock", stock), ("patched", patched)):
                log = results / f"{fam}.{mode}.log"
                if not recs and log.exists():
                    err = next((ln[1:].strip() for ln in log.read_text(errors="replace").splitlines()
                                if ln.startswith("E ")), "no test ran")
                    why = f"{mode}: no test ran: `{err[:150]}`"
                    break
            lines.append(f"| {fam} | {why} | | | | | | | |")
            continue
        ids = sorted(set(stock) | set(patched))
        ok = lambda recs, i: i in recs and recs[i]["outcome"] == "passed"  # noqa: E731
        regress = [i for i in ids if ok(stock, i) and not ok(patched, i)]
        both = [i for i in ids if i in stock and stock[i]["outcome"] == "failed" and not ok(patched, i)]
        fixed = [i for i in ids if ok(patched, i) and not ok(stock, i) and i in stock]
        touched = collections.Counter(c for r in patched.values() for c in r.get("patched", []))
        run = "; ".join(f"{m} rc={meta.get('rc')} {meta.get('seconds')} s" for m, meta in (("stock", smeta), ("patched", pmeta)))
        lines.append(f"| {fam} | {len(ids)} | {sum(ok(stock, i) for i in ids)} | {sum(ok(patched, i) for i in ids)} | "
                     f"{len(regress)} | {len(both)} | {len(fixed)} | "
                     f"{', '.join(f'{c} ({n})' for c, n in touched.most_common())} | {run} |")
        if regress or both:
            details.append(f"\n### {fam}\n")
        if regress:
            groups = collections.defaultdict(list)
            for i in regress:
                rec = patched.get(i, {"outcome": "not run", "error": "(not run in the patched suite)"})
                text = rec["error"] if rec["outcome"] == "failed" else f"{rec['outcome']}: {rec['error']}"
                groups[cause(text)].append((i, rec))
            details.append(f"Fail patched, pass stock ({len(regress)}), by first error line:\n")
            for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
                first_id, first = members[0]
                sub = f" [{first['subtest']}]" if first.get("subtest") else ""
                err = first["error"][:300].replace("`", "'")
                details.append(f"- **{len(members)}** × `{err}`")
                details.append(f"  - e.g. `{short(first_id)}`{sub}; also: "
                               + (", ".join(f"`{short(i).split('::')[-1]}`" for i, _ in members[1:12]) or "–")
                               + (" …" if len(members) > 12 else ""))
        if both:  # the suite's own failures with this transformers: by cause, one test named each
            groups = collections.defaultdict(list)
            for i in both:
                groups[cause(stock[i]["error"])].append(i)
            details.append(f"\nFail stock too ({len(both)}): " + "; ".join(
                f"{len(ids_)} × `{stock[ids_[0]]['error'][:100].replace('`', chr(39))}` (e.g. "
                f"`{short(ids_[0]).split('::')[-1]}`)" for ids_ in sorted(groups.values(), key=len, reverse=True)))
    return "\n".join(lines + details) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("families", nargs="*", help="model types (default with --all: ropekit.hf.supported_models())")
    p.add_argument("--all", action="store_true", help="every supported model type")
    p.add_argument("--mode", choices=("both",) + MODES, default="both", help="which suites to run (default both)")
    p.add_argument("--reuse-stock", action="store_true", help="keep stock results already in the scratch folder")
    p.add_argument("--report-only", action="store_true", help="run nothing; write the report from kept results")
    p.add_argument("--scratch", type=Path, default=Path("/tmp/hf_suites"))
    p.add_argument("--mirror", type=Path, default=DEFAULT_MIRROR, help="transformers git dir (default %(default)s)")
    p.add_argument("--ref", default="main", help="the mirror's revision to take tests/models from (default main)")
    p.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"), help="ropekit's venv python")
    p.add_argument("--timeout", type=int, default=1800, help="seconds for one suite run (default %(default)s)")
    p.add_argument("--test-timeout", type=int, default=300, help="seconds for one test (default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default %(default)s)")
    p.add_argument("-k", help="pytest -k expression, to run part of each suite")
    p.add_argument("--design", help="patch with this design instead of each family's stock-equivalent one (to see "
                                    "what the suites make of it; its differences from stock are expected)")
    p.add_argument("--ropekit", default="HEAD", metavar="REV|worktree",
                   help="the ropekit revision to test, copied from git into the scratch folder (default HEAD), or "
                        "'worktree': the work tree with its uncommitted edits")
    args = p.parse_args(argv)

    supported = supported_models(args.python)
    families = supported if args.all or (args.report_only and not args.families) else args.families
    unknown = [f for f in families if f not in supported]
    if not families or unknown:
        p.error(f"name model types from {supported}" + (f" (not supported: {unknown})" if unknown else ""))
    scratch = args.scratch.resolve()
    results = scratch / "results"
    results.mkdir(parents=True, exist_ok=True)
    version = installed_transformers(args.python)
    rev = "HEAD" if args.ropekit == "worktree" else args.ropekit
    commit = sh(["git", "-C", str(REPO), "rev-parse", "--short", rev]).stdout.strip()
    dirty = sh(["git", "-C", str(REPO), "status", "--porcelain", "--", "src"]).stdout.split("\n")
    dirty = [line[3:] for line in dirty if line.strip()]
    if args.ropekit == "worktree" and dirty:  # the suites import ropekit from the work tree, edits included
        commit += f" + uncommitted changes to {', '.join(dirty)}"

    if not args.report_only:
        if not (args.mirror / "HEAD").exists():
            p.error(f"no transformers git mirror at {args.mirror}: fetch github:zucchini-nlp/transformers "
                    f"(the search tool's fetch) or pass --mirror")
        mirror_rev = sh(["git", "--git-dir", str(args.mirror), "rev-parse", "--short", args.ref]).stdout.strip()
        python = overlay_venv(scratch, args.python)
        sdist = sdist_tests(scratch, python, version)
        tree = prepare_tree(scratch, args.mirror, args.ref, families, sdist, python)
        if args.ropekit != "worktree":
            snapshot = scratch / "ropekit-rev"
            shutil.rmtree(snapshot, ignore_errors=True)
            snapshot.mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src/ropekit"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(snapshot)], input=archive, check=True)
            args.pythonpath = str(snapshot / "src")
        (results / "source.json").write_text(json.dumps({"mirror": str(args.mirror), "ref": args.ref,
                                                         "mirror_commit": mirror_rev, "transformers": version,
                                                         "sdist": sdist.name, "ropekit_commit": commit,
                                                         "ropekit": args.ropekit,
                                                         "kept_from_mirror": (tree / "kept_from_mirror.txt").read_text().split("\n")[:-1]}))
        for fam in families:
            for mode in MODES:
                if args.mode not in ("both", mode):
                    continue
                if mode == "stock" and args.reuse_stock and (results / f"{fam}.stock.jsonl").exists():
                    continue
                run_suite(tree, python, fam, mode, results, args)
            # write the report as we go, so a long --all run shows what it has
            (scratch / "report.md").write_text(report(results, families, _header(results, version, commit)))

    text = report(results, families, _header(results, version, commit))
    (scratch / "report.md").write_text(text)
    print(text)
    print(f"[hf_suites] report: {scratch / 'report.md'}; per-test results: {results}/<family>.<mode>.jsonl")
    return 0


def _header(results: Path, version: str, commit: str) -> str:
    src = results / "source.json"
    s = json.loads(src.read_text()) if src.exists() else {}
    commit = s.get("ropekit_commit", commit)  # what the runs tested, not what HEAD is now
    kept = "; ".join(s.get("kept_from_mirror", []))
    return (f"transformers {version}; ropekit {commit}; tests/models from {s.get('mirror', '?')} @ {s.get('ref', '?')} "
            f"({s.get('mirror_commit', '?')}), top-level tests/test_*.py from {s.get('sdist', '?')}"
            + (f"; except: {kept}" if kept else ""))


if __name__ == "__main__":
    sys.exit(main())
