"""Today's verdicts for an older report's saved per-run results (analysis/time_to_accuracy/reanalyse.py), on the
saved results of the small benchmark and on a frame whose answer is known."""

from __future__ import annotations

import pandas as pd
from attent.analysis.time_to_accuracy.reanalyse import reanalyse
from scipy import stats
from statsmodels.stats.multitest import multipletests

from tests.helpers.paths import REPO


def test_saved_results_get_holm_verdicts_and_their_equal_samples_row_is_matched():
    table = reanalyse(pd.read_csv(REPO / "benchmarks/results/time_to_accuracy_small/per_run.csv"), {"fmnist-vit": 0.01})
    vit = table[table["workload"].eq("fmnist-vit")].set_index("method")
    assert "full_equal_cost" not in vit.index  # full data at equal samples, saved as full_equal_samples
    assert vit.loc["full_equal_samples", "budget_match"] == "matched"
    assert vit.loc["infobatch", "verdict"].startswith("not judged")  # another budget: outside the family
    judged = vit[~vit["budget_match"].eq("apart")]  # full data (the reference) and the matched rows
    # the Holm adjustment is statsmodels' own over the unadjusted paired t-tests of the family
    per_run = pd.read_csv(REPO / "benchmarks/results/time_to_accuracy_small/per_run.csv")
    finals = per_run[per_run["workload"].eq("fmnist-vit")].pivot_table(
        index="seed", columns="method", values="final_metric"
    )
    p = [stats.ttest_rel(finals["attent"], finals[m]).pvalue for m in judged.index]
    assert list(judged["p_holm"].round(10)) == list(pd.Series(multipletests(p, method="holm")[1]).round(10))
    assert vit.loc["full", "verdict"] == "worse" and vit.loc["random", "verdict"] == "inconclusive"


def test_a_clear_difference_is_better_and_a_tiny_one_is_equivalent():
    rows = []
    for seed, (a, r, f) in enumerate([(0.80, 0.70, 0.801), (0.82, 0.71, 0.819), (0.81, 0.705, 0.8105)]):
        for method, value in (("attent", a), ("random", r), ("full", f)):
            rows.append(
                {
                    "workload": "w",
                    "method": method,
                    "label": method,
                    "seed": seed,
                    "final_metric": value,
                    "reached": True,
                    "cost_to_target_s": 10.0 + seed,
                    "lower_is_better": False,
                    "tolerance": 0.005,
                    "budget": 0.5 if method != "full" else 1.0,
                }
            )
    table = reanalyse(pd.DataFrame(rows), {"w": 0.01}).set_index("method")
    assert table.loc["random", "verdict"] == "better"
    assert table.loc["full", "verdict"] == "equivalent within ± 0.01"
