"""The time-to-accuracy report's figures drawn from a committed report's tables (real runs, no
MLflow store): titles inside the figure, every plotted value inside the axes."""

from __future__ import annotations

import pandas as pd


def test_figures_keep_a_long_metric_name_and_below_uniform_picks_in_view():
    """The figures of the LLM size benchmark's committed report (real runs): the metric's long name
    (eval_gsm8k_test_response_loss) once pushed the titles past both edges of the figure, and
    Random's below-uniform picks (negative hardness in some epochs) fell under the axis."""
    from attent.analysis.time_to_accuracy.figures import workload_figures
    from attent.analysis.time_to_accuracy.judge import results_from_tables
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tests.helpers.paths import REPO

    results = REPO / "benchmarks" / "results" / "llm_size"
    per_run, curves = (pd.read_csv(results / f"{name}.csv") for name in ("per_run", "curves"))
    [result] = results_from_tables(per_run, curves)
    drawn = workload_figures(result)
    assert set(drawn) == {"gsm8k-128_curves", "gsm8k-128_final_vs_cost", "gsm8k-128_hardness"}
    for figure in drawn.values():
        renderer = FigureCanvasAgg(figure).get_renderer()
        for ax in figure.axes:
            title = ax.title.get_window_extent(renderer)
            assert figure.bbox.x0 <= title.x0 and title.x1 <= figure.bbox.x1, ax.get_title()
    lowest = curves.loc[curves["method"].eq("random"), ["epoch", "hardness"]].groupby("epoch")["hardness"].mean().min()
    assert lowest < 0  # the data this guards: Random below uniform in some epoch
    assert drawn["gsm8k-128_hardness"].axes[0].get_ylim()[0] < lowest
