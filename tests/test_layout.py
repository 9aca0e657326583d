"""Layouts: the compact string form round-trips and bad strings fail with guidance."""
import pytest

from ropekit import Grid, Image, Layout, Text, Video, positions


def test_parse_and_roundtrip():
    lay = Layout.parse("T3 I4x4 T2 V8x3x3 G2x3x4 V2x2x2@2.5")
    assert lay.segments == (Text(3), Image(4, 4), Text(2), Video(8, 3, 3), Grid(2, 3, 4), Video(2, 2, 2, 2.5))
    assert Layout.parse(str(lay)) == lay
    assert len(lay) == 3 + 16 + 2 + 72 + 24 + 8


def test_object_form_equals_string_form():
    assert Layout([Text(5), Video(8, 3, 3), Text(1)]) == Layout.parse("T5 V8x3x3 T1")
    assert Layout.coerce("I14x14") == Layout([Image(14, 14)])


def test_token_types_follow_hf_codes():
    tt = Layout.parse("T1 I1x2 V1x1x1").token_types().tolist()
    assert tt == [0, 1, 1, 2]


@pytest.mark.parametrize("bad", ["", "X3", "I4", "I4x", "T-1", "V2x2", "T3 I4x4 Q"])
def test_bad_strings(bad):
    with pytest.raises(ValueError, match="Layout"):
        Layout.parse(bad)


@pytest.mark.parametrize("make", [lambda: Image(0, 3), lambda: Text(-2), lambda: Video(1, 2, 0), lambda: Grid(3, 0)])
def test_empty_or_negative_grids(make):
    with pytest.raises(ValueError, match=">= 1"):
        make()


def test_type_errors():
    with pytest.raises(TypeError, match="`h` must be an int"):
        Image(2.5, 3)
    with pytest.raises(TypeError, match="segments\\[1\\]"):
        Layout([Text(1), "I2x2"])
    with pytest.raises(TypeError, match="layout"):
        Layout.coerce(42)


@pytest.mark.parametrize("interval", [1 / 3, 0.1, 2 / 7, 1e-5, 123456.789, 1e20, 3.4e38, 0.0, 2.5, 5e-324])
def test_intervals_round_trip_exactly(interval):
    lay = Layout([Text(1), Video(4, 1, 1, interval), Text(2)])
    back = Layout.parse(str(lay))
    assert back == lay and back.segments[1].interval == interval
    assert str(Video(2, 2, 2, 2.5)) == "V2x2x2@2.5"  # short where short is exact


def test_a_rounded_interval_would_have_placed_frames_elsewhere():
    # the old 6-digit form 'V4x1x1@0.333333' puts frame 3 at floor(3 * 0.333333) = 0, the layout at 1
    lay = Layout([Video(4, 1, 1, 1 / 3)])
    assert positions(Layout.parse(str(lay)), "mrope")[3, 0] == positions(lay, "mrope")[3, 0] == 1.0


@pytest.mark.parametrize("bad", ["V2x2x2@1e", "V2x2x2@.", "V2x2x2@1e+", "V2x2x2@--1", "V2x2x2@1.2.3"])
def test_unreadable_interval_names_the_segment(bad):
    with pytest.raises(ValueError, match=r"Layout.parse: segment '.*' has interval .* not a number"):
        Layout.parse(bad)


@pytest.mark.parametrize("make,exc,match", [
    (lambda: Video(2, 2, 2, 10**400), ValueError, "`interval`.*too large"),
    (lambda: Video(2, 2, 2, 1e39), ValueError, "`interval`.*not finite float32"),
    (lambda: Video(2, 2, 2, "1"), TypeError, "`interval` must be a number"),
    (lambda: Video(2, 2, 2, True), TypeError, "`interval` must be a number"),
    (lambda: Video(10**400, 2, 2), ValueError, "`t`.*too large"),
    (lambda: Text(2**63), ValueError, "`n`.*too large"),
    (lambda: Grid(2**40, 2**40), ValueError, "Grid.*2\\*\\*63"),
    (lambda: Video(2**21, 2**21, 2**21), ValueError, "`t` × `h` × `w`.*2\\*\\*63"),  # each size fine, the product not
    (lambda: Image(2**32, 2**32), ValueError, "`h` × `w`.*2\\*\\*63"),
    (lambda: Grid(2**40, 2**40), ValueError, "Grid: .*`sizes`"),
    (lambda: Layout([Text(2**62), Text(2**62)]), ValueError, "Layout holds .* tokens"),
    (lambda: Layout.parse("T99999999999999999999"), ValueError, "`n`.*too large"),
    (lambda: Layout.parse("V2x2x2@1e39"), ValueError, "`interval`.*not finite float32"),
])
def test_absurd_numbers_fail_with_the_argument_named(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_token_types_refuse_a_huge_layout_before_allocating():
    lay = Layout.parse("I100000x100000")  # a description is fine ...
    assert len(lay) == 10**10
    with pytest.raises(ValueError, match="10000000000 tokens exceed the limit of 16777216.*MAX_TOKENS"):
        lay.token_types()  # ... building 10^10 entries is not


# ---------------------------------------------------------------------------------------------------
# positions(): sizes and float32 range are checked for every design

from ropekit.designs import registry  # noqa: E402


@pytest.mark.parametrize("design", ["vanilla", "mrope", "circle", "vrope", "rope2d", "shared", "compact"])
def test_positions_refuse_too_many_tokens_before_allocating(design):
    with pytest.raises(ValueError, match="10000000001 tokens exceed the limit of 16777216"):
        positions("T1 I100000x100000", design)


def test_positions_refuse_too_much_work_with_the_numbers(monkeypatch):
    # 3 tokens, but 2**10 coordinates each: allowed up to MAX_WORK, refused (with the numbers) beyond it
    assert positions("T3", "vrope", spatial_dims=10).shape == (3, 1024)
    monkeypatch.setattr(registry, "MAX_WORK", 3 * 1024 - 1)
    with pytest.raises(ValueError, match="3 tokens × 1024 axes = 3072 coordinates, more than the limit of 3071"):
        positions("T3", "vrope", spatial_dims=10)
    assert positions("T3", "mrope").shape == (3, 3)


def test_vrope_refuses_absurd_spatial_dims_before_allocating():
    with pytest.raises(ValueError, match="`spatial_dims` is 24, which gives 2\\*\\*24 coordinates"):
        positions("T3", "vrope", spatial_dims=24)
    with pytest.raises(ValueError, match="rank of segment G1x1x1x1x1x1x1x1x1x1x1"):
        positions("G" + "x".join(["1"] * 11), "vrope")


@pytest.mark.parametrize("layout,design", [("T1 V3x1x1@3e38", "mrope"), ("T1 V3x1x1@3e38 T1", "compact"),
                                           ("T1 V3x1x1@3e38", "circle")])
def test_positions_that_overflow_float32_are_refused(layout, design):
    with pytest.raises(ValueError, match=f"design '{design}' on layout .* not finite float32"):
        positions(layout, design)


def test_block_helpers_check_their_sizes():
    import numpy as np
    from ropekit.designs.circle import ring_offsets
    from ropekit.designs.mrope import vision_block
    from ropekit.designs.vrope import frame_coordinates

    with pytest.raises(ValueError, match="Image: `h` must be >= 1"):
        ring_offsets(0, 3)
    with pytest.raises(ValueError, match="ring_offsets: 10000000000 tokens exceed"):
        ring_offsets(100000, 100000)
    with pytest.raises(ValueError, match="frame_coordinates: 10000000000 tokens exceed"):
        frame_coordinates((100000, 100000))
    with pytest.raises(ValueError, match="vision_block: 10000000000 tokens exceed"):
        vision_block(Video(1, 100000, 100000), 0.0)
    with pytest.raises(TypeError, match="`video` must be a ropekit.Video"):
        vision_block("V1x2x2", 0.0)
    assert Image(np.int64(2), np.int32(3)) == Image(2, 3)  # numpy integers are integers
