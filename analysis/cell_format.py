"""How the reports write a number in a cell: missing values, mean ± std, percentages, ratios,
changes and intervals (the paper tables' files, the time-to-accuracy report's tables and its
comparisons' notes all write them so)."""

from __future__ import annotations

import math

MISSING = "—"  # how tables and figures show a value nobody logged


def stat_cell(mean: float, std: float, places: int) -> str:
    if math.isnan(mean):
        return MISSING
    if math.isnan(std):  # a single seed has no spread
        return f"{mean:.{places}f}"
    return f"{mean:.{places}f} ± {std:.{places}f}"


def change_cell(change: float) -> str:
    return MISSING if math.isnan(change) else f"{change:+.1f}%"


def percent_cell(fraction: float) -> str:
    return MISSING if math.isnan(fraction) else f"{fraction:.1%}"


def ratio_cell(value: float) -> str:
    return MISSING if math.isnan(value) else f"{value:.2f}"


def interval_cell(low: float, high: float, places: int) -> str:
    return MISSING if math.isnan(low) else f"[{low:.{places}f}, {high:.{places}f}]"
