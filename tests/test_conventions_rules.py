"""docs/conventions.md's table of position designs states what every design computes.

Each row's rule is re-implemented here in float64 from the table's words (a running index p, text on the
diagonal, a block starting at s, token (f, i, j) = frame, row, column) and compared with
``ropekit.positions`` on a layout that mixes text, images and videos. The table cell must still hold the
formula the reference implements, so editing the documented rule means re-checking it here.
"""
import math
from pathlib import Path

import pytest
import torch

import ropekit

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = "T2 I2x3 T1 V3x2x2@1.5 T2 I1x1 T1 V2x3x1 T1"


def _segments(layout: str):
    """(kind, …) per segment: ("T", n) or ("V", T, H, W, Δt); an image is one frame."""
    for seg in ropekit.Layout.parse(layout).segments:
        name = type(seg).__name__
        if name == "Text":
            yield "T", seg.n
        elif name == "Image":
            yield "V", 1, seg.h, seg.w, 1.0
        else:
            yield "V", seg.t, seg.h, seg.w, float(seg.interval)


def _walk(layout: str, block, axes: int) -> torch.Tensor:
    rows, p = [], 0.0
    for seg in _segments(layout):
        if seg[0] == "T":
            for _ in range(seg[1]):
                rows.append([p] * axes)
                p += 1
        else:
            placed, p = block(p, *seg[1:])
            rows += placed
    return torch.tensor(rows, dtype=torch.float64)


def _tokens(T, H, W):
    return [(f, i, j) for f in range(T) for i in range(H) for j in range(W)]


def _frames(rule):
    """A design that places every frame as its own block: rule(s, H, W) -> (rows, next s)."""
    def block(s, T, H, W, dt):
        rows = []
        for _ in range(T):
            placed, s = rule(s, H, W)
            rows += placed
        return rows, s
    return block


def _vanilla(s, T, H, W, dt):
    return [[s + k] for k in range(T * H * W)], s + T * H * W


def _shared(s, T, H, W, dt):
    return [[s + f] for f, _, _ in _tokens(T, H, W)], s + T


def _mrope(s, T, H, W, dt):
    f32 = lambda v: float(torch.tensor(v, dtype=torch.float32))  # noqa: E731  ⌊f·Δt⌋ in float32
    rows = [[s + math.floor(f32(f32(f) * f32(dt))), s + i, s + j] for f, i, j in _tokens(T, H, W)]
    return rows, max(max(r) for r in rows) + 1


def _rope2d(s, T, H, W, dt):
    return [[s + f * max(H, W) + i, s + f * max(H, W) + j] for f, i, j in _tokens(T, H, W)], s + T * max(H, W)


def _videorope(delta):
    def block(s, T, H, W, dt):
        rows = []
        for f, i, j in _tokens(T, H, W):
            t = s + f * delta
            rows.append([t, t + i - (H - 1) // 2, t + j - (W - 1) // 2])
        return rows, s + (T - 1) * delta + 1
    return block


def _v2pe(s, T, H, W, dt, delta=1 / 16):
    n = T * H * W
    return [[s - 1 + (k + 1) * delta] for k in range(n)], s + n * delta


def _v2pe_stride(stride):
    def block(s, T, H, W, dt):
        n, span = H * W, math.ceil(stride)
        return [[s + f * span + (k + 1) * stride / n - 1] for f in range(T) for k in range(n)], s + T * span
    return block


_local = _frames(lambda s, H, W: ([[s, i, j] for i in range(H) for j in range(W)], s + max(H, W)))
_offset = _frames(lambda s, H, W: ([[s, s + i, s + j] for i in range(H) for j in range(W)], s + max(H, W)))


def _mmrope(sigma_h, sigma_w):
    def frame(s, H, W):
        rows = [[s, s + sigma_h * i, s + sigma_w * j] for i in range(H) for j in range(W)]
        return rows, max(max(r) for r in rows) + 1  # the block's largest coordinate + 1
    return _frames(frame)


def _tmrope(rate, exact):
    f32 = lambda v: float(torch.tensor(v, dtype=torch.float32))  # noqa: E731

    def block(s, T, H, W, dt):
        sigma = f32(dt / rate)  # seconds per frame step, as the processor's float32 tensor holds it
        times = [f32(f32(f * sigma) * f32(rate)) for f in range(T)]  # (f·σ)·ρ, float32, in that order
        rows = [[s + (times[f] if exact else math.floor(times[f])), s + i, s + j] for f, i, j in _tokens(T, H, W)]
        return rows, max(max(r) for r in rows) + 1
    return block


# design (options) -> (formula the table cell states, reference, axes)
RULES = {
    ("vanilla", ()): ("`s + k`", _vanilla, 1),
    ("shared", ()): ("`s + f`", _shared, 1),
    ("mrope", ()): ("`(s + ⌊f·Δt⌋, s + i, s + j)`", _mrope, 3),
    ("rope2d", ()): ("`(s_f + i, s_f + j)`, `s_f = s + f·max(H, W)`", _rope2d, 2),
    ("mrope-i", ()): ("`(s, s + i, s + j)`", _offset, 3),
    ("mrope-i", (("spatial_reset", True),)): ("with `spatial_reset=True`: `(s, i, j)`", _local, 3),
    ("grape", ()): ("as `mrope-i`: each frame its own block, `(s, s + i, s + j)`", _offset, 3),
    ("grape", (("frequency_allocation", "interleaved"),)): ("`frequency_allocation` picks the pairs", _offset, 3),
    ("mhrope", ()): ("spatial reset on by default", _local, 3),
    ("ilrope", ()): ("`(s, i, j)`", _local, 3),
    ("omnirope", ()): ("as `ilrope`", _local, 3),
    ("videorope", ()): ("`t = s + f·δ`, `h = t + i − ⌊(H−1)/2⌋`, `w = t + j − ⌊(W−1)/2⌋`", _videorope(2.0), 3),
    ("hope", ()): ("as `videorope` with δ = γ", _videorope(1.0), 3),
    ("hope", (("temporal_scale", 0.5),)): ("as `videorope` with δ = γ", _videorope(0.5), 3),
    ("v2pe", ()): ("`s − 1 + (k + 1)·δ`", _v2pe, 1),
    ("v2pe", (("visual_stride", 2.5),)): ("`s + f·⌈S⌉ + (k + 1)·S/(H·W) − 1`", _v2pe_stride(2.5), 1),
    ("mmrope", ()): ("`(s, s + σ_h·i, s + σ_w·j)`", _mmrope(1.0, 1.0), 3),
    ("mmrope", (("position_scale", (1.0, 2.0, 0.5)),)): ("`(s, s + σ_h·i, s + σ_w·j)`", _mmrope(2.0, 0.5), 3),
    ("tmrope", ()): ("`(s + τ_f, s + i, s + j)`, `τ_f = (f·σ)·ρ` in float32", _tmrope(25, False), 3),
    ("tmrope", (("temporal_rounding", "exact"),)): ("kept fractional (`\"exact\"`", _tmrope(25, True), 3),
    ("tmrope", (("position_id_per_seconds", 2),)): ("ρ = `position_id_per_seconds`", _tmrope(2, False), 3),
}


def _row(design: str) -> str:
    text = (ROOT / "docs" / "conventions.md").read_text()
    table = text.split("## Position designs", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith(f"| `{design}`")]
    assert len(rows) == 1, f"docs/conventions.md: expected one row for {design!r}"
    return rows[0]


@pytest.mark.parametrize("key", list(RULES), ids=lambda k: k[0] + "".join(f"-{n}={v}" for n, v in k[1]))
def test_documented_rule_is_what_the_design_computes(key):
    design, options = key
    formula, block, axes = RULES[key]
    assert formula in _row(design), f"docs/conventions.md's {design!r} row no longer states {formula}"
    got = ropekit.positions(LAYOUT, design, **dict(options))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _walk(LAYOUT, block, axes), rtol=0, atol=1e-5)


def _text_only_differs(design: str, **kwargs) -> bool:
    x = torch.randn(1, 4, 9, 32, generator=torch.Generator().manual_seed(0))
    theta = torch.arange(9.0, dtype=torch.float64)[:, None] * torch.tensor(
        [10000.0 ** (-2 * j / 32) for j in range(16)], dtype=torch.float64)
    c, s = torch.cos(theta), torch.sin(theta)
    want = torch.cat((x[..., :16] * c - x[..., 16:] * s, x[..., 16:] * c + x[..., :16] * s), -1)  # 1-D RoPE
    got = ropekit.RoPE(design, head_dim=32, **kwargs).rotate(x, x, "T9")[0]
    return not torch.allclose(got.double(), want, atol=1e-5)


def test_docs_name_every_design_whose_text_only_input_is_not_1d_rope():
    # the docs said "exactly 1-D RoPE whatever the design", but HoPE never rotates its temporal pairs
    differs = {d for d in ropekit.designs() if _text_only_differs(d, sections=[1, 1, 2] if d == "mhrope" else None)}
    assert differs == {"hope"}
    assert _text_only_differs("mhrope", sections=[1, 1, 1, 1])  # a fourth, unrotated group of heads
    claims = [
        (ROOT / "README.md").read_text().split("lists the designs.", 1)[1].split("\n\n", 1)[0],
        (ROOT / "docs" / "conventions.md").read_text().split("Text-only input is therefore", 1)[1].split(" Let s", 1)[0],
        (ROOT / "docs" / "designs.md").read_text().split("Text is always on the diagonal", 1)[1].split("\n\n", 1)[0],
    ]
    for claim in claims:
        for name in ("`hope`", "`mhrope`"):
            assert name in claim, f"the text-only claim does not name the exception {name}: {claim!r}"


def test_scaling_doc_points_long_video_papers_at_what_ropekit_has():
    # docs/scaling.md said ropekit had no VideoRoPE or V2PE design (both are registered) and gave HoPE's
    # temporal scaling as a per-axis linear frequency factor, which HoPE's zero temporal frequencies ignore
    text = (ROOT / "docs" / "scaling.md").read_text().split("## What the multimodal papers recommend", 1)[1]
    bullets = {b.split("**", 2)[1]: b for b in text.split("\n- ")[1:]}
    registered = set(ropekit.designs())
    assert "`videorope`" in bullets["VideoRoPE"] and "`v2pe`" in bullets["V2PE"]
    assert {"videorope", "v2pe", "hope"} <= registered
    assert "design yet" not in text
    q = torch.randn(1, 2, 21, 64, generator=torch.Generator().manual_seed(0))
    video = "T2 V3x2x2 T7"
    plain = ropekit.RoPE("hope", head_dim=64).rotate(q, q, video)[0]
    linear_t = ropekit.RoPE("hope", head_dim=64, scaling={"rope_type": "linear", "factor": [2.0, 1.0, 1.0]})
    assert torch.equal(linear_t.rotate(q, q, video)[0], plain)  # a temporal frequency factor is a no-op
    assert '"linear"' not in bullets["HoPE"] and "`temporal_scale=γ`" in bullets["HoPE"]
    stretched = ropekit.RoPE("hope", head_dim=64, design_options={"temporal_scale": 2.0}).rotate(q, q, video)[0]
    assert not torch.allclose(stretched, plain)


def test_circle_text_vector_tilts_the_ring_but_text_stays_on_the_diagonal():
    # conventions.md called V "the text direction"; text never follows it, so PTD = 0 needs V ∥ (1, 1, 1)
    tilted = ropekit.positions("T4 I3x3 T5", "circle", text_vector=(1, 2, 3))
    text = ropekit.Layout.parse("T4 I3x3 T5").token_types() == 0
    assert torch.equal(tilted[text][:, 0], tilted[text][:, 1]) and torch.equal(tilted[text][:, 1], tilted[text][:, 2])
    assert ropekit.layout_ptd("T4 I3x3 T5", "circle", text_vector=(2, 2, 2)) < 1e-6
    measured = ropekit.layout_ptd("T4 I3x3 T5", "circle", text_vector=(1, 2, 3))
    step = (ROOT / "docs" / "conventions.md").read_text().split("4. **Plane.**", 1)[1].split("5. **Placement.**")[0]
    assert "stays on the diagonal" in step and f"PTD ≈ {measured:.2f}" in step


def test_grids_are_read_as_images_and_videos_except_by_vrope():
    for design in ropekit.designs():
        if design == "vrope":
            assert ropekit.positions("G2x3x4", design).shape[1] == 8
            assert ropekit.positions("V2x3x4", design).shape[1] == 4
        else:
            assert torch.equal(ropekit.positions("T1 G2x3x4 T1 G3x2", design),
                               ropekit.positions("T1 V2x3x4 T1 I3x2", design)), design
    text = (ROOT / "docs" / "conventions.md").read_text().split("## Tensor layouts")[0]
    assert "except `vrope`" in text
