"""Audio segments: ``A{n}[@seconds]`` round-trips, is checked like the other segments, and every design places it."""
import math

import pytest
import torch

from ropekit import Audio, Layout, Text, designs, positions
from ropekit.designs.registry import _REGISTRY, get_design, register
from ropekit.layout import AUDIO, AUDIO_SECONDS


def test_audio_parses_and_round_trips():
    lay = Layout.parse("T3 A50 I2x2 A7@0.02 T1")
    assert lay.segments[1] == Audio(50) and lay.segments[1].seconds == AUDIO_SECONDS == 0.04
    assert lay.segments[3] == Audio(7, 0.02)
    assert str(lay) == "T3 A50 I2x2 A7@0.02 T1"  # the default 40 ms is not written
    assert Layout.parse(str(lay)) == lay
    assert len(lay) == 3 + 50 + 4 + 7 + 1


@pytest.mark.parametrize("seconds", [1 / 3, 0.1, 1e-5, 123456.789, 2.5, 5e-324, 0.04, 1 / 25])
def test_audio_seconds_round_trip_exactly(seconds):
    lay = Layout([Text(1), Audio(4, seconds)])
    back = Layout.parse(str(lay))
    assert back == lay and back.segments[1].seconds == seconds


def test_audio_token_type_and_object_form():
    assert Layout.parse("T1 A2 T1").token_types().tolist() == [0, AUDIO, AUDIO, 0]
    assert AUDIO == 4
    assert Layout.coerce(Audio(3)) == Layout.parse("A3")


@pytest.mark.parametrize("make,error,match", [
    (lambda: Audio(0), ValueError, "Audio: `n` must be >= 1"),
    (lambda: Audio(2.5), TypeError, "Audio: `n` must be an int"),
    (lambda: Audio(3, 0.0), ValueError, "Audio: `seconds` must be a finite number > 0"),
    (lambda: Audio(3, -1.0), ValueError, "Audio: `seconds` must be a finite number > 0"),
    (lambda: Audio(3, math.nan), ValueError, "Audio: `seconds` must be a finite number > 0"),
    (lambda: Audio(3, "0.04"), TypeError, "Audio: `seconds` must be a number"),
    (lambda: Audio(3, 1e39), ValueError, "Audio: `seconds` = 1e\\+39 would make positions"),
])
def test_bad_audio_is_refused_with_its_argument(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("bad,match", [("A", "cannot read segment 'A'"), ("A2x3", "cannot read segment"),
                                       ("A3@x", "cannot read segment"), ("A3@1e", "seconds per token '1e'"),
                                       ("A3@0", "Audio: `seconds` must be a finite number > 0")])
def test_unreadable_audio_names_the_segment(bad, match):
    with pytest.raises(ValueError, match=match):
        Layout.parse(bad)


def test_the_parse_error_lists_audio():
    with pytest.raises(ValueError, match=r"A\{n\}\[@seconds\] \(audio\)"):
        Layout.parse("Q3")


LAYOUTS = ["T3 A5 T2", "A4", "T2 I2x3 A6@0.02 V2x2x2@2.5 T1 A3", "A2 G2x3 T1"]


def test_every_registered_design_says_how_it_places_audio():
    assert {d: get_design(d).audio for d in designs()} == {d: "text" for d in designs()}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("design", designs())
def test_designs_place_audio_as_a_text_run(design, layout):
    """Every registered design places audio as text: the positions of the layout with each ``A{n}`` written
    ``T{n}`` (an independent layout, placed by the same design), whatever the audio's seconds per token."""
    lay = Layout.parse(layout)
    as_text = Layout(Text(s.n) if isinstance(s, Audio) else s for s in lay)
    try:
        want = positions(as_text, design)
    except ValueError as e:  # a design that cannot place the vision segments refuses both the same way
        with pytest.raises(ValueError, match=str(e)[:40].replace("(", "\\(").replace("[", "\\[")):
            positions(lay, design)
        return
    got = positions(lay, design)
    assert torch.equal(got, want)
    # and audio tokens are a run: consecutive positions one apart on every axis
    start = 0
    for seg in lay:
        if isinstance(seg, Audio):
            run = got[start:start + seg.n].double()
            assert torch.equal(run - run[:1], torch.arange(seg.n, dtype=torch.float64)[:, None].expand_as(run))
        start += seg.num_tokens


def test_a_design_may_refuse_audio_by_name():
    seen = []

    def one_d(layout):
        seen.append(layout)
        return torch.arange(layout.num_tokens, dtype=torch.float32)[:, None]

    register("_test_audio_refused", summary="test", allocation="1d", audio="refuse", axes=1)(one_d)
    try:
        with pytest.raises(ValueError, match="design '_test_audio_refused' defines no place for audio .* holds audio "
                                             "segment A2@0.02; write the audio as text \\(T2\\)"):
            positions("T1 A2@0.02 T1", "_test_audio_refused")
        assert not seen  # refused before the design ran
        assert positions("T1 I1x2", "_test_audio_refused")[:, 0].tolist() == [0.0, 1.0, 2.0]
    finally:
        del _REGISTRY["_test_audio_refused"]
    with pytest.raises(ValueError, match="register: `audio` must be one of 'text', 'refuse'"):
        register("_test_bad_audio", summary="test", allocation="1d", audio="time")


def test_rope_index_takes_audio_as_text_and_refuses_the_layout_audio_code():
    """Hugging Face token types have no audio code: audio given as text (0) is placed as the layout with A{n}
    says, by every design; the layout's own code 4 is refused with the way out."""
    from ropekit import rope_index

    lay = Layout.parse("T2 A3 I2x2 A2 T1")
    types = lay.token_types()
    hf_types = types.masked_fill(types == AUDIO, 0)[None]
    for design in designs():
        pos, _ = rope_index(None, hf_types, [[1, 4, 4]], design=design)
        assert torch.equal(pos[:, 0].T, positions(lay, design)), design
    with pytest.raises(ValueError, match="give audio tokens as text \\(0\\)"):
        rope_index(None, types[None], [[1, 4, 4]])
