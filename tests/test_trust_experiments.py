"""Trust in what an experiment folder holds ("Trust, round 3", items 1-4).

A folder written by ``ropekit experiment`` is what people share: resuming it must not run code from its
checkpoints; a tampered model config, a NaN metric (a diverged run) or a non-numeric metric must give a
clear answer, never a silent change of the summary; and a claim whose paired differences never vary is
not evidence of "no effect". References are hand computations, the pickle itself (which does run code when
unpickled in full) and the statistics' own definitions.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from ropekit.cli import main
from ropekit.experiments import get, runner
from ropekit.experiments.base import Claim
from ropekit.experiments.stats import adjusted_verdicts, mean_interval, paired_test, paired_verdict


# --- 1. a checkpoint that would run code is refused -------------------------------------------------

class _Payload:
    """Unpickling this creates ``marker``: a stand-in for a checkpoint that runs os.system."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _malicious(path: Path, marker: Path, **extra) -> Path:
    torch.save({"model": _Payload(marker), "opt": {}, "sched": {}, "step": 1, "losses": [0.0], "seconds": 0.0,
                "cpu_seconds": 0.0, **extra}, path)
    # the file really is malicious: a full unpickling (what weights_only=False did) creates the marker
    torch.load(path, weights_only=False)
    assert marker.exists()
    marker.unlink()
    return path


def test_a_checkpoint_holding_code_is_refused_and_runs_nothing(tmp_path):
    exp = get("crossmodal")
    cfg = exp.presets["micro"]
    marker = tmp_path / "marker"
    dev = torch.device("cpu")
    ckpt = _malicious(tmp_path / "run.pt", marker)
    with pytest.raises(ValueError, match=r"checkpoint '.*run\.pt' holds objects other than tensors.*refused.*"
                                         r"Delete the file"):
        runner.run_one(exp, "mrope", 0, cfg, dev, ckpt=ckpt)
    assert not marker.exists()
    group = _malicious(tmp_path / "group.pt", marker, seeds=[0, 1])  # a stacked ensemble's checkpoint
    with pytest.raises(ValueError, match=r"checkpoint '.*group\.pt' holds objects other than tensors"):
        runner.run_group(exp, "mrope", [0, 1], cfg, dev, ckpt=group)
    assert not marker.exists()


def test_resuming_a_shared_experiment_folder_with_a_malicious_checkpoint_fails_cleanly(tmp_path, capsys):
    """The issue's scenario: ``ropekit experiment NAME --out that_folder`` finds the unfinished run's checkpoint
    (named as the runner names it) and resumes it."""
    marker = tmp_path / "marker"
    (tmp_path / "crossmodal" / "ckpt").mkdir(parents=True)
    _malicious(tmp_path / "crossmodal" / "ckpt" / "micro-mrope-s0.pt", marker)
    code = main(["experiment", "crossmodal", "--preset", "micro", "--designs", "mrope", "--seeds", "1",
                 "--out", str(tmp_path), "--quiet"])
    assert code != 0 and not marker.exists()
    assert "micro-mrope-s0.pt" in capsys.readouterr().err


def test_a_checkpoint_ropekit_writes_loads_with_weights_only(tmp_path):
    """What the trainer saves (state dicts, lists, numbers) passes torch's own safe loader, so resuming still
    works (a resumed run equals the uninterrupted one: test_experiments.py and test_ensemble.py)."""
    exp = get("crossmodal")
    cfg = exp.presets["micro"]
    dev = torch.device("cpu")
    assert runner.run_one(exp, "mrope", 0, cfg, dev, ckpt=tmp_path / "one.pt", stop_after=2) is None
    assert runner.run_group(exp, "mrope", [0, 1], cfg, dev, ckpt=tmp_path / "group.pt", stop_after=2) == []
    for name in ("one.pt", "group.pt"):
        state = torch.load(tmp_path / name, weights_only=True)
        assert state["step"] == 2 and set(state) >= {"model", "opt", "sched", "losses"}


# --- 2. a tampered `ropekit.format` in a saved model's config.json ----------------------------------

def test_a_non_int_record_format_in_config_json_is_a_clear_error(tmp_path):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from ropekit.hf import patch_model
    import ropekit
    from ropekit.hf.persist import CONFIG_KEY, FORMAT

    text = dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, vocab_size=80,
                num_hidden_layers=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})
    cfg = Qwen2VLConfig(text_config=text, image_token_id=70, video_token_id=71,
                        vision_config=dict(depth=1, num_heads=2, spatial_merge_size=2, patch_size=2,
                                           temporal_patch_size=2, embed_dim=16, hidden_size=32, mlp_ratio=1))
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    patch_model(model, "circle")
    model.save_pretrained(tmp_path / "saved")
    path = tmp_path / "saved" / "config.json"
    good = json.loads(path.read_text())
    assert good[CONFIG_KEY]["format"] == FORMAT
    for bad in ("1", None, 1.0, True, [1]):
        path.write_text(json.dumps({**good, CONFIG_KEY: {**good[CONFIG_KEY], "format": bad}}))
        said = r"config\.ropekit\['format'\] must be an int .*got " + re.escape(repr(bad))
        with pytest.raises(ValueError, match=said):
            ropekit.hf.from_pretrained(tmp_path / "saved", Qwen2VLForConditionalGeneration)
    path.write_text(json.dumps(good))  # the untouched record restores the patch
    assert ropekit.hf.is_patched(ropekit.hf.from_pretrained(tmp_path / "saved", Qwen2VLForConditionalGeneration))


# --- 3. a NaN metric (a diverged run) and a zero-variance claim ---------------------------------------

_CLAIMS = (Claim("A", "a beats base", "Paper §1", "acc", "a", "base", delta=0.02, delta_reason="accuracy"),
           Claim("F", "a beats base far away", "Paper §2", "far", "a", "base", delta=0.02, delta_reason="accuracy"))


def _runs(acc: dict, far: dict) -> list[dict]:
    return [{"design": d, "seed": s, "metrics": {"acc": acc[d][i], "far": far[d][i]}}
            for d in acc for i, s in enumerate((0, 1, 2, 3))]


def test_a_nan_run_keeps_its_metric_and_is_named():
    nan = float("nan")
    acc = {"base": [0.50, 0.52, 0.48, 0.51], "a": [0.61, nan, 0.58, 0.60]}
    far = {"base": [0.25] * 4, "a": [0.30, 0.31, 0.29, 0.33]}
    runs = _runs(acc, far)
    agg = runner.aggregate(runs)
    # the metric stays for every design; a's interval is that of its three finite values, by hand:
    # mean 0.59667, sd 0.015275, t(2) = 4.303 -> half-width 0.037946
    a = agg["a"]["acc"]
    assert a["n"] == 3 and a["nonfinite_seeds"] == [1]
    assert a["mean"] == pytest.approx(0.596667, abs=1e-6)
    assert a["hi"] - a["mean"] == pytest.approx(4.303 * 0.015275 / math.sqrt(3), abs=1e-4)
    assert agg["base"]["acc"]["n"] == 4 and "nonfinite_seeds" not in agg["base"]["acc"]
    assert runner.nonfinite_runs(runs) == {"a": [{"seed": 1, "metrics": ["acc"]}]}
    # the claim on acc is still tested, on the three complete pairs, and says which seed it left out
    exp = SimpleNamespace(claims=_CLAIMS)
    claims = {c["id"]: c for c in runner.verdicts(exp, runs)}
    c = claims["A"]
    assert c["seeds"] == [0, 2, 3] and c["nonfinite_seeds"] == {"a": [1]}
    assert c["advantage"]["mean"] == pytest.approx((0.11 + 0.10 + 0.09) / 3)
    assert c["family"] == 2
    full = {"experiment": "fake", "preset": "standard", "seeds": 4, "metrics": agg, "claims": list(claims.values()),
            "nonfinite_runs": runner.nonfinite_runs(runs)}
    text = runner.summary_table(full)
    header, base_line, a_line = text.splitlines()[1:4]
    assert "acc" in header.split() and "far" in header.split()
    assert a_line.startswith("a ") and "0.597" in a_line and "*" in a_line  # kept, and marked
    assert f"{(0.50 + 0.52 + 0.48 + 0.51) / 4:.3f}" in base_line and "*" not in base_line
    assert "a seed 1 (acc)" in text and "left out (NaN or infinite acc): a seed(s) 1" in text


def test_a_metric_nan_in_every_run_is_kept_and_its_claim_is_not_informative():
    nan = float("nan")
    acc = {"base": [0.50, 0.52, 0.48, 0.51], "a": [0.61, 0.63, 0.58, 0.60]}
    far = {"base": [0.25] * 4, "a": [nan] * 4}
    runs = _runs(acc, far)
    agg = runner.aggregate(runs)
    assert agg["a"]["far"]["n"] == 0 and agg["a"]["far"]["nonfinite_seeds"] == [0, 1, 2, 3]
    assert math.isnan(agg["a"]["far"]["mean"])
    claims = {c["id"]: c for c in runner.verdicts(SimpleNamespace(claims=_CLAIMS), runs)}
    assert claims["F"]["verdict"] == claims["F"]["verdict_unadjusted"] == "not informative"
    assert "no seed has a finite far" in claims["F"]["reason"]
    # a claim with nothing to test is outside the family: A is adjusted as the only claim
    assert claims["A"]["family"] == 1
    assert claims["A"]["p_holm"] == pytest.approx(paired_test([0.11, 0.11, 0.10, 0.09])["p"])
    text = runner.summary_table({"experiment": "fake", "preset": "standard", "seeds": 4, "metrics": agg,
                                 "claims": list(claims.values())})
    assert "no finite value" in text and "not informative" in text


@pytest.mark.parametrize("diff", [0.0, 0.0625])
def test_a_zero_variance_paired_sample_is_not_informative(diff):
    """Identical paired differences in every seed give a zero-width interval: no measured noise, so neither
    "no effect" (diff 0, the chance-level case) nor a decided sign (a constant non-zero diff) follows."""
    base = [0.25] * 4
    a = [b + diff for b in base]
    assert paired_verdict(a, base, delta=0.02)["verdict"] == "not informative"
    # the invariant the verdict rests on: any spread at all makes the test informative again
    wobble = [x + e for x, e in zip(a, (0.001, -0.001, 0.0, 0.0))]
    assert paired_verdict(wobble, base, delta=0.02)["verdict"] != "not informative"
    # in a family it tests nothing (p 1) and still counts in Holm's m, so another claim is adjusted for two
    real = [0.11, 0.12, 0.10, 0.09]
    rows = adjusted_verdicts([[diff] * 4, real], [0.02, 0.02])
    assert rows[0]["verdict"] == "not informative" and rows[0]["p"] == 1.0
    assert rows[1]["verdict"] == "reproduced"
    assert rows[1]["p_holm"] == pytest.approx(min(1.0, 2 * paired_test(real)["p"]))


def test_a_not_informative_discovery_has_nothing_to_confirm_and_the_report_says_why(tmp_path):
    from ropekit.report import experiments as rexp

    acc = {"base": [0.50, 0.52, 0.48, 0.51], "a": [0.61, 0.63, 0.58, 0.60]}
    far = {"base": [0.25] * 4, "a": [0.25] * 4}  # both at chance in every run
    exp = SimpleNamespace(claims=_CLAIMS)
    disc = runner.verdicts(exp, _runs(acc, far))
    rep = runner.verdicts(exp, _runs(acc, far))
    runner.attach_replication(disc, rep)
    f = next(c for c in disc if c["id"] == "F")
    assert f["verdict"] == "not informative" and f["confirmation"] == "nothing to confirm"
    assert "every one of the 4 seeds" in f["reason"]
    agg = {"experiment": "fake", "preset": "standard", "seeds": 4, "seed_list": [0, 1, 2, 3], "claims": disc,
           "replication": {"seeds": 4}}
    html = rexp.claims_table([("fake", agg)])
    assert "<b>not informative</b>" in html and "every one of the 4 seeds" in html
    assert "no effect" not in html
    assert "not informative" in rexp.VERDICT_COLOURS
    rexp.plot_forest(agg, tmp_path / "forest.png", "fake")


def test_report_escapes_strings_from_a_received_aggregate():
    from ropekit.report import experiments as rexp

    acc = {"base": [0.50, 0.52, 0.48, 0.51], "a": [0.61, 0.63, 0.58, 0.60]}
    far = {"base": [0.25, 0.26, 0.24, 0.25], "a": [0.30, 0.31, 0.29, 0.33]}
    claims = runner.verdicts(SimpleNamespace(claims=_CLAIMS), _runs(acc, far))
    evil = "<script>alert(1)</script>"
    claims[0].update(metric=evil, design=evil, id=evil)
    agg = {"experiment": "fake", "preset": evil, "seeds": 4, "seed_list": [0, 1, 2, 3], "claims": claims}
    out = rexp.claims_table([("fake", agg)]) + rexp._verdicts(agg)
    assert "<script>" not in out and "&lt;script&gt;" in out


def test_crossmodal_micro_nan_run_end_to_end(tmp_path):
    """Stored runs of the brief's command (crossmodal, micro, circle vs mrope, 2 seeds), one with a NaN metric
    and three claims at the same chance value in both designs: the rerun trains nothing and reports both."""
    exp = get("crossmodal")
    cfg = exp.presets["micro"]
    nan = float("nan")
    metrics = {("mrope", 0): [0.40, 0.10, 0.25, 0.5, 0.0], ("mrope", 1): [0.42, 0.12, 0.25, 0.5, 0.0],
               ("circle", 0): [0.44, 0.08, 0.25, 0.5, 0.0], ("circle", 1): [nan, 0.05, 0.25, 0.5, 0.0]}
    keys = ("acc", "cell_spread", "acc_long_gap", "acc_large_grid", "acc_multi")
    folder = tmp_path / "crossmodal"
    folder.mkdir()
    with (folder / "runs.jsonl").open("w") as f:
        for (d, s), vs in metrics.items():
            f.write(json.dumps({"preset": "micro", "design": d, "seed": s, "config": cfg,
                                "metrics": dict(zip(keys, vs)), "steps": 12, "train_s": 1.2,
                                "train_cpu_s": 1.2}) + "\n")
    agg = runner.run_experiment("crossmodal", designs=["mrope", "circle"], seeds=2, preset="micro", out=tmp_path,
                                progress=False)
    stored = json.loads((folder / "aggregate.json").read_text())
    assert stored["metrics"]["circle"]["acc"]["nonfinite_seeds"] == [1]
    assert stored["metrics"]["circle"]["acc"]["mean"] == pytest.approx(0.44)
    assert stored["metrics"]["mrope"]["acc"]["mean"] == pytest.approx(0.41)
    assert stored["nonfinite_runs"] == {"circle": [{"seed": 1, "metrics": ["acc"]}]}
    verdict = {c["id"]: c["verdict"] for c in stored["claims"]}
    assert verdict["C2"] == verdict["C3"] == verdict["C4"] == "not informative"
    assert verdict["C1"] != "not informative"  # cell_spread differs by 0.02 and 0.07: it varies
    text = runner.summary_table(agg)
    assert "acc " in text.splitlines()[1] + " " and "circle seed 1 (acc)" in text


# --- 4. a runs.jsonl record with a non-numeric metric ----------------------------------------------------

def _record(**metrics):
    return {"preset": "micro", "design": "mrope", "seed": 0, "config": {"train": {"steps": 1}},
            "metrics": {"acc": 0.5, **metrics}}


@pytest.mark.parametrize("metrics,said", [({"acc": "high"}, "'high', not a number"),
                                          ({"acc_vs_gap": {"0": 0.5, "8": "high"}}, "a curve holding 'high'"),
                                          ({"cell_acc": [[0.5, None]]}, "a grid holding None"),
                                          ({"acc": True}, "True, not a number")])
@pytest.mark.parametrize("line", [2, 3])  # in the middle, and the last line (not a crash: no cut-off line)
def test_a_non_numeric_metric_names_the_file_and_line(tmp_path, metrics, said, line):
    path = tmp_path / "crossmodal" / "runs.jsonl"
    path.parent.mkdir()
    lines = [_record(), {**_record(), "seed": 1}, {**_record(), "seed": 2}]
    lines[line - 1] = {**_record(**metrics), "seed": line - 1}
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    where = re.escape(str(path))
    with pytest.raises(ValueError, match=rf"'{where}' line {line} is not a valid run record: metric '\w+' of mrope "
                                         rf"seed {line - 1} is {said}"):
        runner.read_runs(path)
    # the runner, which reads the file before training anything, says the same
    with pytest.raises(ValueError, match=rf"line {line} is not a valid run record"):
        runner.run_experiment("crossmodal", designs=["mrope"], seeds=1, preset="micro", out=tmp_path, progress=False)
    # NaN and infinity are numbers a run may yield (a diverged run): they are read, not refused
    lines[line - 1] = {**_record(acc=float("nan")), "seed": line - 1}
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert math.isnan(runner.read_runs(path)[line - 1]["metrics"]["acc"])
