"""GeoPE's λ sweep in the vision experiments (names, `full` defaults, the report figure) and per-step cost."""
from __future__ import annotations

import json
import math

import pytest

from ropekit.apply.geope import GeoPE
from ropekit.experiments import runner
from ropekit.experiments.geope_sweep import DEFAULT_LAMBDA, LAMBDAS, SWEEP, family_for, geope_lambda
from ropekit.experiments.registry import get
from ropekit.experiments.vision import check_family
from ropekit.report import experiments as rexp


def test_sweep_names_round_trip_and_default_is_geopes_own():
    assert GeoPE(12).lam == DEFAULT_LAMBDA  # family `geope` must be the λ = 100 point of the sweep
    assert family_for(100.0) == "geope" and family_for(10.0) == "geope-lam10"
    for lam in LAMBDAS:
        name = family_for(lam)
        assert check_family(name) == name
        assert geope_lambda(name) == lam
    assert "geope" in SWEEP and len(SWEEP) == len(LAMBDAS)
    assert geope_lambda("geope-lam2.5") == 2.5
    for other in ("axial", "linear-geope", "geope-lamx", "geope-lam0", "nd-weyl"):
        assert geope_lambda(other) is None


@pytest.mark.parametrize("name", ["geope-lam1", "geope-lam0.5", "geope-laminf"])
def test_lambda_at_most_one_is_refused_by_name_not_at_model_build(name):
    # GeoPE needs λ > 1; the family name check used to pass λ in (0, 1] and fail later inside the model
    with pytest.raises(ValueError):
        GeoPE(12, lam=float(name[len("geope-lam"):]))
    with pytest.raises(ValueError, match="vision family"):
        check_family(name)


@pytest.mark.parametrize("name", ["resolution", "shape-bias", "isotropy"])
def test_full_preset_runs_the_sweep_and_quick_does_not(name):
    exp = get(name)
    full = runner.default_designs(exp, "full")
    assert set(SWEEP) <= set(full) and len(full) == len(set(full))
    assert full[: len(exp.designs)] == list(exp.designs)  # the sweep is added after the usual families
    assert runner.default_designs(exp, "quick") == list(exp.designs)


def test_step_costs_by_hand():
    runs = [  # axial 0.1 s/step after its first step, geope 0.3 (first step 5 s: a compile, left out)
        {"design": "axial", "steps": 11, "train_s": 1.5, "train_cpu_s": 1.2, "first_step_s": 0.5, "first_step_cpu_s": 0.2},
        {"design": "axial", "steps": 11, "train_s": 1.5, "train_cpu_s": 1.2, "first_step_s": 0.5, "first_step_cpu_s": 0.2},
        {"design": "geope", "steps": 11, "train_s": 8.0, "train_cpu_s": 5.0, "first_step_s": 5.0, "first_step_cpu_s": 2.0},
        {"design": "old", "steps": 10, "train_s": 2.0, "train_cpu_s": 2.0},  # recorded before first steps were
    ]
    c = runner.step_costs(runs)
    assert c["reference"] == "axial"
    d = c["designs"]
    assert math.isclose(d["axial"]["step_s"], 0.1) and math.isclose(d["axial"]["step_cpu_s"], 0.1)
    assert math.isclose(d["geope"]["step_s"], 0.3) and math.isclose(d["geope"]["cpu_ratio"], 3.0)
    assert math.isclose(d["old"]["step_cpu_s"], 0.2) and d["axial"]["runs"] == 2
    assert runner.step_costs(runs[2:])["designs"]["geope"]["cpu_ratio"] is None  # no axial run: no ratio


def test_micro_lambda_sweep_figure_plots_the_aggregate(tmp_path, monkeypatch):
    designs = ["axial", "geope-lam2", "geope", "geope-lam10000"]
    agg = runner.run_experiment("resolution", designs=designs, preset="micro", seeds=2, out=tmp_path, progress=False)
    runs = [json.loads(line) for line in (tmp_path / "resolution" / "runs.jsonl").read_text().splitlines()]
    for r in runs:  # the first step is part of the training time
        assert 0 < r["first_step_s"] <= r["train_s"]
    assert math.isclose(agg["cost"]["designs"]["axial"]["cpu_ratio"], 1.0)

    figures = []
    close = rexp.plt.close
    monkeypatch.setattr(rexp.plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    sec = rexp.experiments_section(tmp_path, tmp_path)
    assert (tmp_path / "exp_resolution_lambda.png").exists()
    assert "exp_resolution_lambda.png" in sec["html"] and "ms / step" in sec["html"]
    fig = next(f for f in figures if f is not None and f.axes[0].get_xscale() == "log")
    metrics = get("resolution").figures["lambda"]
    assert [ax.get_ylabel() for ax in fig.axes] == metrics
    for ax, key in zip(fig.axes, metrics):
        # independent of the aggregate code: the mean over seeds straight from runs.jsonl
        by = {d: [r["metrics"][key] for r in runs if r["design"] == d] for d in designs}
        line, ref = ax.lines[0], ax.lines[1]
        assert list(line.get_xdata()) == [2.0, 100.0, 10000.0]
        want = [sum(by[d]) / 2 for d in ("geope-lam2", "geope", "geope-lam10000")]
        assert [pytest.approx(y) for y in line.get_ydata()] == want
        assert list(ref.get_ydata()) == [pytest.approx(sum(by["axial"]) / 2)] * 2
        band = ax.collections[0].get_paths()[0].vertices[:, 1]
        for d in ("geope-lam2", "geope", "geope-lam10000"):
            iv = agg["metrics"][d][key]
            assert any(math.isclose(y, iv["lo"], abs_tol=1e-9) for y in band)
            assert any(math.isclose(y, iv["hi"], abs_tol=1e-9) for y in band)


def test_no_lambda_figure_with_one_lambda():
    agg = {"seeds": 1, "metrics": {"axial": {"acc": {"mean": 0.5, "lo": 0.5, "hi": 0.5}},
                                   "geope": {"acc": {"mean": 0.6, "lo": 0.6, "hi": 0.6}}}}
    assert rexp.plot_lambda_sweep(agg, ["acc"], None) is None
