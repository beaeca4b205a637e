"""The data-size view of a benchmark: one workload per training-set size, read from a real MLflow
SQLite store (runs logged as `attent bench` logs them, test_tta_report's synthetic curves)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from attent import contract
from attent.analysis import ReportError
from attent.analysis.time_to_accuracy.data_size import build_data_size_report
from attent.analysis.time_to_accuracy.data_size_joined import Source, joined_runs, judge_joined, read_source
from attent.cli.main import main as attent_main
from mlflow import MlflowClient

from tests.helpers.paths import REPO
from tests.helpers.tta_benchmark import log_run, method_specs

RESULTS = REPO / "benchmarks" / "results"
SHIPPED = RESULTS / "data_size"
COMPARED = ("full", contract.METHOD_FULL_LONG, contract.METHOD_FULL_EQUAL_COST, "attent", "random")


def log_sizes(uri: str, experiment: str = "sizes", sizes=(("fm-6000", 6000, 0.05), ("fm-600", 600, 0.0))) -> str:
    """Sizes of one workload, 3 seeds each, under a parent that logged its spec as `attent bench`
    does (``size_axis`` set); returns the benchmark's parent run."""
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(experiment)
    parent = client.create_run(experiment_id, tags={contract.TAG_ROLE: contract.ROLE_BENCHMARK}).info.run_id
    client.log_dict(
        parent,
        {
            "name": experiment,
            "size_axis": True,
            "workloads": [{"name": name, "tolerance": None, "margin": None} for name, _, _ in sizes],
        },
        contract.BENCH_SPEC_FILE,
    )
    for workload, size, gain in sizes:
        for seed in (0, 1, 2):
            for method, spec in method_specs(seed).items():
                if method not in COMPARED:
                    continue
                if method == "attent":  # AtteNT gains on Random with more data
                    spec = dict(spec, curve=[v + gain for v in spec["curve"]])
                run_id = log_run(client, experiment_id, parent, workload, method, seed, spec)
                client.log_param(run_id, "task.train_limit", str(size))
    return parent


def test_each_size_gets_its_plateau_verdict_comparisons_and_savings(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    parent = log_sizes(uri)
    out = build_data_size_report("sizes", tracking_uri=uri, out_dir=tmp_path / "report")
    table = pd.read_csv(out / "data_size.csv")
    assert list(table["size"]) == [600, 6000] and list(table["workload"]) == ["fm-600", "fm-6000"]
    assert set(table["plateau"]) == {"plateaued"}
    # the 600-image AtteNT differs from Random by seed noise only; at 6,000 it is 5 points higher on every seed
    small, large = table.iloc[0], table.iloc[1]
    assert large["final_vs_random"] == pytest.approx(small["final_vs_random"] + 0.05)
    assert large["final_vs_random_low"] > 0 and large["final_vs_random_verdict"] == "better"
    assert small["final_vs_random_verdict"] in ("inconclusive", "equivalent within ± 0.005")
    assert small["realized_saving_low"] < small["realized_saving"] < small["realized_saving_high"]
    text = (out / "data_size.md").read_text()
    assert "| 600 | 3 | plateaued (3) |" in text and "| 6000 | 3 | plateaued (3) |" in text
    assert (out / "figures" / "data_size.png").stat().st_size > 10_000
    logged = {a.path for a in client.list_artifacts(parent, "report/data_size")}
    assert "report/data_size/data_size.md" in logged
    # AtteNT's 5-point gain on Random from 600 to 6,000 images (one decade) is the trend's slope
    trends = pd.read_csv(out / "data_size_trend.csv").set_index("comparator")
    assert trends.loc["random", "slope_per_decade"] == pytest.approx(0.05)
    assert trends.loc["random", "sizes"] == 2 and trends.loc["random", "points"] == 6
    assert "| AtteNT − Random at AtteNT's budget | 2 | 6 | +0.0500 |" in text


def test_attent_report_rebuilds_a_benchmarks_reports_from_its_runs(tmp_path):
    """The data-size view by the spec's ``size_axis`` (the one rule, `attent bench`'s too): a
    spec without it gets the time-to-accuracy report alone."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log_sizes(uri)
    assert attent_main(["report", "--experiment", "sizes", "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 0
    folder = tmp_path / "out" / "sizes"
    assert "## fm-600" in (folder / "time_to_accuracy.md").read_text()
    assert "| 6000 | 3 | plateaued (3) |" in (folder / "data_size" / "data_size.md").read_text()
    from attent.analysis.time_to_accuracy.report import benchmark_report

    folder, size_view = benchmark_report("sizes", uri, tmp_path / "no-axis", spec={"workloads": []})
    assert not size_view and not (folder / "data_size").exists() and (folder / "time_to_accuracy.md").exists()


def test_attent_report_with_joins_benchmarks_of_other_stores(tmp_path):
    """A size run in a store of its own joins this store's sizes (``--with EXPERIMENT@URI``): each
    size's final comparisons and plateau are its own report's, the per-run table names each run's
    source, and a benchmark joined twice (its AtteNT seeds in two sources) is refused."""
    uri, other = f"sqlite:///{tmp_path / 'mlflow.db'}", f"sqlite:///{tmp_path / 'other.db'}"
    log_sizes(uri)
    log_sizes(other, "big", sizes=(("fm-60000", 60000, 0.1),))
    own = pd.read_csv(build_data_size_report("sizes", tracking_uri=uri, out_dir=tmp_path / "own") / "data_size.csv")
    assert (
        attent_main(
            [
                "report",
                "--experiment",
                "sizes",
                "--tracking-uri",
                uri,
                "--with",
                f"big@{other}",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    folder = tmp_path / "out" / "sizes"
    table = pd.read_csv(folder / "data_size.csv")
    assert list(table["size"]) == [600, 6000, 60000] and list(table["plateau_seeds"]) == [3, 3, 3]
    columns = [c for c in own if c.startswith("final_vs_") or c.startswith("plateau") or c.startswith("realized")]
    pd.testing.assert_frame_equal(table.iloc[:2][columns], own[columns])
    assert not any(c.startswith("cost_vs_") for c in table)  # each store set its own target
    assert table.iloc[2]["final_vs_random"] == pytest.approx(table.iloc[0]["final_vs_random"] + 0.1)
    sources = pd.read_csv(folder / "per_run.csv").groupby("workload")["source"].first()
    assert sources["fm-60000"] == f"big@{other}" and sources["fm-600"].startswith("sizes@")
    assert "60000 | 3 | plateaued (3)" in (folder / "data_size.md").read_text()
    assert (
        attent_main(
            [
                "report",
                "--experiment",
                "sizes",
                "--tracking-uri",
                uri,
                "--with",
                "sizes",
                "--out",
                str(tmp_path / "twice"),
            ]
        )
        == 1
    )


def test_a_saved_per_run_table_is_judged_again_under_todays_rules():
    """The shipped 600- and 2,000-image report's per_run.csv, joined alone: each comparison's
    interval is the scipy interval at today's Holm level (600: nothing rejected among 5, so
    1 - 0.05 / 5 for all; 2,000: full data at equal cost rejected first, at 1 - 0.05 / 5, the rest
    at the stopping step's 1 - 0.05 / 4), with the saved view's verdicts; its sizes are those saved
    beside it (``data_size/data_size.csv``)."""
    from scipy import stats

    source = read_source(str(SHIPPED / "per_run.csv"), None)
    assert source.sizes == {"fmnist-600": 600, "fmnist-2000": 2000, "fmnist-20000": 20000}
    table, _, _ = judge_joined(joined_runs([source]), source.sizes)
    saved = pd.read_csv(SHIPPED / "data_size" / "data_size.csv").set_index("workload")
    runs = pd.read_csv(SHIPPED / "per_run.csv")
    for i, (workload, levels) in enumerate(
        (
            ("fmnist-600", {"full": 0.99, "full_equal_cost": 0.99, "random": 0.99}),
            ("fmnist-2000", {"full": 0.9875, "full_equal_cost": 0.99, "random": 0.9875}),
        )
    ):
        finals = runs[runs["workload"] == workload].pivot_table(index="seed", columns="method", values="final_metric")
        row = table.iloc[i]
        assert row["workload"] == workload
        for method, level in levels.items():
            key = f"final_vs_{method}"
            expected = stats.ttest_rel(finals["attent"], finals[method]).confidence_interval(level)
            assert row[f"{key}_level"] == pytest.approx(level)
            assert (row[f"{key}_low"], row[f"{key}_high"]) == pytest.approx((expected.low, expected.high))
            assert row[f"{key}_verdict"] == saved.loc[workload, f"{key}_verdict"]
            assert (row[f"{key}_low"] > 0 or row[f"{key}_high"] < 0) == (row[f"{key}_verdict"] in ("better", "worse"))


def runs_with_differences(differences: dict[str, dict[int, list[float]]]) -> pd.DataFrame:
    """Per-run rows for ``size_trends``: one AtteNT run per size and seed, and for each method,
    a run whose final metric is AtteNT's minus that size's and seed's difference."""
    rows = []
    for size in next(iter(differences.values())):
        for seed in range(3):
            rows.append({"workload": f"fm-{size}", "seed": seed, "method": "attent", "final_metric": 0.7})
            rows += [
                {"workload": f"fm-{size}", "seed": seed, "method": method, "final_metric": 0.7 - by_size[size][seed]}
                for method, by_size in differences.items()
            ]
    return pd.DataFrame(rows)


def test_the_size_trend_is_statsmodels_ols_on_log_size_with_holm_across_comparators():
    """A difference that grows by 0.02 per tenfold data over seed noise of ± 0.003 is a gain with
    size (for a loss, a loss); one that does not move is inconclusive. Slope, interval and p
    are scipy's straight-line fit on log10(size); the adjusted p statsmodels' Holm over both."""
    from attent.analysis.time_to_accuracy.data_size_trend import GAINS, LOSES, size_trends
    from scipy import stats
    from statsmodels.stats.multitest import multipletests

    sizes = {"fm-600": 600, "fm-6000": 6000, "fm-60000": 60000}
    noise = [-0.003, 0.0, 0.003]
    rising = {600: [-0.04 + e for e in noise], 6000: [-0.02 - e for e in noise], 60000: noise}
    flat = {600: [0.01, -0.01, 0.0], 6000: [-0.01, 0.0, 0.01], 60000: [0.0, 0.01, -0.01]}
    runs = runs_with_differences({"random": rising, "full": flat})
    trends = size_trends(runs, sizes, lower=False).set_index("comparator")
    assert trends.loc["random", "verdict"] == GAINS and trends.loc["full", "verdict"] == "inconclusive"
    assert trends.loc["random", "slope_per_decade"] == pytest.approx(0.02)
    assert trends.loc["full", "low"] < 0 < trends.loc["full", "high"]
    finals = runs.pivot_table(index=["workload", "seed"], columns="method", values="final_metric")
    x = np.log10([sizes[w] for w in finals.index.get_level_values("workload")])
    fits = {
        method: stats.linregress(x, (finals["attent"] - finals[method]).to_numpy()) for method in ("random", "full")
    }
    for method, fit in fits.items():
        assert trends.loc[method, "slope_per_decade"] == pytest.approx(fit.slope)
        assert trends.loc[method, "intercept"] == pytest.approx(fit.intercept)
        assert trends.loc[method, "p"] == pytest.approx(fit.pvalue)
    adjusted = multipletests([fits["random"].pvalue, fits["full"].pvalue], method="holm")[1]
    assert list(trends.loc[["random", "full"], "p_holm"]) == pytest.approx(list(adjusted))
    # the rejected one's interval at its Holm step, 1 - 0.05 / 2: scipy's slope t-interval (9 points)
    half = stats.t.ppf(1 - 0.05 / 4, df=9 - 2) * fits["random"].stderr
    assert trends.loc["random", "level"] == pytest.approx(1 - 0.05 / 2)
    assert (trends.loc["random", "low"], trends.loc["random", "high"]) == pytest.approx(
        (fits["random"].slope - half, fits["random"].slope + half)
    )
    # a loss falls where AtteNT gains: the same rising difference of a loss is AtteNT losing
    assert size_trends(runs_with_differences({"random": rising}), sizes, lower=True).iloc[0]["verdict"] == LOSES
    # one size: no trend to fit
    assert size_trends(runs[runs["workload"] == "fm-600"], sizes, lower=False).empty


def saved(*folders: str) -> list[Source]:
    """The per-run tables saved in ``folders`` (under benchmarks/results/)."""
    return [read_source(str(RESULTS / folder / "per_run.csv"), None) for folder in folders]


def test_joining_seeds_reproduces_the_saved_size_rows_in_the_reports_family():
    """The join over the shipped per-run tables alone gives each size's saved comparisons to the
    last digit (Holm across the size's whole family, as its report did) and the trend; a seed of
    AtteNT found in two tables is refused."""
    expected = pd.read_csv(SHIPPED / "data_size" / "data_size.csv").set_index("workload")
    sources = saved("data_size", "data_size/fmnist-20000")
    table, trends, _ = judge_joined(joined_runs(sources), {w: int(s) for w, s in expected["size"].items()})
    assert list(table["size"]) == [600, 2000, 20000] and list(table["seeds"]) == [3, 3, 3]
    for row in table.to_dict("records"):
        for method in ("random", "full", "full_equal_cost"):
            key = f"final_vs_{method}"
            assert (row[key], row[f"{key}_low"], row[f"{key}_high"]) == pytest.approx(
                (
                    expected.loc[row["workload"], key],
                    expected.loc[row["workload"], f"{key}_low"],
                    expected.loc[row["workload"], f"{key}_high"],
                )
            )
            assert row[f"{key}_verdict"] == expected.loc[row["workload"], f"{key}_verdict"]
    assert list(trends["points"]) == [9, 9, 9]
    assert list(table["final_vs_random"]) == pytest.approx(list(expected["final_vs_random"]))
    with pytest.raises(ReportError, match="in two sources"):
        judge_joined(joined_runs([*sources, *saved("data_size")]), dict(expected["size"].astype(int)))


def test_the_lines_lack_of_fit_is_statsmodels_f_test_against_one_mean_per_size():
    """A difference that dips at the middle sizes and recovers (a V over seed noise of ± 0.003)
    departs from a line; one on a line does not. The lack-of-fit p is statsmodels' ANOVA of the
    line against the per-size means (2 df at 4 sizes), Holm-adjusted across the comparators; the
    shape-free test is statsmodels' Welch ANOVA, and a flat difference is inconclusive there."""
    from attent.analysis.time_to_accuracy.data_size_trend import (
        CURVED,
        DIFFERS,
        NO_DEPARTURE,
        size_trends,
        trend_markdown,
    )
    from statsmodels.formula.api import ols
    from statsmodels.stats.anova import anova_lm
    from statsmodels.stats.multitest import multipletests

    sizes = {"fm-600": 600, "fm-2000": 2000, "fm-6000": 6000, "fm-20000": 20000}
    noise = [-0.003, 0.0, 0.003]
    line = {size: [0.01 * np.log10(size / 600) + e for e in noise] for size in sizes.values()}
    v_shape = {600: noise, 2000: [-0.04 + e for e in noise], 6000: [-0.04 - e for e in noise], 20000: noise}
    runs = runs_with_differences({"random": line, "full": v_shape})
    trends = size_trends(runs, sizes, lower=False).set_index("comparator")
    assert (
        trends.loc["full", "lack_of_fit_verdict"] == CURVED
        and trends.loc["random", "lack_of_fit_verdict"] == NO_DEPARTURE
    )
    finals = runs.pivot_table(index=["workload", "seed"], columns="method", values="final_metric")
    frame = pd.DataFrame({"x": np.log10([sizes[w] for w in finals.index.get_level_values("workload")])})
    expected = {}
    for method in ("random", "full"):
        frame["d"] = (finals["attent"] - finals[method]).to_numpy()
        table = anova_lm(ols("d ~ x", frame).fit(), ols("d ~ C(x)", frame).fit())
        assert table["df_diff"].iloc[1] == 2
        expected[method] = table["Pr(>F)"].iloc[1]
        assert trends.loc[method, "lack_of_fit_p"] == pytest.approx(expected[method])
    adjusted = multipletests([expected["random"], expected["full"]], method="holm")[1]
    assert list(trends.loc[["random", "full"], "lack_of_fit_p_holm"]) == pytest.approx(list(adjusted))
    assert CURVED in trend_markdown(trends.reset_index())
    # any shape: Welch's one-way ANOVA across the sizes, as statsmodels' anova_oneway gives it
    from statsmodels.stats.oneway import anova_oneway

    for method in ("random", "full"):
        d = (finals["attent"] - finals[method]).to_numpy()
        welch = anova_oneway(d, groups=frame["x"].to_numpy(), use_var="unequal").pvalue
        assert trends.loc[method, "across_sizes_p"] == pytest.approx(welch)
    assert trends.loc["full", "across_sizes_verdict"] == DIFFERS
    flat = {size: [0.01, -0.01, 0.0] for size in sizes.values()}
    assert (
        size_trends(runs_with_differences({"random": flat}), sizes, lower=False).iloc[0]["across_sizes_verdict"]
        == "inconclusive"
    )
    # two sizes: a line through them cannot be tested
    two = size_trends(runs[runs["workload"].isin(["fm-600", "fm-20000"])], sizes, lower=False)
    assert two["lack_of_fit_p"].isna().all() and "fewer than 3 sizes" in trend_markdown(two)


def test_a_size_measured_in_a_store_of_its_own_joins_by_its_saved_sizes():
    """A fourth size from another benchmark (its size saved beside its per_run.csv): the
    6,000-image row comes out as its own report saved it (6 seeds, Holm over its 4 comparisons),
    and the trend runs over the four sizes' 18 paired seeds."""
    sources = saved("data_size", "data_size/fmnist-20000", "data_size_20000_seeds", "data_size_6000")
    sizes = {w: s for source in sources for w, s in source.sizes.items()}
    table, trends, _ = judge_joined(joined_runs(sources), sizes)
    row = table.set_index("size").loc[6000]
    expected = pd.read_csv(RESULTS / "data_size_6000" / "data_size" / "data_size.csv").iloc[0]
    assert row["seeds"] == 6 and row["plateau_seeds"] == 6
    for method in ("random", "full", "full_equal_cost"):
        key = f"final_vs_{method}"
        assert (row[key], row[f"{key}_low"], row[f"{key}_high"]) == pytest.approx(
            (expected[key], expected[f"{key}_low"], expected[f"{key}_high"])
        )
        assert row[f"{key}_verdict"] == expected[f"{key}_verdict"]
    assert list(trends["sizes"]) == [4] * 3 and list(trends["points"]) == [18] * 3


HEADLINE = [
    "data_size/per_run.csv",
    "data_size_small_seeds/per_run.csv",
    "data_size_6000/per_run.csv",
    "data_size/fmnist-20000/per_run.csv",
    "data_size_20000_seeds/per_run.csv",
    "data_size_plateau/per_run.csv",
    "data_size_plateau/fmnist-20000/per_run.csv",
]


def test_the_headline_size_table_is_one_attent_report_over_the_saved_tables(tmp_path):
    """docs/findings' headline: four sizes, 6 seeds each, AtteNT against Random, full data and full
    data at equal measured cost (the joined rows saved in data_size/data_size.md), and the plateau
    over the seeds its control ran (data_size_plateau/: 10, 10, 6 and 6 seeds), from one command; more
    seeds of full data run again for the plateau pair with their own control only."""
    from attent.cli.main import main as cli

    argv = ["report", "--out", str(tmp_path)]
    for path in HEADLINE:
        argv += ["--with", str(RESULTS / path)]
    assert cli(argv) == 0
    table = pd.read_csv(tmp_path / "joined" / "data_size.csv").set_index("size")
    assert list(table.index) == [600, 2000, 6000, 20000] and list(table["seeds"]) == [6] * 4
    assert list(table["plateau"]) == ["undetermined", "plateaued", "plateaued", "plateaued"]
    assert list(table["plateau_seeds"]) == [10, 10, 6, 6]
    headline = {
        600: (-0.0034, -0.0295, -0.0263),
        2000: (-0.0071, -0.0425, -0.0385),
        6000: (-0.0031, -0.0366, -0.0200),
        20000: (+0.0070, -0.0143, -0.0063),
    }
    for size, differences in headline.items():
        row = table.loc[size]
        assert [round(row[f"final_vs_{m}"], 4) for m in ("random", "full", "full_equal_cost")] == list(differences)
    assert list(table["final_vs_full_verdict"]) == ["worse"] * 4
    assert list(table["final_vs_full_equal_cost_verdict"]) == ["inconclusive", "worse", "worse", "inconclusive"]
    assert [round(v, 2) for v in table["realized_saving"]] == [0.37, 0.38, 0.36, 0.35]
    trends = pd.read_csv(tmp_path / "joined" / "data_size_trend.csv").set_index("comparator")
    assert trends.loc["full_equal_cost", "verdict"] == "AtteNT gains with size"
    assert round(trends.loc["full", "lack_of_fit_p_holm"], 4) == 0.0137
