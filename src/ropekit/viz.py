"""Former home of the N-D figure views; kept so ``from ropekit.viz import ...`` still works.

Numbers live in :mod:`ropekit.analysis.nd`, pictures in :mod:`ropekit.analysis.nd_figures`, and the
``ropekit viz`` command in :mod:`ropekit.cli`.
"""
from .analysis.nd import grid_offsets, max_angular_gap, similarity_grid
from .analysis.nd_figures import plot_kernel_maps, plot_projections, plot_sim2d, plot_sim3d

__all__ = ["grid_offsets", "similarity_grid", "max_angular_gap", "plot_projections", "plot_sim2d",
           "plot_sim3d", "plot_kernel_maps"]
