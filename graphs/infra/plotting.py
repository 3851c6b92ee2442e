"""Headless matplotlib for the plots the stages write (asset metadata, training curves)."""

from __future__ import annotations


def headless_pyplot():
    """``matplotlib.pyplot`` on the Agg backend: no display needed (servers, Dagster workers,
    torchrun ranks). Imported on first use (~0.3 s), so modules that only sometimes plot stay
    cheap to import."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
