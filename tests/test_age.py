"""AGE schedules: the paper's layer ranges, the released code's numbering, any layer count."""
import pytest

from ropekit.age import age_schedule


@pytest.mark.parametrize("n", [1, 3, 4, 7, 36])
def test_schedules_cover_the_paper_definitions(n):
    lower = age_schedule("lower", n)
    upper = age_schedule("upper", n)
    assert len(lower) == len(upper) == n
    # lower ∪ upper = all layers, disjoint, lower is a prefix
    assert all((a == "circle") != (b == "circle") for a, b in zip(lower, upper))
    k = lower.count("circle")
    assert lower[:k] == ["circle"] * k and k == (n + 1) // 2
    assert age_schedule("all", n) == ["circle"] * n
    assert age_schedule("alternate", n) == ["circle" if i % 2 == 0 else "mrope" for i in range(n)]


def test_paper_36_layer_ranges():
    # paper §5.4: upper = layers 19–36, lower = layers 1–18 (1-based)
    up = age_schedule("upper", 36)
    assert [i + 1 for i, d in enumerate(up) if d == "circle"] == list(range(19, 37))


def test_released_code_numbering_swaps_2_and_3():
    assert age_schedule("strategy_2", 4) == age_schedule("lower", 4)
    assert age_schedule("strategy_3", 4) == age_schedule("upper", 4)
    assert age_schedule("strategy_4", 5) == age_schedule("alternate", 5)


def test_explicit_lists_and_errors():
    assert age_schedule([True, False, "vrope"], 3) == ["circle", "mrope", "vrope"]
    assert age_schedule("alternate", 2, designs=("vrope", "mrope")) == ["vrope", "mrope"]
    with pytest.raises(ValueError, match="3 layers"):
        age_schedule([True, False], 3)
    with pytest.raises(ValueError, match="unknown AGE schedule"):
        age_schedule("zigzag", 3)
    with pytest.raises(ValueError, match="num_layers"):
        age_schedule("all", 0)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: age_schedule("all", 10**30), ValueError, "`num_layers` must be an int from 1 to 65536"),
    (lambda: age_schedule("all", 4, designs=None), ValueError, "`designs` must be a pair"),
    (lambda: age_schedule("all", 4, designs="ab"), ValueError, "`designs` must be a pair"),
    (lambda: age_schedule("all", 4, designs=("circle", "nope")), ValueError, "`designs`: unknown design 'nope'"),
    (lambda: age_schedule("all", 4, designs=("circle", 3)), TypeError, "`designs`: `design` must be"),
    (lambda: age_schedule([True, "nope"], 2), ValueError, "entry 1: unknown design 'nope'"),
    (lambda: age_schedule(3, 2), TypeError, "`schedule` must be a name"),
    (lambda: age_schedule(None, 2), TypeError, "`schedule` must be a name"),
])
def test_bad_arguments_are_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
