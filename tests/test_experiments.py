"""The experiment harness: generators, intervals, verdicts, micro runs end to end, resume, torchrun."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ropekit.cli import main
from ropekit.experiments import get, runner
from ropekit.experiments.stats import (adjusted_verdicts, holm, mean_interval, paired_test, paired_verdict,
                                      seeds_for_power, seeds_to_decide, t_cdf, t_quantile, t_quantile_975,
                                      verdict_from_interval)
from ropekit.experiments.tasks.grids import KINDS, grid_vocab, image_batch, video_batch

V = grid_vocab()


# --- statistics against hand computations -----------------------------------------------------------

def test_t_quantiles_match_published_table():
    # two-sided 95 % Student-t critical values from any statistics table
    assert t_quantile_975(1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile_975(2) == pytest.approx(4.303, abs=1e-3)
    assert t_quantile_975(9) == pytest.approx(2.262, abs=1e-3)
    assert t_quantile_975(1000) == pytest.approx(1.962, abs=1e-3)
    with pytest.raises(ValueError, match="df"):
        t_quantile_975(0)


@pytest.mark.parametrize("p,df,table", [(0.95, 10, 1.812), (0.995, 5, 4.032), (0.9995, 30, 3.646),
                                        (0.99, 20, 2.528), (0.999, 3, 10.215), (0.9, 1, 3.078), (0.975, 60, 2.000)])
def test_t_quantile_at_other_levels_matches_published_tables(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=1e-3)
    assert t_quantile(1 - p, df) == pytest.approx(-table, abs=1e-3)  # symmetry
    assert t_cdf(table, df) == pytest.approx(p, abs=1e-4)  # tables round to 3 decimals


def test_t_cdf_matches_the_closed_forms_at_one_and_two_df():
    # df = 1 is the Cauchy distribution; df = 2 has F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (-30.0, -2.5, -0.3, 0.0, 0.7, 4.0, 100.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    with pytest.raises(ValueError, match="df"):
        t_cdf(1.0, 0)
    with pytest.raises(ValueError, match="probability"):
        t_quantile(1.0, 5)


def test_paired_t_test_on_students_sleep_data():
    # Cushny & Peebles' sleep data as in R: t.test(extra ~ group, data = sleep, paired = TRUE) reports
    # t = -4.0621, df = 9, p-value = 0.002833, 95 % CI (-2.4598858, -0.7001142) for group 1 - group 2
    d = [1.2, 2.4, 1.3, 1.3, 0.0, 1.0, 1.8, 0.8, 4.6, 1.4]  # group 2 - group 1
    t = paired_test(d)
    assert t["t"] == pytest.approx(4.0621, abs=1e-4) and t["p"] == pytest.approx(0.002833, abs=1e-6)
    iv = mean_interval(d)
    assert (iv["lo"], iv["hi"]) == (pytest.approx(0.7001142, abs=1e-6), pytest.approx(2.4598858, abs=1e-6))
    assert paired_test([0.1])["p"] == 1.0  # one seed decides nothing
    assert paired_test([0.1, 0.1])["p"] == 0.0 and paired_test([0.0, 0.0])["p"] == 1.0


def test_holm_on_textbook_examples():
    # Wikipedia's Holm-Bonferroni example: p = 0.01, 0.04, 0.03, 0.005 at alpha 0.05 rejects H1 and H4 only
    adj = holm([0.01, 0.04, 0.03, 0.005])
    assert [a <= 0.05 for a in adj] == [True, False, False, True]
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # by hand: sorted 0.01..0.05 times 5, 4, 3, 2, 1 = 0.05, 0.08, 0.09, 0.08, 0.05, then running maximum
    assert holm([0.05, 0.04, 0.03, 0.02, 0.01]) == pytest.approx([0.09, 0.09, 0.09, 0.08, 0.05])
    assert holm([0.4, 0.9]) == pytest.approx([0.8, 0.9]) and holm([]) == []
    with pytest.raises(ValueError):
        holm([1.5])


def test_four_verdicts_from_an_interval():
    assert verdict_from_interval(0.01, 0.05, 0.02) == "reproduced"
    assert verdict_from_interval(-0.05, -0.01, 0.02) == "contradicted"
    assert verdict_from_interval(-0.015, 0.012, 0.02) == "no effect"
    assert verdict_from_interval(-0.015, 0.03, 0.02) == "inconclusive"
    assert verdict_from_interval(-0.015, 0.012, None) == "inconclusive"


def test_a_decided_effect_smaller_than_delta_is_said_to_be(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from ropekit.experiments.base import Claim
    from ropekit.experiments.stats import below_delta, verdict_text
    from ropekit.report import experiments as rexp

    def rec(verdict, lo, hi, delta=0.02):
        return {"verdict": verdict, "advantage_adjusted": {"lo": lo, "hi": hi}, "delta": delta}

    assert verdict_text(rec("reproduced", 0.003, 0.018)) == "reproduced, smaller than δ"
    assert verdict_text(rec("contradicted", -0.018, -0.001)) == "contradicted, smaller than δ"
    assert verdict_text(rec("reproduced", 0.003, 0.021)) == "reproduced"  # may reach δ: may matter
    assert verdict_text(rec("no effect", -0.01, 0.01)) == "no effect"  # says so already
    assert not below_delta(rec("reproduced", 0.003, 0.018, delta=None))
    # through the runner: a one-claim family whose per-seed gain is 0.010 ± 0.001 on every seed, δ = 0.02:
    # the t-test rejects "no difference" (t = 0.010 / (0.000816 / 2) = 24.5 on 3 df), and the 95 % interval
    # 0.010 ± 3.182 * 0.000408 lies inside (0, 0.02)
    exp = SimpleNamespace(claims=(Claim("D", "d beats base", "Paper §4", "acc", "d", "base", delta=0.02,
                                        delta_reason="accuracy"),))
    base = [0.50, 0.52, 0.48, 0.51]
    runs = [{"design": d, "seed": s, "metrics": {"acc": base[i] + (0.010 + e if d == "d" else 0.0)}}
            for d in ("base", "d") for i, (s, e) in enumerate(zip((1, 2, 3, 4), (0.0, 0.001, -0.001, 0.0)))]
    claims = runner.verdicts(exp, runs)
    assert claims[0]["verdict"] == "reproduced" and below_delta(claims[0])
    agg = {"experiment": "fake", "preset": "standard", "seeds": 4, "seed_list": [1, 2, 3, 4], "claims": claims,
           "metrics": {"base": {}, "d": {}}}
    assert "smaller than delta" in runner.summary_table(agg)
    assert "reproduced, smaller than δ" in rexp.claims_table([("fake", agg)])
    figures = []
    close = rexp.plt.close
    monkeypatch.setattr(rexp.plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    rexp.plot_forest(agg, tmp_path / "forest.png", "fake")
    assert [t.get_text() for t in figures[-1].axes[0].texts] == ["reproduced, smaller than δ"]


def test_adjusted_verdicts_hold_the_family_wise_level():
    # claim 0 alone would be reproduced (p = 0.0028 for the sleep data); claim 1 has p between 0.05/2 and 0.05
    sleep = [1.2, 2.4, 1.3, 1.3, 0.0, 1.0, 1.8, 0.8, 4.6, 1.4]
    weak = [0.5, -0.1, 0.4, 0.3, 0.6, 0.0, 0.2, -0.2, 0.5, 0.1]
    flat = [0.001, -0.002, 0.0, 0.002, -0.001, 0.001, 0.0, -0.001, 0.002, -0.002]
    p_weak = paired_test(weak)["p"]
    assert 0.025 < p_weak < 0.05 and paired_verdict(weak, [0.0] * 10, delta=0.02)["verdict"] == "reproduced"
    rows = adjusted_verdicts([sleep, weak, flat], [0.5, 0.02, 0.02])
    assert [r["verdict"] for r in rows] == ["reproduced", "inconclusive", "no effect"]
    assert rows[1]["p_holm"] == pytest.approx(max(2 * p_weak, 3 * paired_test(sleep)["p"]))
    # the Bonferroni interval is the t-interval at level 1 - 0.05/3: quantile t(1 - 0.05/6, 9)
    iv = rows[2]["interval"]
    sd = paired_test(flat)["sd"]
    assert iv["hi"] - iv["mean"] == pytest.approx(t_quantile(1 - 0.05 / 6, 9) * sd / math.sqrt(10))
    assert rows[0]["level"] == pytest.approx(1 - 0.05 / 3)


def test_seeds_needed_from_the_spread():
    # half-width t(0.975, n-1) * 0.05 / sqrt(n) < 0.01: t(97) = 1.9847 -> 0.2005 (too wide), t(98) = 1.9845 ->
    # 0.1995 at n = 99 (published t table values)
    assert seeds_to_decide(0.05, 0.02) == 99
    # R: power.t.test(delta = 1, sd = 1, type = "paired", power = 0.8) gives n = 9.94, i.e. 10 pairs
    assert seeds_for_power(1.0, 1.0, power=0.8) == 10
    assert seeds_to_decide(0.05, 0.02, m=7) > 99  # a family needs more
    assert seeds_to_decide(float("nan"), 0.02) is None
    # the inverse: R's power.t.test(n = 10, sd = 1, power = 0.8, type = "paired") gives delta = 0.994 (exact
    # noncentral t); the normal-shift approximation used here is within 0.002 of it
    from ropekit.experiments.stats import detectable_effect
    assert detectable_effect(1.0, 10) == pytest.approx(0.994, abs=2e-3)
    assert detectable_effect(0.05, 99, m=7) > detectable_effect(0.05, 99)


def test_mean_interval_by_hand():
    # values 1, 2, 3: mean 2, sample sd 1, se 1/sqrt(3); the 97.5 % point of t with 2 df solves
    # t / sqrt(2 + t^2) = 0.95, i.e. t = sqrt(2 / (1 - 0.95^2) - 2) = 4.302653 -> half-width 2.48414
    r = mean_interval([1.0, 2.0, 3.0])
    assert r["mean"] == pytest.approx(2.0)
    assert r["sd"] == pytest.approx(1.0)
    assert r["hi"] - r["mean"] == pytest.approx(math.sqrt(2 / (1 - 0.95 ** 2) - 2) / math.sqrt(3), rel=1e-9)
    assert r["mean"] - r["lo"] == pytest.approx(2.48414, abs=1e-5)
    with pytest.raises(ValueError, match="empty"):
        mean_interval([])
    with pytest.raises(ValueError, match="finite"):
        mean_interval([1.0, float("nan")])


def test_paired_verdicts_follow_the_interval():
    # differences 0.1, 0.12, 0.11: interval well above 0 -> reproduced
    assert paired_verdict([0.6, 0.62, 0.61], [0.5, 0.5, 0.5])["verdict"] == "reproduced"
    assert paired_verdict([0.4, 0.38, 0.39], [0.5, 0.5, 0.5])["verdict"] == "contradicted"
    # "lower is better": the same numbers flip
    assert paired_verdict([0.4, 0.38, 0.39], [0.5, 0.5, 0.5], "lower")["verdict"] == "reproduced"
    # differences +0.1, -0.1, +0.05 straddle 0 -> inconclusive
    assert paired_verdict([0.6, 0.4, 0.55], [0.5, 0.5, 0.5])["verdict"] == "inconclusive"
    # differences within +-0.002 and delta 0.02: the interval lies inside +-delta -> no effect
    assert paired_verdict([0.501, 0.499, 0.5, 0.5], [0.5] * 4, delta=0.02)["verdict"] == "no effect"
    assert paired_verdict([0.9], [0.1])["verdict"] == "inconclusive"  # one seed never decides
    with pytest.raises(ValueError, match="pair"):
        paired_verdict([1.0, 2.0], [1.0])


# --- data generators --------------------------------------------------------------------------------

def _answer_by_brute_force(tokens: list[int], h: int, w: int, images: int, gap: int) -> int:
    """Decode one sample and answer its question by looking at the grid (independent of the generator)."""
    N = h * w
    grids, i = [], 1
    for k in range(images):
        if k:
            assert tokens[i] == V["SEP"]
            i += 1
        grids.append([t - V["SYM"] for t in tokens[i:i + N]])
        i += N
    q = tokens[i + gap:]
    sym = lambda t: t - V["SYM"]
    if q[0] == V["Q_AT"]:
        r, c = q[1] - V["ROW"], q[2] - V["COL"]
        return V["SYM"] + grids[0][r * w + c]
    if q[0] == V["Q_PRESENT"]:
        return V["YES"] if sym(q[1]) in grids[0] else V["NO"]
    if q[0] == V["Q_WHERE"]:
        hits = [k for k, s in enumerate(grids[0]) if s == sym(q[1])]
        assert len(hits) == 1, "a where-question's symbol must occur exactly once"
        return V["CELL"] + hits[0]
    assert q[0] == V["Q_WHICH"]
    hits = [k for k, g in enumerate(grids) for s in g if s == sym(q[1])]
    assert len(hits) == 1, "a which-question's symbol must occur exactly once over all images"
    return V["IMG"] + hits[0]


@pytest.mark.parametrize("images,h,w,gap", [(1, 4, 4, 3), (1, 3, 5, 0), (3, 4, 4, 2)])
def test_image_answers_are_determined_by_the_tokens(images, h, w, gap):
    b = image_batch(V, 200, h=h, w=w, gap=gap, images=images, g=torch.Generator().manual_seed(1))
    assert b.tokens.shape == (200, 1 + images * h * w + (images - 1) + gap + 3)
    for toks, target in zip(b.tokens.tolist(), b.target.tolist()):
        assert _answer_by_brute_force(toks, h, w, images, gap) == target
    if images == 1:  # every kind appears and yes/no is roughly balanced
        kinds = set(b.info["kind"].tolist())
        assert kinds == {KINDS.index(k) for k in ("at", "present", "where")}
        yn = b.target[b.info["kind"] == KINDS.index("present")]
        assert 0.25 < float((yn == V["YES"]).float().mean()) < 0.75


def test_video_needle_is_unique_and_answered_by_its_cell():
    t, h, w = 5, 3, 4
    b = video_batch(V, 100, t=t, h=h, w=w, gap=2, g=torch.Generator().manual_seed(2))
    vid = b.tokens[:, 1:1 + t * h * w]
    assert ((vid == V["NEEDLE"]).sum(1) == 1).all()
    pos = (vid == V["NEEDLE"]).float().argmax(1)
    assert torch.equal(V["CELL"] + pos % (h * w), b.target)
    assert torch.equal(pos // (h * w), b.info["frame"])


def test_generators_reproduce_from_their_seed():
    a = image_batch(V, 16, h=4, w=4, gap=3, g=torch.Generator().manual_seed(7))
    b = image_batch(V, 16, h=4, w=4, gap=3, g=torch.Generator().manual_seed(7))
    c = image_batch(V, 16, h=4, w=4, gap=3, g=torch.Generator().manual_seed(8))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.target, b.target)
    assert not torch.equal(a.tokens, c.tokens)


def test_bad_sizes_are_rejected():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="max side"):
        image_batch(V, 2, h=9, w=4, gap=0, g=g)
    with pytest.raises(ValueError, match="images"):
        image_batch(V, 2, h=4, w=4, gap=0, images=5, g=g)


# --- runs ---------------------------------------------------------------------------------------------

def _cli(*args: str) -> int:
    return main(["experiment", *args, "--preset", "micro", "--quiet"])


@pytest.mark.parametrize("name,designs", [("crossmodal", "mrope,circle"), ("video", "mrope,vrope")])
def test_micro_preset_end_to_end(tmp_path, name, designs, capsys):
    assert _cli(name, "--designs", designs, "--seeds", "2", "--out", str(tmp_path)) == 0
    runs = [json.loads(l) for l in (tmp_path / name / "runs.jsonl").read_text().splitlines()]
    assert sorted((r["design"], r["seed"]) for r in runs) == sorted(
        (d, s) for d in designs.split(",") for s in (0, 1))
    for r in runs:
        assert r["steps"] == get(name).presets["micro"]["train"]["steps"] and r["wall_s"] > 0
        assert r["versions"]["torch"] == torch.__version__ and 0 <= r["metrics"]["acc"] <= 1
    agg = json.loads((tmp_path / name / "aggregate.json").read_text())
    # the aggregate's interval is the t-interval of the per-seed values
    for d in designs.split(","):
        vals = [r["metrics"]["acc"] for r in runs if r["design"] == d]
        assert agg["metrics"][d]["acc"]["mean"] == pytest.approx(sum(vals) / 2)
        assert agg["metrics"][d]["acc"]["hi"] == pytest.approx(mean_interval(vals)["hi"])
    assert agg["claims"], "claims whose two designs ran get a verdict"
    for c in agg["claims"]:
        a = c["advantage"]
        # paired differences equal in every seed (both designs at the same chance value, say) measure no noise:
        # "not informative", never "no effect" from a zero-width interval
        expected = ("not informative" if len(set(c["differences"])) == 1 else
                    "reproduced" if a["lo"] > 0 else "contradicted" if a["hi"] < 0 else
                    "no effect" if -c["delta"] < a["lo"] and a["hi"] < c["delta"] else "inconclusive")
        assert c["verdict_unadjusted"] == expected
        assert (c["verdict"] == "not informative") == (expected == "not informative")
        b = c["advantage_adjusted"]  # the adjusted interval contains the unadjusted one
        assert b["lo"] <= a["lo"] and a["hi"] <= b["hi"]
    out = capsys.readouterr().out
    assert "advantage" in out and name in out
    # the report section draws the heat maps and curves and lists every verdict with its interval
    from ropekit.report.experiments import experiments_section

    (tmp_path / "rep").mkdir()
    sec = experiments_section(tmp_path / "rep", tmp_path)
    figs = get(name).figures
    for key in [figs["heatmap"], *figs["curves"]]:
        assert (tmp_path / "rep" / f"exp_{name}_{key}.png").stat().st_size > 1000
    assert sec["metrics"][name]["claims"] == {c["id"]: c["verdict"] for c in agg["claims"]}
    for c in agg["claims"]:
        assert f"{c['advantage']['lo']:+.3f}" in sec["html"]
    spreads = {d: agg["metrics"][d]["cell_spread"]["mean"] for d in designs.split(",")}
    flattest = min(spreads, key=spreads.get)
    assert f"Flattest map: {flattest} (std over cells {spreads[flattest]:.3f})" in sec["html"]
    # a second call finds every run done and trains nothing new
    assert _cli(name, "--designs", designs, "--seeds", "2", "--out", str(tmp_path)) == 0
    assert len((tmp_path / name / "runs.jsonl").read_text().splitlines()) == 4


def test_resume_after_interruption_gives_the_same_result(tmp_path):
    exp = get("crossmodal")
    cfg = {**exp.presets["micro"], "train": {**exp.presets["micro"]["train"], "ckpt_every": 4}}
    dev = torch.device("cpu")
    full = runner.run_one(exp, "circle-age-alternate", 0, cfg, dev)
    ckpt = tmp_path / "run.pt"
    assert runner.run_one(exp, "circle-age-alternate", 0, cfg, dev, ckpt=ckpt, stop_after=7) is None
    assert ckpt.exists()
    resumed = runner.run_one(exp, "circle-age-alternate", 0, cfg, dev, ckpt=ckpt)
    assert resumed["losses"] == full["losses"]
    assert resumed["metrics"] == full["metrics"]


def test_worker_processes_give_the_records_of_one_process(tmp_path, capsys):
    """``jobs=2`` trains the units (a stacked group of seeds, a single seed) in two spawned worker processes:
    every run's losses and metrics are those of the same run in this process, and a rerun trains nothing."""
    torch.set_num_threads(1)  # each worker takes this process's thread count; one thread in both, so one rounding
    kw = dict(designs=["mrope", "circle"], seeds=3, preset="micro", progress=False, batch_seeds=2)
    one = runner.run_experiment("crossmodal", out=tmp_path / "one", **kw)
    two = runner.run_experiment("crossmodal", out=tmp_path / "two", jobs=2, **{**kw, "progress": True})
    assert "done (4/4 units)" in capsys.readouterr().err  # mrope s0-1, mrope s2, circle s0-1, circle s2

    def records(folder):
        lines = (folder / "crossmodal" / "runs.jsonl").read_text().splitlines()
        return {(r["design"], r["seed"]): r for r in map(json.loads, lines)}
    a, b = records(tmp_path / "one"), records(tmp_path / "two")
    assert sorted(a) == sorted(b) == sorted((d, s) for d in ("mrope", "circle") for s in range(3))
    for key in a:
        assert b[key]["losses"] == a[key]["losses"] and b[key]["metrics"] == a[key]["metrics"]
        assert b[key].get("stacked") == a[key].get("stacked")
    assert two["metrics"] == one["metrics"] and two["claims"] == one["claims"]
    assert not list((tmp_path / "two" / "crossmodal" / "ckpt").iterdir())  # finished units leave no checkpoint
    runner.run_experiment("crossmodal", out=tmp_path / "two", jobs=2, **kw)
    assert len((tmp_path / "two" / "crossmodal" / "runs.jsonl").read_text().splitlines()) == 6


def test_jobs_are_refused_where_they_do_not_apply(tmp_path, capsys):
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="`jobs` must be an int >= 1"):
            runner.run_experiment("crossmodal", designs=["mrope"], preset="micro", out=tmp_path, jobs=bad)
    with pytest.raises(ValueError, match="--device cpu"):
        runner.run_experiment("crossmodal", designs=["mrope"], preset="micro", out=tmp_path, jobs=2, device="cuda")
    assert main(["experiment", "crossmodal", "--preset", "micro", "--variance", "2", "--jobs", "2",
                 "--out", str(tmp_path)]) != 0
    assert "--jobs applies to training runs, not to --variance" in capsys.readouterr().err


def test_list_says_what_each_experiment_tests(capsys):
    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("crossmodal", "video"):
        assert f"{name}:" in out
        for c in get(name).claims:
            assert c.text in out


def test_unknown_names_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="unknown experiment"):
        runner.run_experiment("nope", out=tmp_path)
    with pytest.raises(ValueError, match="unknown design"):
        runner.run_experiment("crossmodal", designs=["mrope", "hard"], preset="micro", out=tmp_path)
    with pytest.raises(ValueError, match="AGE schedule"):
        runner.run_experiment("crossmodal", designs=["circle-age-sideways"], preset="micro", out=tmp_path)


def test_torchrun_two_processes_match_one_process(tmp_path):
    """2 gloo processes, each on half of every global batch, log the same losses as 1 process."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    script = tmp_path / "entry.py"
    script.write_text("import sys\nfrom ropekit.cli import main\nsys.exit(main())\n")
    args = ["experiment", "crossmodal", "--designs", "mrope", "--seeds", "1", "--preset", "micro", "--quiet"]
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(script), *args, "--out", str(tmp_path / "two")], check=True, env=env, timeout=120,
                   capture_output=True)
    assert _cli("crossmodal", "--designs", "mrope", "--seeds", "1", "--out", str(tmp_path / "one")) == 0
    two = json.loads((tmp_path / "two" / "crossmodal" / "runs.jsonl").read_text().splitlines()[0])
    one = json.loads((tmp_path / "one" / "crossmodal" / "runs.jsonl").read_text().splitlines()[0])
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4, abs=1e-5)
    assert two["metrics"]["acc"] == pytest.approx(one["metrics"]["acc"], abs=0.05)


def test_finished_runs_are_reused_only_for_the_same_configuration(tmp_path):
    cfg = {"model": {"dim": 8}, "train": {"steps": 3, "ckpt_every": 0}}
    rec = {"preset": "micro", "design": "mrope", "seed": 0, "config": cfg}
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    assert list(runner._done_runs(path, "micro", cfg)) == [("mrope", 0)]
    # checkpoint frequency cannot change a result; anything else means the run must be redone
    assert list(runner._done_runs(path, "micro", {**cfg, "train": {"steps": 3, "ckpt_every": 5}})) == [("mrope", 0)]
    assert runner._done_runs(path, "micro", {**cfg, "train": {"steps": 4, "ckpt_every": 0}}) == {}
    assert runner._done_runs(path, "quick", cfg) == {}


# --- seed ranges and replication ----------------------------------------------------------------------

def test_seed_sets_are_ranges_and_replication_is_disjoint():
    disc, rep = runner.seed_sets(8, 100)
    assert disc == list(range(100, 108)) and rep == [runner.REPLICATION_OFFSET + s for s in disc]
    assert not set(disc) & set(rep)
    with pytest.raises(ValueError, match="below"):
        runner.seed_sets(2, runner.REPLICATION_OFFSET - 1)
    with pytest.raises(ValueError, match="seed_start"):
        runner.seed_sets(2, -1)


def test_replication_confirms_only_the_same_decided_verdict():
    def row(cid, verdict):
        iv = {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 2, "sd": 0.0}
        return {"id": cid, "verdict": verdict, "verdict_unadjusted": verdict, "advantage": iv,
                "advantage_adjusted": iv, "p": 1.0, "p_holm": 1.0, "seeds": [10000, 10001], "design_mean": 0.0,
                "baseline_mean": 0.0}
    disc = [row("A", "reproduced"), row("B", "reproduced"), row("C", "no effect"), row("D", "inconclusive")]
    rep = [row("A", "reproduced"), row("B", "inconclusive"), row("C", "no effect"), row("D", "reproduced")]
    runner.attach_replication(disc, rep)
    assert [c["confirmation"] for c in disc] == ["confirmed", "not confirmed", "confirmed", "nothing to confirm"]
    assert disc[3]["replication"]["verdict"] == "reproduced"  # shown, though there was nothing to confirm


def test_seed_start_and_replicate_from_the_cli(tmp_path, capsys):
    args = ["crossmodal", "--designs", "mrope,circle", "--seeds", "2", "--seed-start", "100", "--out", str(tmp_path)]
    assert _cli(*args) == 0
    runs = [json.loads(l) for l in (tmp_path / "crossmodal" / "runs.jsonl").read_text().splitlines()]
    assert sorted({r["seed"] for r in runs}) == [100, 101]
    agg = json.loads((tmp_path / "crossmodal" / "aggregate.json").read_text())
    assert agg["seed_list"] == [100, 101] and "replication" not in agg
    assert _cli(*args, "--replicate") == 0  # trains only the replication set; the discovery runs are reused
    runs = [json.loads(l) for l in (tmp_path / "crossmodal" / "runs.jsonl").read_text().splitlines()]
    assert sorted(r["seed"] for r in runs) == sorted([100, 101, 10100, 10101] * 2)
    agg = json.loads((tmp_path / "crossmodal" / "aggregate.json").read_text())
    assert agg["replication"]["seed_list"] == [10100, 10101]
    # the replication's verdicts are computed from its own seeds only
    rep = {(r["design"], r["seed"]): r["metrics"] for r in runs}
    for c in agg["claims"]:
        r = c["replication"]
        diffs = [(1 if c["better"] == "higher" else -1) * (rep[(c["design"], s)][c["metric"]]
                                                            - rep[(c["baseline"], s)][c["metric"]]) for s in (10100, 10101)]
        assert r["advantage"]["mean"] == pytest.approx(sum(diffs) / 2)
        assert c["confirmation"] in runner.CONFIRMATION
    assert "replication (2 other seeds)" in capsys.readouterr().out
    # a later discovery-only call still reports the finished replication
    assert _cli(*args) == 0
    assert "replication" in json.loads((tmp_path / "crossmodal" / "aggregate.json").read_text())


# --- report: forest plot and the table of every claim ------------------------------------------------

def _fake_family():
    """Three claims on made-up per-seed metrics (4 seeds) whose verdicts are known by hand."""
    from types import SimpleNamespace

    from ropekit.experiments.base import Claim

    claims = (Claim("A", "a beats base", "Paper §1", "acc", "a", "base", delta=0.02, delta_reason="accuracy"),
              Claim("B", "b beats base", "Paper §2", "acc", "b", "base", delta=0.02, delta_reason="accuracy"),
              Claim("C", "c is flatter", "Paper §3", "spread", "c", "base", "lower", delta=0.05, delta_reason="std"))
    base = [0.50, 0.52, 0.48, 0.51]
    vals = {"base": (base, [0.20, 0.22, 0.18, 0.21]),
            "a": ([b + d for b, d in zip(base, (0.10, 0.12, 0.11, 0.09))], [0.2] * 4),
            "b": ([b + d for b, d in zip(base, (0.05, -0.04, 0.06, -0.05))], [0.2] * 4),
            "c": ([0.5] * 4, [0.21, 0.22, 0.18, 0.20])}
    runs = [{"design": d, "seed": s, "metrics": {"acc": v[0][i], "spread": v[1][i]}}
            for d, v in vals.items() for i, s in enumerate((100, 101, 102, 103))]
    return SimpleNamespace(claims=claims), runs


def test_forest_plot_draws_each_claims_interval_band_and_verdict(tmp_path, monkeypatch):
    from ropekit.report import experiments as rexp

    exp, runs = _fake_family()
    claims = runner.verdicts(exp, runs)
    # by hand: A's differences 0.10, 0.12, 0.11, 0.09 -> mean 0.105, sd 0.012910, t(3) = 3.182 (table)
    a = claims[0]["advantage"]
    assert a["mean"] == pytest.approx(0.105) and a["hi"] - a["mean"] == pytest.approx(3.182 * 0.012910 / 2, abs=1e-4)
    assert [c["verdict"] for c in claims] == ["reproduced", "inconclusive", "no effect"]
    agg = {"experiment": "fake", "preset": "standard", "seeds": 4, "seed_list": [100, 101, 102, 103],
           "claims": claims}
    figures = []
    close = rexp.plt.close
    monkeypatch.setattr(rexp.plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    cap = rexp.plot_forest(agg, tmp_path / "forest.png", "fake")
    assert (tmp_path / "forest.png").stat().st_size > 1000 and "1 reproduced" in cap
    ax = figures[-1].axes[0]
    assert ax.get_xlabel() and ax.get_ylabel() and "sized to decide" in ax.get_title()
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["reproduced", "inconclusive", "no effect"]
    for c in claims:  # the 95 % interval and the adjusted one are drawn as horizontal segments
        xs = [tuple(l.get_xdata()) for l in ax.lines if len(l.get_xdata()) == 2]
        assert (pytest.approx(c["advantage"]["lo"]), pytest.approx(c["advantage"]["hi"])) in xs
        b = c["advantage_adjusted"]
        assert (pytest.approx(b["lo"]), pytest.approx(b["hi"])) in xs
    bands = [p.vertices[:, 0] for coll in ax.collections for p in coll.get_paths()]
    assert any(min(v) == pytest.approx(-0.05) and max(v) == pytest.approx(0.05) for v in bands)  # C's delta


def test_claims_table_lists_every_claim_and_old_aggregates_read_as_unadjusted(tmp_path):
    from ropekit.report.experiments import experiments_section

    stored = Path(__file__).resolve().parents[1] / "docs" / "results"
    sec = experiments_section(tmp_path, stored)
    html_text = sec["html"]
    assert "Every claim at a glance" in html_text
    for f in stored.glob("experiments-*.json"):
        agg = json.loads(f.read_text())
        for c in agg["claims"]:
            assert f"{c['id']}: " in html_text
    assert "quick, unadjusted" in html_text and "(unadjusted)" in html_text
    scopes = {run: m["scope"] for run, m in sec["metrics"].items()}
    # every stored aggregate has its own entry; the quick ones of 2026-11-23/24 predate adjustment
    assert len(scopes) == len(list(stored.glob("experiments-*.json")))
    for f in stored.glob("experiments-*.json"):
        agg = json.loads(f.read_text())
        run = next(r for r in scopes if r in (f.stem.removeprefix("experiments-"), agg["experiment"]))
        adjusted = bool(agg["claims"]) and "verdict_unadjusted" in agg["claims"][0]
        want = f"{agg['preset']}: sized to decide" if adjusted else f"{agg['preset']}, unadjusted"
        assert scopes[run] == want, (f.name, scopes[run])
    # the quick and the standard crossmodal aggregates do not overwrite each other's figures
    assert (tmp_path / "exp_crossmodal-standard_forest.png").exists()
    assert (tmp_path / "exp_crossmodal-quick_forest.png").exists()


# --- variance split -------------------------------------------------------------------------------------

def test_variance_split_matches_the_textbook_anova_and_recovers_known_components():
    from ropekit.experiments.variance import eval_scale_for, split

    x = [[0.50, 0.52, 0.47], [0.61, 0.58, 0.60], [0.40, 0.45, 0.43], [0.55, 0.52, 0.56]]
    S, R = 4, 3
    # one-way random-effects ANOVA (e.g. Searle, Casella & McCulloch): MS_between = R * sum (mean_s - grand)^2
    # / (S - 1), MS_within = sum (x - mean_s)^2 / (S (R - 1)); sigma2_seed = (MS_between - MS_within) / R
    means = [sum(r) / R for r in x]
    grand = sum(means) / S
    msb = R * sum((m - grand) ** 2 for m in means) / (S - 1)
    msw = sum((v - m) ** 2 for r, m in zip(x, means) for v in r) / (S * (R - 1))
    s = split(x)
    assert s["sd_eval"] ** 2 == pytest.approx(msw, rel=1e-12)
    assert s["sd_seed"] ** 2 == pytest.approx((msb - msw) / R, rel=1e-12)
    assert s["mean"] == pytest.approx(grand)
    # simulated: seed sd 0.05, evaluation sd 0.02, many seeds and draws -> both recovered
    g = torch.Generator().manual_seed(0)
    a = 0.05 * torch.randn(400, 1, generator=g, dtype=torch.float64)
    e = 0.02 * torch.randn(400, 8, generator=g, dtype=torch.float64)
    s = split((0.5 + a + e).tolist())
    assert s["sd_seed"] == pytest.approx(0.05, rel=0.1) and s["sd_eval"] == pytest.approx(0.02, rel=0.05)
    assert s["eval_share"] == pytest.approx(0.0004 / 0.0029, rel=0.2)
    with pytest.raises(ValueError):
        split([[1.0, 2.0]])
    # evaluation variance 0.03^2 against seed variance 0.03^2: a 9x larger set brings it to 10 % of the total
    assert eval_scale_for(0.03, 0.03) == pytest.approx(9.0)
    assert eval_scale_for(0.001, 0.03) == 1.0


def test_paired_designs_share_training_batches_and_evaluation_inputs(monkeypatch):
    from ropekit.experiments.variance import check_pairing

    res = check_pairing("crossmodal", ["mrope", "circle"], preset="micro", steps=5)
    assert res["paired"] and len(set(res["train"].values())) == 1 and len(set(res["eval"].values())) == 1
    res = check_pairing("resolution", ["axial", "geope"], preset="micro", steps=3)
    assert res["paired"]
    # negative control: a sampler that draws differently on each construction is caught
    exp = get("crossmodal")
    calls = []
    original = exp.sampler

    def drifting(cfg):
        calls.append(1)
        inner = original(cfg)
        return lambda g, B, layout_g=None: inner(torch.Generator().manual_seed(len(calls)), B, layout_g)

    monkeypatch.setattr(exp, "sampler", drifting)
    assert not check_pairing("crossmodal", ["mrope", "circle"], preset="micro", steps=2)["paired"]


def test_variance_cli_on_micro(tmp_path, capsys):
    assert main(["experiment", "crossmodal", "--preset", "micro", "--variance", "2", "--seeds", "2", "--designs",
                 "mrope,circle", "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "sd_seed" in out and "share training batches and evaluation inputs: yes" in out
    res = json.loads((tmp_path / "crossmodal" / "variance-micro.json").read_text())
    assert set(res["claims"]) <= {c.id for c in get("crossmodal").claims} and res["draws"] == 2
    assert res["eval_seeds"][0] == 20240917  # draw 0 is the evaluation set of every run


def test_standard_presets_reuse_quick_hyperparameters_and_run_the_claims_designs():
    from ropekit.experiments import experiments

    for name in experiments():
        exp = get(name)
        std, quick = exp.presets["standard"], exp.presets["quick"]
        # one set of hyper-parameters: the model, the training and the task are quick's
        assert std["model"] == quick["model"] and std["task"] == quick["task"]
        assert {k: v for k, v in std["train"].items() if k != "ckpt_every"} == \
               {k: v for k, v in quick["train"].items() if k != "ckpt_every"}
        designs = runner.default_designs(exp, "standard")
        assert set(designs) == {d for c in exp.claims for d in (c.design, c.baseline)}
        assert runner.default_seeds(exp, "standard") >= 20
        assert runner.default_seeds(exp, "quick") == 3 and runner.default_designs(exp, "quick")[0] == exp.designs[0]
        for c in exp.claims:
            assert 0 < c.delta <= 0.02 and c.delta_reason  # accuracy-type metrics: delta <= 0.02
