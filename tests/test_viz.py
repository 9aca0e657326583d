"""N-D paper figure views and the ``viz`` CLI: kernels against a brute-force float64 formula, PNG output."""
import math

import matplotlib.image as mpimg
import pytest
import torch

from ropekit.rotations.directional import directional_matrix, nd_directions
from ropekit.analysis.nd import grid_offsets, max_angular_gap, similarity_grid
from ropekit.analysis.nd_figures import plot_kernel_maps, plot_projections, plot_sim2d, plot_sim3d
from ropekit.cli import build_parser


def _brute_kernel(W, d0, d1, d2=None):
    """Mean over frequency pairs of cos(Δ · W[:, j]) — the isotropic-q expectation — in Python floats."""
    d = [d0, d1] + ([] if d2 is None else [d2])
    cols = W.tolist()
    half = len(cols[0])
    return sum(math.cos(sum(d[a] * cols[a][j] for a in range(len(d)))) for j in range(half)) / half


def test_grid_offsets_centre_on_a_token():
    assert grid_offsets(5).tolist() == [-2, -1, 0, 1, 2]
    assert grid_offsets(4).tolist() == [-2, -1, 0, 1]


def test_similarity_grid_matches_brute_force_and_invariants():
    W = directional_matrix(16, 2, "weyl", dtype=torch.float64)
    k = similarity_grid(W, 7)
    r = grid_offsets(7).tolist()
    for row in range(7):
        for col in range(7):
            # rows are offsets along axis 0, columns along axis 1 (the one convention of every kernel map)
            assert k[row, col].item() == pytest.approx(_brute_kernel(W, r[row], r[col]), abs=1e-12)
    assert k[3, 3].item() == pytest.approx(1.0, abs=1e-15)  # the centre token vs itself
    torch.testing.assert_close(k, k.flip(0).flip(1))  # k(−Δ) = k(Δ)
    assert (k <= 1 + 1e-12).all()


def test_similarity_grid_extra_axis_and_per_head_average():
    W3 = directional_matrix(12, 3, "ggr", dtype=torch.float64)
    k = similarity_grid(W3, 3, extra=(2.5,))
    assert k[0, 2].item() == pytest.approx(_brute_kernel(W3, -1, 1, 2.5), abs=1e-12)
    heads = torch.stack([directional_matrix(8, 2, "sobol", seed=s, dtype=torch.float64) for s in (0, 1)])
    torch.testing.assert_close(similarity_grid(heads, 5),
                               (similarity_grid(heads[0], 5) + similarity_grid(heads[1], 5)) / 2)


def test_monte_carlo_view_agrees_with_the_exact_kernel():
    W = directional_matrix(8, 2, "sobol", seed=0, dtype=torch.float64)
    exact = similarity_grid(W, 5)
    mc = similarity_grid(W, 5, num_samples=4000, seed=1)
    assert (mc - exact).abs().max() < 0.08  # standard error ≈ 0.02 for D = 8, N = 4000
    assert mc[2, 2].item() == pytest.approx(1.0, abs=0.08)


def test_max_angular_gap():
    step = 2 * math.pi / 12
    even = torch.tensor([[math.cos(j * step), math.sin(j * step)] for j in range(12)], dtype=torch.float64)
    assert max_angular_gap(even.double()) == pytest.approx(1.0, abs=1e-9)
    # six directions on a half circle (every 30°): the empty half plus one step is 210° = 3.5 × 60°
    assert max_angular_gap(even[:6].double()) == pytest.approx(3.5, abs=1e-9)
    with pytest.raises(ValueError, match=r"\(N, 2\)"):
        max_angular_gap(nd_directions(4, 3, "weyl"))


def _png_shape(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return mpimg.imread(path).shape


def test_figures_are_written(tmp_path):
    for n in (2, 3):
        assert min(_png_shape(plot_projections(n, 32, "weyl", tmp_path / f"p{n}.png"))[:2]) > 200
    assert min(_png_shape(plot_sim2d(32, 9, "sobol", tmp_path / "a" / "s2.png"))[:2]) > 200
    assert min(_png_shape(plot_sim2d(16, 5, "ggr", tmp_path / "s2mc.png", num_samples=8))[:2]) > 200
    assert min(_png_shape(plot_sim3d(24, 7, [-2, 0, 2.5], "weyl", tmp_path / "s3.png"))[:2]) > 200
    W = {"a": directional_matrix(8, 2, "golden"), "b": directional_matrix(8, 2, "random", seed=0)}
    path, maps = plot_kernel_maps(W, 5, tmp_path / "k.png", title="t")
    assert _png_shape(path)[0] > 200 and set(maps) == {"a", "b"}


def _parser():
    return build_parser()


def test_cli_sub_commands(tmp_path, capsys):
    p = _parser()
    runs = [
        (["viz", "proj", "--n-dims", "2", "--num-vectors", "16", "--sampling-method", "golden"], "proj.png"),
        (["viz", "sim2d", "--d-head", "16", "--grid-size", "5", "--sampling-method", "weyl",
          "--num-samples", "4"], "sim2d.png"),
        (["viz", "sim3d", "--d-head", "12", "--grid-size", "5", "--slice-coords", "-1", "0", "1",
          "--sampling-method", "ggr"], "sim3d.png"),
    ]
    for argv, name in runs:
        args = p.parse_args(argv + ["--save-path", str(tmp_path / name)])
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert str(tmp_path / name) in out and (tmp_path / name).exists()
    args = p.parse_args(["viz", "sim3d", "--d-head", "12"])
    assert args.slice_coords == [-10.0, 0.0, 10.0] and args.grid_size == 32 and args.num_samples is None


def test_cli_rejects_bad_choices():
    p = _parser()
    for argv in (["viz", "proj", "--n-dims", "4"], ["viz", "sim2d", "--sampling-method", "halton"], ["viz"]):
        with pytest.raises(SystemExit):
            p.parse_args(argv)


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="`n_dims` must be 2 or 3"):
        plot_projections(4, 10, "sobol", tmp_path / "x.png")
    with pytest.raises(ValueError, match="`num_vectors` must be >= 1"):
        plot_projections(2, 0, "sobol", tmp_path / "x.png")
    with pytest.raises(ValueError, match="unknown sampling method 'halton'; choose one of sobol, weyl"):
        plot_sim2d(16, 5, "halton", tmp_path / "x.png")
    with pytest.raises(ValueError, match="`rotary_dim` must be a positive even number"):
        plot_sim2d(15, 5, "sobol", tmp_path / "x.png")
    with pytest.raises(ValueError, match="`grid_size` must be >= 1"):
        plot_sim2d(16, 0, "sobol", tmp_path / "x.png")
    with pytest.raises(ValueError, match="`num_samples` must be >= 1"):
        plot_sim2d(16, 5, "sobol", tmp_path / "x.png", num_samples=0)
    with pytest.raises(ValueError, match="`slice_coords` must be a non-empty list"):
        plot_sim3d(12, 5, [], "sobol", tmp_path / "x.png")
    with pytest.raises(ValueError, match="'golden' makes 2-D directions only"):
        plot_sim3d(12, 5, [0.0], "golden", tmp_path / "x.png")
    with pytest.raises(ValueError, match="one `extra` offset per axis"):
        similarity_grid(directional_matrix(12, 3, "weyl"), 5)
    with pytest.raises(ValueError, match="is empty"):
        plot_kernel_maps({}, 5, tmp_path / "x.png")


def test_report_section(tmp_path):
    import json

    from ropekit.report.nd import section

    sec = section(tmp_path)
    assert set(sec) == {"title", "html", "metrics"}
    for name in ("nd_directions_2d.png", "nd_directions_3d.png", "nd_kernels.png"):
        assert f"src='{name}'" in sec["html"] and (tmp_path / name).exists()
    metrics = json.loads(json.dumps(sec["metrics"]))
    rings = metrics["kernel_rings"]
    # axial RoPE rotates each pair along one axis, so its kernel is a cross; the others are not
    axial = rings["axial (base 100)"]["r=16"]["axis_bias"]
    assert axial > 0.15
    assert all(abs(v["r=16"]["axis_bias"]) < axial / 2 for k, v in rings.items() if not k.startswith("axial"))
    # golden-angle directions are the most even on the circle
    assert metrics["largest_gap_2d"]["golden"] == min(metrics["largest_gap_2d"].values())


def _grid_holds(z, grid_size):
    """Whether Δ(axis 2) = z lies between the offsets of the first and last token of a grid_size³ grid,
    counted from its centre token ``grid_size // 2`` (token positions 0 .. grid_size - 1)."""
    centre = grid_size // 2
    return 0 - centre <= z <= (grid_size - 1) - centre


def test_sim3d_refuses_slices_outside_the_grid(tmp_path, capsys):
    """A slice beyond the grid's last token along axis 2 shows offsets the grid does not have: refused, naming
    the offsets allowed and the smallest grid that holds every slice (found here by trying each size)."""
    from ropekit.analysis.nd_figures import check_slices_in_grid

    for grid in range(1, 14):
        for z in (-7, -6.5, -3, -2.5, -1, -0.5, 0, 0.5, 1, 2.5, 3, 6, 6.5, 7):
            if _grid_holds(z, grid):
                check_slices_in_grid([z], grid)
                continue
            smallest = next(g for g in range(grid + 1, 100) if _grid_holds(z, g))
            with pytest.raises(ValueError, match=rf"`slice_coords`: {z:g} is outside the grid: a `grid_size` of "
                                                 rf"{grid} holds .* or a `grid_size` of at least {smallest}$"):
                check_slices_in_grid([z, 0], grid)
    with pytest.raises(ValueError, match="`slice_coords`: 4 is outside the grid"):
        plot_sim3d(12, 7, [0, 4], "sobol", tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
    # the command line names its own options, and writes nothing
    png = tmp_path / "s.png"
    status = _cli_main(["viz", "sim3d", "--d-head", "12", "--grid-size", "8", "--slice-coords", "0", "-5", "3.5",
                        "--save-path", str(png)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and not png.exists()
    assert err == ("ropekit: error: --slice-coords: -5, 3.5 are outside the grid: a --grid-size of 8 holds Δ(axis 2) "
                   "offsets from -4 to 3 around the centre token; give --slice-coords in that range, or a "
                   "--grid-size of at least 10")
    # the default slices (-10 0 10) need a grid of 21 tokens per axis
    assert _cli_main(["viz", "sim3d", "--d-head", "12", "--grid-size", "20", "--save-path", str(png)]) == 2
    assert "--slice-coords: 10 is outside" in capsys.readouterr().err and not png.exists()
    assert _cli_main(["viz", "sim3d", "--d-head", "12", "--grid-size", "21", "--save-path", str(png)]) == 0
    assert png.exists()


def _cli_main(argv):
    from ropekit.cli import main

    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize("option,value", [("--slice-coords", "１０"), ("--slice-coords", "-٣"), ("--grid-size", "３"),
                                          ("--d-head", "１２"), ("--base", "１e4"), ("--num-samples", "४"),
                                          ("--seed", "０")])
def test_viz_numbers_with_non_ascii_digits_are_refused(option, value, tmp_path, capsys):
    """float() and int() read any Unicode decimal digit ('１０' is 10.0); the options take ASCII digits only and
    say which digit to retype, instead of silently drawing a figure."""
    png = tmp_path / "s.png"
    assert float(value) == float(value.translate({ord(c): str(int(c)) for c in value if c.isdigit()}))
    status = _cli_main(["viz", "sim3d", "--d-head", "12", "--grid-size", "21", option, value,
                        "--save-path", str(png)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and not png.exists()
    assert err.startswith(f"ropekit: error: argument {option}: {value!r} holds the non-ASCII digit ")
    assert "write numbers with the ASCII digits 0-9" in err
