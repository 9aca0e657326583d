"""Stacked seed ensembles: each member computes what its model computes alone, whatever the group size."""
from __future__ import annotations

import copy

import pytest
import torch

from ropekit.experiments import get, runner
from ropekit.experiments.ensemble import SharedEval, clip_per_model, stack, supported, unstack
from ropekit.experiments.models import TableCache
from ropekit.experiments.train import draw

CPU = torch.device("cpu")


def _models(name, design, seeds, preset="micro"):
    exp = get(name)
    cfg = exp.presets[preset]
    out = []
    for s in seeds:
        torch.manual_seed(s)
        out.append(exp.make_model(design, cfg))
    return exp, cfg, out


@pytest.mark.parametrize("name,design", [("crossmodal", "circle-age-alternate"), ("video", "vrope"),
                                         ("resolution", "learned"), ("resolution", "geope"),
                                         ("pointcloud", "nd-sobol")])
def test_stacked_forward_and_gradients_equal_each_model_alone(name, design):
    exp, cfg, models = _models(name, design, [3, 4, 5])
    ref = [copy.deepcopy(m).double() for m in models]
    st = stack(models).double()
    batches = [draw(exp.sampler(cfg), s, 0, 4) for s in (3, 4, 5)]
    assert len({b.layout for b in batches}) == 1  # the layout stream is shared by the seeds
    x = torch.cat([b.tokens for b in batches])
    x = x.double() if x.is_floating_point() else x
    out = st(x, batches[0].layout)
    out.square().sum().backward()
    for k, (m, b) in enumerate(zip(ref, batches)):
        xk = b.tokens.double() if b.tokens.is_floating_point() else b.tokens
        alone = m(xk, b.layout)
        torch.testing.assert_close(out[4 * k:4 * (k + 1)], alone, rtol=1e-12, atol=1e-12)
        alone.square().sum().backward()
    back = unstack(st, lambda: exp.make_model(design, cfg).double())
    for k, m in enumerate(ref):  # gradients of the stacked parameters are each model's own
        for (name_, p), q in zip(m.named_parameters(), _grads_of(st, k, back[k])):
            torch.testing.assert_close(q, p.grad, rtol=1e-10, atol=1e-12, msg=name_)


def _grads_of(st, k, template):
    """Member k's gradients in ``template``'s parameter order (via an unstack of the gradients)."""
    m = unstack(_as_grads(st), lambda: copy.deepcopy(template))[k]
    return [p.data for p in m.parameters()]


def test_unstack_gives_the_models_back_and_unsupported_designs_say_why():
    exp, cfg, models = _models("resolution", "learned", [0, 1])
    back = unstack(stack(models), lambda: exp.make_model("learned", cfg))
    for a, b in zip(models, back):
        for (n, p), q in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(p, q), n
    _, _, mixed = _models("resolution", "mixed", [0])
    assert "freqs" in supported(mixed[0])
    with pytest.raises(NotImplementedError, match="one seed at a time"):
        stack([mixed[0], copy.deepcopy(mixed[0])])


def test_clip_per_model_is_clip_grad_norm_of_each_model():
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 2)) for _ in range(3)]
    st = stack(models)
    x = torch.randn(3 * 4, 5)
    (st(x) * 50).square().sum().backward()
    total = clip_per_model(list(st.parameters()), 3, 1.0)
    for k, m in enumerate(models):
        (m(x[4 * k:4 * (k + 1)]) * 50).square().sum().backward()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        assert float(total[k]) == pytest.approx(float(norm), rel=1e-5)
        mine = unstack(_as_grads(st), lambda: copy.deepcopy(m))[k]
        for p, q in zip(m.parameters(), mine.parameters()):
            torch.testing.assert_close(q.data, p.grad, rtol=1e-5, atol=1e-7)


def _as_grads(st):
    """A copy of the stacked module whose parameters hold the gradients."""
    g = copy.deepcopy(st)
    for p, q in zip(st.parameters(), g.parameters()):
        q.data = p.grad.clone()
    return g


def test_group_runs_match_single_runs_and_do_not_depend_on_the_group():
    exp = get("crossmodal")
    cfg = exp.presets["micro"]
    alone = [runner.run_one(exp, "mrope", s, cfg, CPU) for s in (0, 1, 2)]
    three = runner.run_group(exp, "mrope", [0, 1, 2], cfg, CPU)
    two = runner.run_group(exp, "mrope", [1, 2], cfg, CPU)
    for a, b in zip(alone, three):
        assert b["seed"] == a["seed"] and b["stacked"] == [0, 1, 2]
        assert b["losses"] == pytest.approx(a["losses"], abs=1e-5)
        assert b["metrics"]["acc"] == pytest.approx(a["metrics"]["acc"], abs=1 / 32)
    for a, b in zip(three[1:], two):  # bit for bit, whatever the group
        assert a["losses"] == b["losses"] and a["metrics"] == b["metrics"]


def test_group_resumes_from_its_checkpoint(tmp_path):
    exp = get("resolution")
    cfg = exp.presets["micro"]
    full = runner.run_group(exp, "axial", [0, 1], cfg, CPU)
    ckpt = tmp_path / "g.pt"
    assert runner.run_group(exp, "axial", [0, 1], cfg, CPU, ckpt=ckpt, stop_after=3) == []
    resumed = runner.run_group(exp, "axial", [0, 1], cfg, CPU, ckpt=ckpt)
    for a, b in zip(full, resumed):
        assert a["losses"] == b["losses"] and a["metrics"] == b["metrics"]
    with pytest.raises(ValueError, match="holds seeds"):
        runner.run_group(exp, "axial", [5, 6], cfg, CPU, ckpt=ckpt)


def test_shared_eval_runs_each_batch_once_for_all_members():
    exp, cfg, models = _models("resolution", "axial", [0, 1])
    st = stack(models).eval()
    record: list = []
    members = [SharedEval(st, k, record) for k in range(2)]
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        a0 = members[0](x)
        assert len(record) == 1
        a1 = members[1](x)  # answered from the record
        assert len(record) == 1
        torch.testing.assert_close(a0, models[0](x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a1, models[1](x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,design", [("crossmodal", "circle"), ("resolution", "nd-weyl"), ("resolution", "geope")])
def test_cached_tables_rotate_exactly_as_the_rotary(name, design):
    exp, cfg, (m,) = _models(name, design, [0])
    rot = m.blocks[0].attn.rotary
    assert isinstance(rot, TableCache)
    g = torch.Generator().manual_seed(0)
    coords = torch.rand(10, 2, generator=g) * 5 if name == "resolution" else torch.rand(10, 3, generator=g) * 5
    q, k = torch.randn(2, 2, 10, rot.head_dim, generator=g), torch.randn(2, 2, 10, rot.head_dim, generator=g)
    for _ in range(2):  # built, then from the cache
        for a, b in zip(rot.rotate(q, k, coords), rot.rotary.rotate(q, k, coords)):
            assert torch.equal(a, b)
