"""Position designs published 2025-26: ID-Align (`id-align`), PyPE (`pype`) and C²RoPE (`c2rope`).

Every expected position here is recomputed from the paper's rule in float64 (Python integers and
fractions, no ropekit placement code), on hand-built layouts: text, images of several sizes, several
images, videos. C²RoPE's rules are the paper's as its authors' released rotary and mask code realise them
(docs/designs.md, "Published 2025–26 position designs").
"""
import json
from fractions import Fraction

import numpy as np
import pytest
import torch

import ropekit
from ropekit import Grid, Image, Layout, Text, Video, positions
from ropekit.cli import main
from ropekit.designs import get_design
from ropekit.designs.pype import MAX_MASK_TOKENS, pype_attention_mask
from ropekit.index import rope_index


def as_column(values):
    return torch.tensor(values, dtype=torch.float64)[:, None]


def check_batch(layouts, design, **options):
    """rope_index on a right-padded batch of these layouts (grids in patches, merge 2) equals positions per row."""
    rows, images, videos = [], [], []
    for lay in layouts:
        row = []
        for seg in Layout.parse(lay):
            row += [{Text: 0, Image: 1, Video: 2}[type(seg)]] * seg.num_tokens
            if isinstance(seg, Image):
                images.append([1, 2 * seg.h, 2 * seg.w])
            elif isinstance(seg, Video):
                videos.append([seg.t, 2 * seg.h, 2 * seg.w])
        rows.append(row)
    length = max(map(len, rows)) + 1
    types = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(types)
    for b, row in enumerate(rows):
        types[b, :len(row)] = torch.tensor(row)
        mask[b, :len(row)] = 1
    pos, delta = rope_index(None, types, torch.tensor(images) if images else None,
                            torch.tensor(videos) if videos else None, attention_mask=mask, design=design, **options)
    for b, lay in enumerate(layouts):
        want = positions(lay, design, **options)
        assert torch.equal(pos[:, b, mask[b].bool()], want.T), (lay, options)
        assert delta[b, 0] == want.max() + 1 - want.shape[0]


def check(layout, design, want, **options):
    got = positions(layout, design, **options)
    assert got.dtype == torch.float32 and got.shape == (Layout.coerce(layout).num_tokens, 1)
    assert torch.equal(got.double(), as_column(want)), (str(layout), design, options, got.flatten().tolist(), want)


# ------------------------------------------------------------------------------------------------ ID-Align

def id_align_reference(layout, thumbnail=None):
    """The paper's rule, written out token by token: 1-D RoPE indices, except that a high-resolution grid
    (an image whose grid is not the thumbnail's) directly after a thumbnail takes, for token (r, c), the
    index of thumbnail token (floor(r·h/H), floor(c·w/W)); the thumbnail's range is all the pair spans."""
    out, p, thumb_start = [], 0, None
    for seg in Layout.coerce(layout):
        if isinstance(seg, Image) and thumbnail is not None and (seg.h, seg.w) != tuple(thumbnail):
            h, w = thumbnail
            for r in range(seg.h):
                for c in range(seg.w):
                    i = int(Fraction(r * h, seg.h))  # floor of a non-negative fraction
                    j = int(Fraction(c * w, seg.w))
                    out.append(thumb_start + i * w + j)
            continue  # the running index stays after the thumbnail
        thumb_start = p
        out.extend(range(p, p + seg.num_tokens))
        p += seg.num_tokens
    return out


ID_ALIGN_CASES = [
    ("T5", None),
    ("T3 I2x3 T2", None),                       # no thumbnail given: 1-D RoPE
    ("T3 I2x3 I4x6 T2", (2, 3)),                # a 2× high-resolution grid
    ("T1 I3x3 I5x7 T4", (3, 3)),                # ratios 5/3 and 7/3: nearest neighbour is not a plain division
    ("T2 I3x3 I2x2 T1", (3, 3)),                # a "high-resolution" grid smaller than the thumbnail
    ("T2 I2x2 I4x4 T1 I2x2 I6x2 T3", (2, 2)),   # two images, each with its high-resolution grid
    ("I2x2 I4x4 I2x2 I6x6", (2, 2)),            # pairs back to back, no text anywhere
    ("T2 I2x2 T1 I2x2 I3x5 T1", (2, 2)),        # a thumbnail without a high-resolution grid (LLaVA-NeXT's multi-image)
    ("T2 V3x2x2 T1 I2x2 I4x4 T2", (2, 2)),      # a video: its tokens take the next indices
    ("T1 I24x24 I48x49 T2", (24, 24)),          # LLaVA-NeXT: 336-px base, 2×2 tiles with a newline column
]


@pytest.mark.parametrize("layout,thumbnail", ID_ALIGN_CASES)
def test_id_align_places_tokens_by_the_papers_rule(layout, thumbnail):
    check(layout, "id-align", id_align_reference(layout, thumbnail), thumbnail=thumbnail)


def test_id_align_high_resolution_tokens_reuse_exactly_their_thumbnail_positions():
    got = positions("T2 I2x2 I4x4 T1", "id-align", thumbnail=(2, 2)).flatten().tolist()
    assert got[2:6] == [2, 3, 4, 5]                                                 # thumbnail
    assert got[6:22] == [2, 2, 3, 3, 2, 2, 3, 3, 4, 4, 5, 5, 4, 4, 5, 5]           # each 2×2 quarter, one token's
    assert got[22] == 6                                                              # text after the thumbnail's range


def test_id_align_range_does_not_grow_with_resolution():
    base = positions("T3 I24x24 T2", "id-align", thumbnail=(24, 24))
    for high in ("I48x48", "I48x72", "I72x49", "I96x96"):
        pair = positions(f"T3 I24x24 {high} T2", "id-align", thumbnail=(24, 24))
        assert pair.max() == base.max() and pair[-2:].tolist() == base[-2:].tolist(), high
        assert set(pair.flatten().tolist()) == set(base.flatten().tolist())
    # plain 1-D RoPE moves the text after the image by the high-resolution token count
    assert positions("T3 I24x24 I48x48 T2", "vanilla").max() - base.max() == 48 * 48


def test_id_align_options_and_layout_forms_agree():
    want = positions("T2 I2x2 I4x4 T1", "id-align", thumbnail=(2, 2))
    for thumbnail in ([2, 2], "2x2", "I2x2", " 2 X 2 ", (np.int64(2), 2)):
        assert torch.equal(positions("T2 I2x2 I4x4 T1", "id-align", thumbnail=thumbnail), want), thumbnail
    assert torch.equal(positions([Text(2), Grid(2, 2), Grid(4, 4), Text(1)], "id-align", thumbnail=(2, 2)), want)
    assert torch.equal(positions("T2 I2x2 I4x4 T1", "idalign", thumbnail=(2, 2)), want)  # alias
    for lay in ("T3 I2x3 V2x2x2 T1 I4x4", "T1 G2x3x4 T1 G3x2"):  # unset: exactly 1-D RoPE
        assert torch.equal(positions(lay, "id-align"), positions(lay, "vanilla"))


@pytest.mark.parametrize("layout,where", [
    ("T2 I4x4 T1", "follows segment T2"),                      # no thumbnail before it
    ("I4x4 I2x2", "follows the start of the layout"),
    ("T2 I2x2 T1 I4x4", "follows segment T1"),                 # text between the thumbnail and the grid
    ("T2 I2x2 I4x4 I6x6 T1", "another high-resolution view"),  # one view per thumbnail
])
def test_id_align_refuses_a_high_resolution_grid_without_its_thumbnail(layout, where):
    with pytest.raises(ValueError) as err:
        positions(layout, "id-align", thumbnail=(2, 2))
    msg = str(err.value)
    assert "id-align" in msg and where in msg and "right after its thumbnail" in msg and "`thumbnail`" in msg


@pytest.mark.parametrize("thumbnail", [(0, 2), (2,), (2, 2, 2), "abc", "2x", True, 2.5, (2.0, 2), (True, 2),
                                       (2, 2**40), torch.tensor([2, 2])])
def test_id_align_refuses_a_thumbnail_that_is_not_a_grid(thumbnail):
    with pytest.raises(ValueError, match=r"id-align: `thumbnail` must be the thumbnail grid \(h, w\).*e\.g\."):
        positions("T2 I2x2 T1", "id-align", thumbnail=thumbnail)


def test_id_align_batched_index_equals_its_positions():
    """rope_index places each image shape once through the block rule; adjacent images are split by their grids."""
    check_batch(["T2 I2x2 I4x4 T1 I2x2 T2", "T1 I2x2 T3 I2x2 I4x6 T2", "T4"], "id-align", thumbnail=(2, 2))
    check_batch(["T2 I2x2 I4x4 T1 V2x2x3 T2"], "id-align")


# ------------------------------------------------------------------------------------------------ PyPE

def pype_levels_reference(h, w, layer, interval):
    """The released code's layer loop: every `interval` layers one more level joins the top, until
    floor(min(h, w)/2) have; the image then has floor(min/2) + 1 − top distinct positions."""
    k, top = min(h, w) // 2, 0
    for index in range(layer + 1):
        if index % interval == 0 and top < k:
            top += 1
    return k + 1 - top


def pype_frame_reference(h, w, levels):
    """Rings painted from the border inwards: level q covers rows and columns q … size−1−q, q < levels."""
    grid = [[0] * w for _ in range(h)]
    for q in range(1, levels):
        for i in range(q, h - q):
            for j in range(q, w - q):
                grid[i][j] = q
    return [v for row in grid for v in row]


def pype_reference(layout, layer=0, interval=1):
    out, p = [], 0
    for seg in Layout.coerce(layout):
        if isinstance(seg, Text):
            out.extend(range(p, p + seg.n))
            p += seg.n
            continue
        frames, h, w = (1, seg.h, seg.w) if isinstance(seg, Image) else (seg.t, seg.h, seg.w)
        levels = pype_levels_reference(h, w, layer, interval)
        for _ in range(frames):  # each frame an image
            out.extend(p + v for v in pype_frame_reference(h, w, levels))
            p += levels
    return out


PYPE_LAYOUTS = ["T6", "T2 I4x4 T3", "T1 I6x6 T2", "T3 I5x5 T1", "T2 I3x7 T1", "T2 I8x5 T2", "I1x6 T2",
                "T1 I2x2 T1 I6x4 I3x3 T2", "T2 V3x4x4@2.5 T1 I4x6 T1", "V2x1x1 I1x1"]


@pytest.mark.parametrize("layout", PYPE_LAYOUTS)
@pytest.mark.parametrize("layer,interval", [(0, 1), (1, 1), (2, 1), (5, 1), (3, 2), (4, 2), (7, 3), (40, 1)])
def test_pype_places_tokens_by_the_papers_rule(layout, layer, interval):
    check(layout, "pype", pype_reference(layout, layer, interval), layer=layer, interval=interval)


def test_pype_llava_image_at_the_first_layer():
    """LLaVA-1.5's 24×24 image: twelve rings 0 … 11 from the border in, the four centre tokens next to the text."""
    got = positions("T5 I24x24 T2", "pype").flatten()
    image = got[5:-2].reshape(24, 24) - 5
    assert image[0].tolist() == [0.0] * 24 and image[:, 0].tolist() == [0.0] * 24 and image[-1, -1] == 0
    assert image[11:13, 11:13].tolist() == [[11.0, 11.0], [11.0, 11.0]] and image.max() == 11
    assert torch.bincount(image.flatten().long()).tolist() == [4 * (24 - 2 * q) - 4 for q in range(12)]
    assert got[-2:].tolist() == [17.0, 18.0]  # text continues after the innermost ring
    assert image[11, 11] > image[0, 0]  # so the centre is nearer the text after the image than the border


def test_pype_descends_one_level_per_interval_until_one_position():
    for layer in range(30):
        for interval in (1, 2, 4):
            got = positions("T1 I24x24 T1", "pype", layer=layer, interval=interval).flatten()
            levels = max(12 - layer // interval, 1)
            assert len(set(got[1:-1].tolist())) == levels and got[-1] == 1 + levels, (layer, interval)
    whole = positions("T1 I24x24 T1", "pype", layer=11).flatten()
    assert set(whole[1:-1].tolist()) == {1.0} and whole[-1] == 2.0  # the whole image at one position


def test_pype_grids_and_alias_agree_with_images_and_videos():
    assert torch.equal(positions("T1 G2x3x4 T1 G3x2", "pype", layer=1),
                       positions("T1 V2x3x4 T1 I3x2", "pype", layer=1))
    assert torch.equal(positions("T1 I6x6 T1", "pyramid-descent"), positions("T1 I6x6 T1", "pype"))
    assert positions("T7", "pype").flatten().tolist() == list(range(7))


@pytest.mark.parametrize("options,error,match", [
    ({"layer": -1}, ValueError, r"pype: `layer` \(the 0-based decoder layer\) must be an int >= 0, got -1"),
    ({"interval": 0}, ValueError, r"pype: `interval` \(layers per descent step.*\) must be an int >= 1, got 0"),
    ({"layer": 1.5}, TypeError, r"pype: `layer` must be an int, got float"),
    ({"interval": True}, TypeError, r"pype: `interval` must be an int, got bool"),
])
def test_pype_refuses_bad_options(options, error, match):
    with pytest.raises(error, match=match):
        positions("T1 I4x4 T1", "pype", **options)


def test_pype_refuses_grids_without_rings():
    for lay in ("T1 G4 T1", "T1 G2x2x2x2"):
        with pytest.raises(ValueError, match=r"design 'pype' places images and videos; segment G"):
            positions(lay, "pype")


def test_pype_batched_index_equals_its_positions():
    for layer, interval in ((0, 1), (1, 1), (3, 2)):
        check_batch(["T2 I4x4 T1 V2x2x2 T1", "T1 I3x4 I6x6 T2", "T3"], "pype", layer=layer, interval=interval)


def pype_mask_reference(layout, layer=0, interval=1):
    """Causal, except inside one image (or frame): query q sees key k when k's level <= q's (the released
    code opens, level by level, the keys at or below the query's level)."""
    pos = pype_reference(layout, layer, interval)
    owner = []
    k = 0
    for seg in Layout.coerce(layout):
        if isinstance(seg, Text):
            owner += [None] * seg.n
            continue
        frames = seg.t if isinstance(seg, Video) else 1
        for _ in range(frames):
            owner += [k] * (seg.num_tokens // frames)
            k += 1
    n = len(pos)
    return [[(owner[q] is not None and owner[q] == owner[j] and pos[j] <= pos[q])
             or ((owner[q] is None or owner[q] != owner[j]) and j <= q) for j in range(n)] for q in range(n)]


@pytest.mark.parametrize("layout,layer", [("T2 I4x4 T2", 0), ("T1 I5x6 T1 I3x3", 0), ("T1 I6x6 T2", 1),
                                          ("T1 V2x4x4 T1", 0), ("I4x4 I4x4", 5)])
def test_pype_attention_mask_is_concentric_inside_images_and_causal_elsewhere(layout, layer):
    got = pype_attention_mask(layout, layer=layer)
    want = torch.tensor(pype_mask_reference(layout, layer))
    assert got.dtype == torch.bool and torch.equal(got, want)


def test_pype_attention_mask_examples_and_limits():
    m = pype_attention_mask("T1 I4x4 T1")
    border, centre = 1 + 0, 1 + 5  # image tokens (0, 0) and (1, 1)
    assert m[border, 1 + 15] and not m[border, centre]  # a later border token yes, an inner one no
    assert m[centre, :17].all() and not m[centre, 17]  # the innermost level sees the whole image
    assert m[17].all() and m[0, 0] and not m[0, 1:].any()
    with pytest.raises(ValueError, match=r"pype_attention_mask: .* tokens; an \(L, L\) mask is built only up to"):
        pype_attention_mask(f"T{MAX_MASK_TOKENS + 1}")
    with pytest.raises(ValueError, match="`layer`"):
        pype_attention_mask("T1 I4x4", layer=-2)


# ------------------------------------------------------------------------------------------------ C²RoPE

def c2rope_reference(layout):
    """(m, x, y) per token from the rule: m the 1-D index; x, y the Cartesian offsets about the image centre
    (x right, y up, trunc toward 0 so both middles of an even side are 0), shifted to start at the image's
    start; text (p, p, p); a video frame by frame."""
    out, p = [], 0
    for seg in Layout.parse(layout):
        if isinstance(seg, Text):
            out += [(p + i,) * 3 for i in range(seg.num_tokens)]
            p += seg.num_tokens
            continue
        t = seg.t if isinstance(seg, Video) else 1
        for _ in range(t):
            h, w = seg.h, seg.w
            for r in range(h):
                for c in range(w):
                    x = (w - 1) // 2 + int(Fraction(2 * c - (w - 1), 2))  # int() truncates toward 0
                    y = (h - 1) // 2 - int(Fraction(2 * r - (h - 1), 2))
                    out.append((p + r * w + c, p + x, p + y))
            p += h * w
    return out


def chebyshev_reference(h, w):
    return [max(abs(int(Fraction(2 * r - (h - 1), 2))), abs(int(Fraction(2 * c - (w - 1), 2))))
            for r in range(h) for c in range(w)]


C2ROPE_LAYOUTS = ["T6", "T2 I4x4 T3", "T1 I3x5 T2", "T2 I5x4 I2x2 T1", "T1 V2x3x4 T1", "I1x6 T2"]


@pytest.mark.parametrize("layout", C2ROPE_LAYOUTS)
def test_c2rope_places_tokens_by_the_papers_rule(layout):
    got = positions(layout, "c2rope")
    assert got.dtype == torch.float32 and got.shape == (Layout.coerce(layout).num_tokens, 3)
    assert torch.equal(got.double(), torch.tensor(c2rope_reference(layout), dtype=torch.float64)), layout


def test_c2rope_llava_image_matches_the_authors_coordinates():
    """A 24 x 24 LLaVA image: the authors' released rotary gives column i the offset x_i + 11 with x_i = i − 11
    left of the middle, 0 on columns 11 and 12, i − 12 right of it, and row j the offset y_j + 11 with y_j
    = 11 − j above, 0 on rows 11 and 12, −(j − 12) below; m is the raster index after the text."""
    def authors(i):
        return 0 if i in (11, 12) else (i - 11 if i < 11 else i - 12)

    got = positions("T5 I24x24 T2", "c2rope")
    img = got[5:5 + 576].view(24, 24, 3)
    cols, rows = torch.arange(24)[None, :].expand(24, 24), torch.arange(24)[:, None].expand(24, 24)
    assert torch.equal(img[..., 0], (5 + rows * 24 + cols).float())
    assert torch.equal(img[..., 1], (5 + 11 + cols.clone().apply_(authors)).float())
    assert torch.equal(img[..., 2], (5 + 11 - rows.clone().apply_(authors)).float())
    assert got[-2:].tolist() == [[581.0] * 3, [582.0] * 3]  # the text after continues as 1-D RoPE


def test_c2rope_allocation_and_rotation_recomputed_in_float64():
    """Pair j (of 64) turns at base^(−2j/128): with m for j < 58, x for 58-60, y for 61-63 (the authors' split);
    the angles of placed tokens are m·f_j, x·f_j or y·f_j, recomputed in float64; text rotates as 1-D RoPE."""
    W = ropekit.frequency_matrix("c2rope", 128, 3).double()
    for j in range(64):
        axis = 0 if j < 58 else (1 if j < 61 else 2)
        f = 10000.0 ** (-2 * j / 128)
        assert abs(W[axis, j].item() - f) <= 1e-7 * f and W[:, j].count_nonzero() == 1, j
    layout = "T3 I4x6 T2"
    coords = positions(layout, "c2rope").double()
    angles64 = [[t[0 if j < 58 else (1 if j < 61 else 2)] * 10000.0 ** (-2 * j / 128) for j in range(64)]
                for t in c2rope_reference(layout)]
    torch.testing.assert_close(coords @ W, torch.tensor(angles64, dtype=torch.float64), rtol=1e-7, atol=0)
    text = positions("T9", "c2rope")
    assert torch.equal(text @ ropekit.frequency_matrix("c2rope", 128, 3),
                       positions("T9", "vanilla") @ ropekit.frequency_matrix("1d", 128, 1))
    small = ropekit.frequency_matrix("c2rope", 16, 3)  # 8 pairs: one each for x and y
    assert small[1].nonzero().flatten().tolist() == [6] and small[2].nonzero().flatten().tolist() == [7]
    assert ropekit.frequency_matrix("c2rope", 16, 3, sections=[4, 2, 2])[2].count_nonzero() == 2
    with pytest.raises(ValueError, match="sections"):
        ropekit.frequency_matrix("c2rope", 16, 3, sections=[8, 0, 0])


def test_c2rope_batched_index_equals_positions():
    layouts = ["T2 I2x3 T1", "T1 I3x3 T3", "T4"]
    rows, images = [], []
    for lay in layouts:
        row = []
        for seg in Layout.parse(lay):
            row += [int(isinstance(seg, Image))] * seg.num_tokens
            if isinstance(seg, Image):
                images.append([1, 2 * seg.h, 2 * seg.w])
        rows.append(row)
    length = max(map(len, rows))
    types = torch.tensor([r + [0] * (length - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (length - len(r)) for r in rows])
    pos, delta = rope_index(None, types, torch.tensor(images), None, attention_mask=mask, design="c2rope")
    for b, lay in enumerate(layouts):
        want = torch.tensor(c2rope_reference(lay), dtype=torch.float32)
        assert torch.equal(pos[:, b, mask[b].bool()], want.T), lay
        assert delta[b, 0] == want[:, 0].max() + 1 - want.shape[0]


@pytest.mark.parametrize("layout", ["T1 I4x4 T1", "T2 I3x5 I2x2 T1", "T1 V2x3x3", "T3"])
def test_c2rope_chebyshev_mask_by_the_rule(layout):
    """Causal, except inside one image (or frame): a token sees every token at least as far from the centre
    (Chebyshev distance) as itself, later ones included."""
    from ropekit.designs.c2rope import c2rope_attention_mask
    group, ring = [], []
    k = 0
    for seg in Layout.parse(layout):
        if isinstance(seg, Text):
            group += [None] * seg.num_tokens
            ring += [0] * seg.num_tokens
            continue
        for _ in range(seg.t if isinstance(seg, Video) else 1):
            group += [k] * (seg.h * seg.w)
            ring += chebyshev_reference(seg.h, seg.w)
            k += 1
    n = len(group)
    want = torch.tensor([[ring[j] >= ring[i] if group[i] is not None and group[i] == group[j] else j <= i
                          for j in range(n)] for i in range(n)])
    got = c2rope_attention_mask(layout)
    assert got.dtype == torch.bool and torch.equal(got, want)
    additive = c2rope_attention_mask(layout, additive=True, dtype=torch.bfloat16)
    assert additive.dtype == torch.bfloat16 and torch.equal(additive == 0, want)
    assert (additive[~want] == torch.finfo(torch.bfloat16).min).all()


def test_c2rope_mask_refusals():
    from ropekit.designs.c2rope import MAX_MASK_TOKENS as LIMIT, c2rope_attention_mask
    with pytest.raises(ValueError, match=r"c2rope_attention_mask: .* tokens; an \(L, L\) mask"):
        c2rope_attention_mask(f"T{LIMIT + 1}")
    with pytest.raises(TypeError, match="additive"):
        c2rope_attention_mask("T1 I2x2", additive="yes")
    with pytest.raises(TypeError, match="dtype"):
        c2rope_attention_mask("T1 I2x2", additive=True, dtype=torch.int64)


# ------------------------------------------------------------------------------------------------ registry, CLI

def test_designs_are_registered_with_their_allocation():
    for name, options in (("id-align", ("thumbnail",)), ("pype", ("layer", "interval"))):
        d = get_design(name)
        assert d.allocation == "1d" and d.block_rule is not None and d.axes == 1 and d.options == options
        assert name in ropekit.designs()
    d = get_design("c2rope")
    assert d.allocation == "c2rope" and d.block_rule is not None and d.axes == 3 and d.options == ()


def test_cli_places_the_new_designs(capsys):
    assert main(["positions", "T1 I2x2 I4x4 T1", "--design", "id-align", "-o", "thumbnail=2x2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["positions"] == [[float(v)] for v in id_align_reference("T1 I2x2 I4x4 T1", (2, 2))]
    assert main(["positions", "T1 I2x2 I4x4 T1", "--design", "id-align", "-o", "thumbnail=[2, 2]", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["positions"] == got["positions"]
    assert main(["positions", "T1 I6x6 T1", "--design", "pype", "-o", "layer=1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["positions"] == [[float(v)] for v in pype_reference("T1 I6x6 T1", 1)]
    assert main(["positions", "T1 I4x4 T1", "--design", "id-align", "-o", "thumbnail=2x2"]) == 2
    assert "right after its thumbnail" in capsys.readouterr().err
    assert main(["designs"]) == 0
    listed = capsys.readouterr().out
    assert "id-align" in listed and "pype" in listed
