"""Property tests (hypothesis) for layouts, position designs and the batched index.

Valid inputs: every registered design gives finite float32 ``(L, A)`` positions, deterministically; the
batched ``rope_index`` equals each sample's own ``positions`` whatever the padding; every Circle-RoPE
ring (each image, each video frame) is equidistant from every text token, checked by a float64
brute-force distance computation; ``Layout.parse(str(layout)) == layout``.

Invalid inputs: every public entry point of the layout / design / index stages raises only ValueError
or TypeError, with a message that names the offending argument.

Budgets are small and fixed (``max_examples``), ``deadline=None``, no example database on disk.
"""
import math
import re

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ropekit
from ropekit import Grid, Image, Layout, Text, Video, positions
from ropekit.age import age_schedule
from ropekit.designs import get_design
from ropekit.designs.registry import num_axes
from ropekit.index import decode_positions, rope_index

DESIGNS = ropekit.designs()
MERGE = 2
TPS = 2.0
SECONDS = (0.25, 0.35, 0.5, 1.0, 1.5)  # Qwen2.5-VL second_per_grid_ts values (float32 in the index)
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def budget(n):
    return settings(max_examples=n, deadline=None, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def video_interval(seconds):
    """The interval rope_index gives a video: tokens_per_second times the float32 seconds, as transformers."""
    return float(TPS * torch.tensor([seconds], dtype=torch.float32)[0])


# ------------------------------------------------------------------------------------------- strategies

small = st.integers(1, 4)
texts = st.builds(Text, st.integers(1, 5))
images = st.builds(Image, small, small)
videos = st.builds(Video, st.integers(1, 3), st.integers(1, 3), st.integers(1, 3),
                   st.sampled_from(SECONDS).map(video_interval))
grids2 = st.builds(Grid, small, small)
grids3 = st.builds(Grid, st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))


def merge_text(segments):
    """Adjacent text runs joined (a batch cannot tell 'T2 T3' from 'T5')."""
    out = []
    for s in segments:
        if out and isinstance(s, Text) and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].n + s.n)
        else:
            out.append(s)
    return Layout(out)


@st.composite
def layouts(draw, grids=True, max_segments=6):
    """Small valid layouts. Spatial ranks are not mixed (VRoPE needs one rank per layout): either text
    with images, videos and 2-D grids, or text with 3-D grids."""
    rank3 = grids and draw(st.booleans()) and draw(st.booleans())
    vision = grids3 if rank3 else st.one_of(images, videos, grids2) if grids else st.one_of(images, videos)
    segs = draw(st.lists(st.one_of(texts, vision), min_size=1, max_size=max_segments))
    return merge_text(segs)


# ----------------------------------------------------------------------------------------- valid inputs

@pytest.mark.parametrize("design", DESIGNS)
@budget(25)
@given(lay=layouts())
def test_every_design_gives_finite_float32_positions_deterministically(design, lay):
    pos = positions(lay, design)
    assert pos.dtype == torch.float32 and pos.ndim == 2 and pos.shape[0] == lay.num_tokens
    declared = num_axes(get_design(design), lay, {})
    assert declared is None or pos.shape[1] == declared
    assert torch.isfinite(pos).all()
    assert torch.equal(pos, positions(str(lay), design))  # deterministic, and the string form is the same layout
    text = torch.cat([torch.full((s.num_tokens,), isinstance(s, Text)) for s in lay])
    if text.all():  # text-only input is 1-D RoPE in every design
        assert torch.equal(pos, torch.arange(lay.num_tokens, dtype=torch.float32)[:, None].expand_as(pos))


@st.composite
def batches(draw):
    """2-3 samples (text, images, videos; no grids: a batch only knows images and videos) and a padding side."""
    samples = draw(st.lists(layouts(grids=False, max_segments=5), min_size=1, max_size=3))
    return samples, draw(st.sampled_from(["left", "right"])), draw(st.integers(0, 2))


def batch_inputs(samples, pad, extra):
    """The Hugging Face inputs for ``samples``: token types, mask, patch grids (× MERGE) and seconds."""
    length = max(s.num_tokens for s in samples) + extra
    types = torch.zeros(len(samples), length, dtype=torch.long)
    mask = torch.zeros(len(samples), length, dtype=torch.long)
    image_grids, video_grids, seconds = [], [], []
    for b, lay in enumerate(samples):
        n = lay.num_tokens
        where = slice(0, n) if pad == "right" else slice(length - n, length)
        types[b, where] = lay.token_types()
        mask[b, where] = 1
        for s in lay:
            if isinstance(s, Image):
                image_grids.append([1, MERGE * s.h, MERGE * s.w])
            elif isinstance(s, Video):
                video_grids.append([s.t, MERGE * s.h, MERGE * s.w])
                seconds.append(next(x for x in SECONDS if video_interval(x) == s.interval))
    return dict(mm_token_type_ids=types, attention_mask=mask,
                image_grid_thw=torch.tensor(image_grids) if image_grids else None,
                video_grid_thw=torch.tensor(video_grids) if video_grids else None,
                second_per_grid_ts=torch.tensor(seconds, dtype=torch.float32) if seconds else None,
                tokens_per_second=TPS)


@pytest.mark.parametrize("design", DESIGNS)
@budget(15)
@given(batch=batches())
def test_batched_index_equals_each_samples_positions(design, batch):
    samples, pad, extra = batch
    inputs = batch_inputs(samples, pad, extra)
    pos, delta = rope_index(None, **inputs, design=design)
    mask = inputs["attention_mask"].bool()
    for b, lay in enumerate(samples):
        own = positions(lay, design)
        assert pos.shape == (own.shape[1], len(samples), mask.shape[1]) and pos.dtype == torch.float32
        assert torch.equal(pos[:, b, mask[b]], own.T)
        assert not pos[:, b, ~mask[b]].any()  # padding holds zeros
        # text continues past the largest coordinate on the design's delta axes (all axes unless it names some)
        axes = list(get_design(design).delta_axes or range(own.shape[1]))
        expected = own[:, axes].double().max().item() + 1 - lay.num_tokens
        assert delta[b, 0].item() == pytest.approx(expected, abs=1e-3)


@budget(20)
@given(batch=batches(), opts=st.deferred(lambda: circle_options()))
def test_batched_circle_with_options_equals_each_samples_positions(batch, opts):
    """Circle's block rule on a whole batch (gap Δ between the blocks of each sample, auto radius, intervals,
    left or right padding) gives each sample exactly its own positions()."""
    samples, pad, extra = batch
    inputs = batch_inputs(samples, pad, extra)
    pos, _ = rope_index(None, **inputs, design="circle", **opts)
    mask = inputs["attention_mask"].bool()
    for b, lay in enumerate(samples):
        assert torch.equal(pos[:, b, mask[b]], positions(lay, "circle", **opts).T), (str(lay), opts)


@st.composite
def circle_options(draw):
    opts = {}
    if draw(st.booleans()):
        opts["alpha"] = draw(st.floats(0.0, 1.0))
    if draw(st.booleans()):
        opts["radius"] = draw(st.one_of(st.just("auto"), st.floats(0.1, 100.0)))
    if draw(st.booleans()):
        opts["k"] = draw(st.floats(0.1, 10.0))
    if draw(st.booleans()):
        opts["measure"] = draw(st.sampled_from(["l2", "max_abs"]))
    if draw(st.booleans()):
        opts["delta"] = draw(st.floats(0.0, 5.0))
    if draw(st.booleans()):  # any positive multiple of the text direction (1, 1, 1)
        opts["text_vector"] = (draw(st.floats(1e-3, 1e3)),) * 3
    return opts


@budget(40)
@given(lay=layouts(), opts=circle_options())
def test_circle_every_ring_is_equidistant_from_every_text_token(lay, opts):
    """PTD = 0 per ring: for each text token, its float64 distance to every token of one image ring (or of one
    video frame's ring) is the same."""
    assume(any(isinstance(s, Text) for s in lay) and not all(isinstance(s, Text) for s in lay))
    pos = positions(lay, "circle", **opts).double()
    start, rings, text = 0, [], []
    for s in lay:
        n = s.num_tokens
        if isinstance(s, Text):
            text.append(pos[start:start + n])
        else:
            frames = s.t if isinstance(s, Video) else s.sizes[0] if isinstance(s, Grid) and len(s.sizes) == 3 else 1
            rings += list(pos[start:start + n].reshape(frames, n // frames, 3))
        start += n
    text = torch.cat(text)
    scale = max(1.0, pos.abs().max().item())
    for ring in rings:
        d = torch.cdist(text, ring)  # (text tokens, ring tokens)
        spread = (d.max(dim=1).values - d.min(dim=1).values).max().item()
        assert spread <= 1e-5 * scale, (str(lay), opts, spread)


intervals = st.one_of(st.floats(0.0, FLOAT32_MAX), st.floats(0.0, 10.0), st.sampled_from([1 / 3, 0.1, 2 / 7, 1.0]))
big = st.integers(1, 2**20)


@st.composite
def any_layouts(draw):
    """Layouts of any sizes and intervals (descriptions only: nothing is placed)."""
    seg = st.one_of(
        st.builds(Text, big), st.builds(Image, big, big),
        st.builds(Video, big, big, big, intervals),
        st.lists(st.integers(1, 2**10), min_size=1, max_size=4).map(lambda s: Grid(*s)),
    )
    return Layout(draw(st.lists(seg, min_size=1, max_size=6)))


@budget(200)
@given(lay=any_layouts())
def test_layout_string_round_trips(lay):
    text = str(lay)
    assert Layout.parse(text) == lay
    assert Layout.parse(text.replace(" ", ", ")) == lay


# --------------------------------------------------------------------------------------- invalid inputs

def fails_cleanly(call, *names):
    """Run ``call``; any failure must be a ValueError/TypeError whose message names one of ``names``."""
    try:
        return call()
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert any(n in msg for n in names), f"{type(e).__name__}: {msg!r} names none of {names}"
        return None


junk = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.binary(max_size=4), st.lists(st.integers(-3, 3), max_size=4),
    st.tuples(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3), st.floats(-1e3, 1e3)),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.builds(torch.tensor, st.lists(st.floats(-10, 10), max_size=3)),
    st.builds(torch.tensor, st.integers(-5, 5)),
)
near_segment = st.from_regex(
    r"\A(T-?[0-9]{0,21}|I[0-9]{0,3}x?[0-9]{0,3}|V[0-9]{0,2}x[0-9]{0,2}x?[0-9]{0,2}(@[0-9.eE+-]{0,6})?"
    r"|V[1-9]x[1-9]x[1-9]@[0-9.eE+-]{0,6}|G[0-9]{0,2}(x[0-9]{0,2}){0,3}|[A-Za-z][0-9x@]{0,4})\Z")
layout_text = st.one_of(st.text(alphabet="TIVGx@0123456789.eE+- ,", max_size=24), near_segment,
                        st.lists(near_segment, min_size=0, max_size=4).map(" ".join))


@budget(300)
@given(text=st.one_of(layout_text, st.text(max_size=12), junk))
def test_layout_parse_rejects_cleanly(text):
    lay = fails_cleanly(lambda: Layout.parse(text), "Layout", "`n`", "`h`", "`w`", "`t`", "`interval`", "`sizes")
    if lay is not None:  # whatever parses, round-trips
        assert Layout.parse(str(lay)) == lay


@budget(200)
@given(kind=st.sampled_from(["Text", "Image", "Video", "Grid"]), args=st.lists(st.one_of(junk, small), max_size=5))
def test_segment_constructors_reject_cleanly(kind, args):
    cls = {"Text": Text, "Image": Image, "Video": Video, "Grid": Grid}[kind]
    names = ("`n`", "`h`", "`w`", "`t`", "`interval`", "`sizes[", "Grid:", "takes", "argument")
    seg = fails_cleanly(lambda: cls(*args), *names)
    if seg is not None:
        assert Layout.parse(str(seg)) == Layout([seg])


PLAUSIBLE = {  # values each known option accepts (so that one bad value at a time is what gets tested)
    "alpha": st.floats(0.0, 1.0), "radius": st.one_of(st.just("auto"), st.floats(0.1, 100.0)),
    "k": st.floats(0.1, 10.0), "measure": st.sampled_from(["l2", "max_abs"]), "delta": st.floats(0.0, 5.0),
    "text_vector": st.just((1.0, 1.0, 1.0)), "continuation": st.sampled_from(["max", "spatial"]),
    "spatial_dims": st.just(2), "order": st.sampled_from(["reference", "paper"]),
}
huge = st.sampled_from([1e39, 1e300, 10**400, 3.3e38])  # finite numbers whose positions may leave float32
extreme = st.sampled_from([1e39, 3e38, 1e300, 10**400, -1e-300, 5e-324, 2**63, 24, 11, (1e308,) * 3, (1, 1e-320, 0),
                           float("nan"), float("inf"), "auto", "paper", "max", 0, -1])


@st.composite
def option_sets(draw, design):
    """Some of the design's options with plausible values, one of them (or an unknown name) given junk."""
    known = list(get_design(design).options)
    keys = draw(st.lists(st.sampled_from(known), max_size=len(known), unique=True)) if known else []
    opts = {k: draw(PLAUSIBLE.get(k, junk)) for k in keys}
    roll = draw(st.integers(0, 5))
    if roll and known:  # mostly a known option with a bad value, now and then a name the design does not take
        opts[draw(st.sampled_from(known)) if roll > 1 else draw(st.text("abcdefgh_", min_size=1, max_size=6))] = \
            draw((junk, extreme, huge)[draw(st.integers(0, 2))])
    return opts


@pytest.mark.parametrize("design", DESIGNS)
@budget(80)
@given(data=st.data())
def test_positions_with_random_options_fail_cleanly(design, data):
    opts = data.draw(option_sets(design))
    lay = data.draw(layouts(grids=False, max_segments=5))
    pos = fails_cleanly(lambda: positions(lay, design, **opts), *(f"`{k}`" for k in opts),
                        *(f"{k}=" for k in opts), "unknown option", "axes")
    if pos is not None:
        assert pos.shape[0] == lay.num_tokens and torch.isfinite(pos).all()


INDEX_ARGS = ("mm_token_type_ids", "attention_mask", "image_grid_thw", "video_grid_thw", "spatial_merge_size",
              "second_per_grid_ts", "tokens_per_second", "input_ids", "per_axis_deltas")


@st.composite
def broken_batches(draw):
    """A valid batch with one to three arguments replaced by junk or by a near miss."""
    samples, pad, extra = draw(batches())
    inputs = batch_inputs(samples, pad, extra)
    inputs["input_ids"] = None
    types = inputs["mm_token_type_ids"]
    near = {
        "mm_token_type_ids": st.sampled_from([types * 3, types.float(), types[:, :-1], types.T.contiguous().T,
                                              types[:0], types.bool(), -types]),
        "attention_mask": st.sampled_from([inputs["attention_mask"] * 2, inputs["attention_mask"][:, 1:],
                                           inputs["attention_mask"].float() / 2, torch.zeros_like(types)]),
        "image_grid_thw": st.sampled_from([[[1, 2, 3]], [[0, 2, 2]], [[1, 2**62 + 2, 2]], [[1.5, 2, 2]], [1, 2]]),
        "video_grid_thw": st.sampled_from([[[1, 2, 2], [1, 2, 2]], [[float("inf"), 2, 2]], [[2**40, 2**40, 2**40]]]),
        "spatial_merge_size": st.sampled_from([0, 3, 10**20, 2.0, True]),
        "second_per_grid_ts": st.sampled_from([[1e300], [-1.0], ["a"], [float("nan")], [[1.0]]]),
        "tokens_per_second": st.sampled_from([0, -1, "2", 1e39, float("inf"), [2]]),
        "input_ids": st.sampled_from([torch.zeros(1, 1), torch.zeros(3)]),
        "per_axis_deltas": st.sampled_from(["yes", 1]),
    }
    for name in draw(st.lists(st.sampled_from(INDEX_ARGS), min_size=1, max_size=3, unique=True)):
        inputs[name] = draw(st.one_of(junk, near[name]))
    return inputs


@pytest.mark.parametrize("design", DESIGNS)
@budget(40)
@given(inputs=broken_batches())
def test_rope_index_with_broken_inputs_fails_cleanly(design, inputs):
    names = tuple(f"`{n}`" for n in INDEX_ARGS) + ("spatial_merge_size",)
    out = fails_cleanly(lambda: rope_index(**inputs, design=design), *names)
    if out is not None:
        pos, delta = out
        assert pos.dtype == torch.float32 and torch.isfinite(pos).all() and torch.isfinite(delta).all()


@budget(150)
@given(deltas=st.one_of(junk, st.builds(torch.zeros, st.integers(0, 3), st.integers(1, 3))),
       past=st.one_of(junk, st.integers(0, 10)), new=st.one_of(junk, st.integers(1, 4)),
       axes=st.one_of(junk, st.integers(1, 4)), mask=st.one_of(st.none(), junk))
def test_decode_positions_fails_cleanly(deltas, past, new, axes, mask):
    names = ("`deltas`", "`past_length`", "`num_new`", "`num_axes`", "`attention_mask`")
    out = fails_cleanly(lambda: decode_positions(deltas, past, new, axes, attention_mask=mask), *names)
    if out is not None:
        assert out.shape == (axes, deltas.shape[0], new) and torch.isfinite(out).all()


@budget(150)
@given(schedule=st.one_of(junk, st.sampled_from(["all", "lower", "strategy_2", "zigzag"]),
                          st.lists(st.one_of(st.booleans(), st.sampled_from(DESIGNS + ["nope"]), junk), max_size=4)),
       layers=st.one_of(junk, st.integers(1, 6)),
       pair=st.one_of(junk, st.tuples(st.sampled_from(DESIGNS + ["nope"]), st.one_of(st.sampled_from(DESIGNS), junk))))
def test_age_schedule_fails_cleanly(schedule, layers, pair):
    out = fails_cleanly(lambda: age_schedule(schedule, layers, designs=pair),
                        "`num_layers`", "`designs`", "`schedule`", "AGE schedule", "layers")
    if out is not None:
        assert len(out) == layers and all(get_design(d) for d in out)


@budget(150)
@given(name=st.one_of(junk, st.text(max_size=10), st.sampled_from(DESIGNS)))
def test_get_design_fails_cleanly(name):
    d = fails_cleanly(lambda: get_design(name), "`design`", "unknown design")
    if d is not None:
        assert d.name in DESIGNS and re.fullmatch(r"[a-z0-9_]+(-[a-z0-9_]+)*", d.name)
