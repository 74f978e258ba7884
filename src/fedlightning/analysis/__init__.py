"""Analysis helpers: learning-curve and partition plots."""

from fedlightning.analysis.plots import plot_curves, plot_partition, plot_runs

__all__ = ["plot_curves", "plot_partition", "plot_runs"]
