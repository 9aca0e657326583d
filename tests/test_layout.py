"""Layouts: the compact string form round-trips and bad strings fail with guidance."""
import pytest

from ropekit import Grid, Image, Layout, Text, Video


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
