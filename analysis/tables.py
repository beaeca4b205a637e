"""Result tables in the paper's layouts, built from the runs frame of ``analysis.runs``.

Every table is the same core: give each run a row key (display strings), list the rows the
layout expects (rows nobody ran stay in the table with ``—`` cells, so partial sweeps render),
then per row the mean ± std over seeds (ddof=1, pandas' default), the run count n, the wall-clock
time change vs the full-data baseline row, and the best value per column marked.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

import pandas as pd

from analysis.runs import (INTERVAL_SCHEDULE, LABEL, METHOD, METHOD_NAMES, MISSING, RATIO_KIND,
                           RATIO_SCHEDULE, RATIO_VALUE, STRATEGY, STRATEGY_NAMES, config_names,
                           downstream_metrics, is_full, lower_is_better)

TIME_METRIC = "time_total_s"
CHANGE = "time_change_pct"
BASELINE_NAME = "Full data"
PAPER_STRATEGIES = ("random", "hard", "soft")
PAPER_RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)  # below the 100 % full-data row
COMPARISON_METHODS = ("attent", "class_weight", "group_weight", "gradnorm", "infobatch",
                      "random", "full")
SCHEDULE_KINDS = ("fixed", "incremental", "cosine")

Row = tuple[str, ...]


@dataclass(frozen=True)
class Table:
    name: str  # file stem, e.g. "ablation" or "ablation_vision"
    title: str
    labels: pd.DataFrame  # one display column per row key
    stats: pd.DataFrame  # n, <metric>_mean, <metric>_std per metric, time_change_pct
    metrics: list[str]  # time first, then downstream metrics
    baseline: int | None  # position of the full-data row, if the layout has one


# --- the generic core ----------------------------------------------------------------------
def summarize(runs: pd.DataFrame, row_of_run: pd.Series, n_rows: int,
              metrics: list[str]) -> pd.DataFrame:
    """Per row position: run count n and mean/std (ddof=1) of each final metric. Runs whose
    row is not in the layout (``row_of_run`` NaN) are left out."""
    placed = row_of_run.dropna().astype(int)
    grouped = runs.loc[placed.index].groupby(placed)
    stats = pd.DataFrame({"n": grouped.size()})
    for metric in metrics:
        values = grouped[f"metrics.{metric}"]
        stats[f"{metric}_mean"] = values.mean()
        stats[f"{metric}_std"] = values.std(ddof=1)
    stats = stats.reindex(range(n_rows))
    stats["n"] = stats["n"].fillna(0).astype(int)
    return stats


def time_change_pct(stats: pd.DataFrame, baseline: int | None) -> pd.Series:
    """Mean time vs the baseline row's mean time, in % (negative = faster)."""
    time = stats[f"{TIME_METRIC}_mean"]
    if baseline is None:
        return pd.Series(math.nan, index=stats.index)
    return (time / time.iloc[baseline] - 1.0) * 100.0


def build_table(name: str, title: str, keyed: pd.DataFrame, key_headers: list[str],
                rows: list[Row], baseline: Row | None, metrics: list[str]) -> Table:
    """Summarize ``keyed`` (runs plus one display column per key header) into ``rows``."""
    position = {row: i for i, row in enumerate(rows)}
    key_values = keyed[key_headers].fillna(MISSING).astype(str).itertuples(index=False)
    row_keys = pd.Series([tuple(key) for key in key_values], index=keyed.index, dtype=object)
    stats = summarize(keyed, row_keys.map(position), len(rows), metrics)
    baseline_position = position.get(baseline) if baseline is not None else None
    stats[CHANGE] = time_change_pct(stats, baseline_position)
    labels = pd.DataFrame(rows, columns=key_headers)
    return Table(name, title, labels, stats, metrics, baseline_position)


def best_rows(table: Table, metric: str) -> pd.Series:
    """Rows holding the best mean of ``metric`` (ties all marked); none if nobody logged it."""
    means = table.stats[f"{metric}_mean"]
    best = means.min() if lower_is_better(metric) else means.max()
    return means.eq(best) & means.notna()


def unique_in_order(values: pd.Series, order: tuple[str, ...] = ()) -> list[str]:
    """``order`` first (all of it: the paper's grid), then the other values present, sorted."""
    present = sorted(set(values.dropna().astype(str)) - set(order))
    return [*order, *present]


def schedule_kind(schedule: object) -> object:
    """``cosine(0.2→0.8)`` -> ``cosine``; missing stays missing."""
    return schedule.split("(")[0] if isinstance(schedule, str) else schedule


def schedule_order(schedules: pd.Series) -> list[str]:
    """Schedules present, by kind as in the paper (fixed, incremental, cosine), then by text."""
    def sort_key(schedule: str) -> tuple[int, str]:
        kind = schedule_kind(schedule)
        return (SCHEDULE_KINDS.index(kind) if kind in SCHEDULE_KINDS else len(SCHEDULE_KINDS),
                schedule)
    return sorted(set(schedules.dropna().astype(str)), key=sort_key) or [MISSING]


def table_metrics(runs: pd.DataFrame) -> list[str]:
    return [TIME_METRIC, *downstream_metrics(runs)]


# --- the paper's layouts -------------------------------------------------------------------
def ablation_table(runs: pd.DataFrame, name: str = "ablation") -> Table:
    """Table 3: ratio schedule x interval schedule x strategy, plus the no-selection row."""
    headers = ["Ratio schedule", "Interval schedule", "Strategy"]
    attent = runs[runs[METHOD].eq("attent")]
    baseline: Row = (MISSING, MISSING, BASELINE_NAME)
    keyed = pd.concat([
        runs[is_full(runs)].assign(**dict(zip(headers, baseline))),
        attent.assign(**{headers[0]: attent[RATIO_SCHEDULE], headers[1]: attent[INTERVAL_SCHEDULE],
                         headers[2]: attent[STRATEGY].map(strategy_label)})])
    strategies = unique_in_order(attent[STRATEGY], PAPER_STRATEGIES)
    grid = product(schedule_order(attent[RATIO_SCHEDULE]),
                   schedule_order(attent[INTERVAL_SCHEDULE]),
                   [strategy_label(s) for s in strategies])
    return build_table(name, "Ablation: ratio schedule × interval schedule × strategy",
                       keyed, headers, [baseline, *grid], baseline, table_metrics(keyed))


def ratio_table(runs: pd.DataFrame, name: str = "ratio") -> Table:
    """Table 5: fixed sample ratios 100 % (full data), 90 %, ..., 40 %."""
    headers = ["Sample ratio", "Strategy", "Interval schedule"]
    fixed = runs[runs[METHOD].eq("attent") & runs[RATIO_KIND].eq("fixed")]
    baseline: Row = (f"100% ({BASELINE_NAME.lower()})", MISSING, MISSING)
    keyed = pd.concat([
        runs[is_full(runs)].assign(**dict(zip(headers, baseline))),
        fixed.assign(**{headers[0]: fixed[RATIO_VALUE].map(percent, na_action="ignore"),
                        headers[1]: fixed[STRATEGY].map(strategy_label),
                        headers[2]: fixed[INTERVAL_SCHEDULE]})])
    ratios = sorted(set(PAPER_RATIOS) | set(fixed[RATIO_VALUE].dropna()), reverse=True)
    grid = product([percent(r) for r in ratios],
                   [strategy_label(s) for s in unique_in_order(fixed[STRATEGY])] or [MISSING],
                   schedule_order(fixed[INTERVAL_SCHEDULE]))
    return build_table(name, "Fixed sample ratio", keyed, headers, [baseline, *grid], baseline,
                       table_metrics(keyed))


def comparison_table(runs: pd.DataFrame, name: str = "comparison") -> Table:
    """Table 6: AtteNT vs the other sample-selection and reweighting methods."""
    keyed = runs.assign(Method=method_names(runs))
    rows: list[Row] = []
    for method in unique_in_order(runs[METHOD], COMPARISON_METHODS):
        present = keyed.loc[runs[METHOD].eq(method), "Method"]
        rows.extend((n,) for n in sorted(set(present)) or [METHOD_NAMES.get(method, method)])
    return build_table(name, "Comparison with other methods", keyed, ["Method"], rows,
                       (BASELINE_NAME,), table_metrics(keyed))


def with_without_table(runs: pd.DataFrame, name: str = "with_without") -> Table:
    """Tables 1/2: training with vs without AtteNT."""
    without = "w/o AtteNT"
    runs = runs[runs[METHOD].isin(["attent", "full"])]
    keyed = runs.assign(Setting=("w/ " + method_names(runs)).where(~is_full(runs), without))
    attent_rows = sorted(set(keyed.loc[runs[METHOD].eq("attent"), "Setting"])) or ["w/ AtteNT"]
    return build_table(name, "With vs without AtteNT", keyed, ["Setting"],
                       [(without,), *((s,) for s in attent_rows)], (without,), table_metrics(keyed))


def summary_table(runs: pd.DataFrame, name: str = "summary") -> Table:
    """Fallback when no paper layout fits: one row per configuration."""
    keyed = runs.assign(Configuration=config_names(runs))
    baseline_names = sorted(set(keyed.loc[is_full(runs), "Configuration"]))
    rows = [*baseline_names, *sorted(set(keyed["Configuration"]) - set(baseline_names))]
    baseline = (baseline_names[0],) if baseline_names else None
    return build_table(name, "All configurations", keyed, ["Configuration"],
                       [(r,) for r in rows], baseline, table_metrics(keyed))


TABLE_BUILDERS = {"ablation": ablation_table, "ratio": ratio_table,
                  "comparison": comparison_table, "with_without": with_without_table,
                  "summary": summary_table}


def applicable_kinds(runs: pd.DataFrame) -> list[str]:
    """The layouts the runs present fill; ``summary`` when none does."""
    attent = runs[runs[METHOD].eq("attent")]
    methods = set(runs[METHOD].dropna())
    schedule_configs = pd.DataFrame({"ratio": attent[RATIO_SCHEDULE].map(schedule_kind),
                                     "interval": attent[INTERVAL_SCHEDULE],
                                     "strategy": attent[STRATEGY]}).fillna(MISSING)
    fixed_ratios = set(attent.loc[attent[RATIO_KIND].eq("fixed"), RATIO_VALUE].dropna())
    kinds = [kind for kind, applies in [
        ("ablation", len(schedule_configs.drop_duplicates()) >= 2),
        ("ratio", len(fixed_ratios) >= 2),
        ("comparison", bool(methods - {"attent", "full"})),
        ("with_without", methods == {"attent", "full"} and attent[LABEL].nunique() <= 1),
    ] if applies]
    return kinds or ["summary"]


def method_names(runs: pd.DataFrame) -> pd.Series:
    """Method display name, with the config label added where a method ran several configs."""
    names = runs[METHOD].map(METHOD_NAMES).fillna(runs[METHOD]).fillna(MISSING)
    labels_per_method = runs.groupby(METHOD)[LABEL].transform("nunique")
    several = labels_per_method.gt(1) & ~is_full(runs)
    return names.where(~several, names + " (" + runs[LABEL].astype(str) + ")")


def strategy_label(strategy: object) -> object:
    return STRATEGY_NAMES.get(strategy, strategy)


def percent(ratio: float) -> str:
    return f"{ratio:.0%}"


# --- rendering -----------------------------------------------------------------------------
def metric_header(metric: str) -> str:
    return "Time (s)" if metric == TIME_METRIC else metric.removeprefix("eval_")


CHANGE_HEADER = "ΔTime vs full"


def decimals(metric: str, means: pd.Series) -> int:
    """1 decimal for seconds; 4 for fractions like accuracy, 2 for percent-scale values."""
    if metric.startswith("time_"):
        return 1
    return 4 if means.abs().max() < 10 else 2


def stat_cell(mean: float, std: float, places: int) -> str:
    if math.isnan(mean):
        return MISSING
    if math.isnan(std):  # a single seed has no spread
        return f"{mean:.{places}f}"
    return f"{mean:.{places}f} ± {std:.{places}f}"


def change_cell(change: float) -> str:
    return MISSING if math.isnan(change) else f"{change:+.1f}%"


def cell_text(table: Table) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Display strings (labels, n, metrics, time change) and, per cell, whether it is best."""
    stats = table.stats
    cells = table.labels.astype(str)
    cells["n"] = stats["n"].astype(str)
    best = pd.DataFrame(False, index=cells.index, columns=cells.columns)
    for metric in table.metrics:
        header = metric_header(metric)
        places = decimals(metric, stats[f"{metric}_mean"])
        cells[header] = [stat_cell(m, s, places)
                         for m, s in zip(stats[f"{metric}_mean"], stats[f"{metric}_std"])]
        best[header] = best_rows(table, metric)
        if metric == TIME_METRIC:
            cells[CHANGE_HEADER] = stats[CHANGE].map(change_cell)
            best[CHANGE_HEADER] = False
    return cells, best


def to_markdown(table: Table) -> str:
    cells, best = cell_text(table)
    cells = cells.mask(best, cells.map("**{}**".format))
    numeric = [c not in table.labels.columns for c in cells.columns]
    lines = ["| " + " | ".join(cells.columns) + " |",
             "|" + "|".join("---:" if right else ":---" for right in numeric) + "|"]
    lines += ["| " + " | ".join(v.replace("|", "\\|") for v in row) + " |"
              for row in cells.itertuples(index=False)]
    return "\n".join(lines)


LATEX_REPLACEMENTS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                      "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                      "^": r"\textasciicircum{}", "±": r"$\pm$", "→": r"$\rightarrow$",
                      "·": r"$\cdot$", "×": r"$\times$", "Δ": r"$\Delta$", "—": "---"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_REPLACEMENTS.get(ch, ch) for ch in text)


def to_latex(table: Table) -> str:
    cells, best = cell_text(table)
    escaped = cells.map(latex_escape)
    cells = escaped.mask(best, escaped.map(r"\textbf{{{}}}".format))
    align = "".join("l" if c in table.labels.columns else "r" for c in cells.columns)
    body = [" & ".join(row) + r" \\" for row in cells.itertuples(index=False)]
    if table.baseline == 0:  # rule under the reference row, as in the paper
        body.insert(1, r"\midrule")
    return "\n".join([
        r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(table.title)}}}",
        rf"\label{{tab:{table.name}}}", rf"\begin{{tabular}}{{{align}}}", r"\toprule",
        " & ".join(latex_escape(c) for c in cells.columns) + r" \\", r"\midrule", *body,
        r"\bottomrule", r"\end{tabular}", r"\end{table}", ""])


def to_csv(table: Table) -> str:
    """Numbers, not display strings: empty = missing, ``*`` in ``<metric>_best`` = best."""
    frame = table.labels.copy()
    frame["n"] = table.stats["n"]
    for metric in table.metrics:
        frame[f"{metric}_mean"] = table.stats[f"{metric}_mean"]
        frame[f"{metric}_std"] = table.stats[f"{metric}_std"]
        frame[f"{metric}_best"] = best_rows(table, metric).map({True: "*", False: ""})
        if metric == TIME_METRIC:
            frame[CHANGE] = table.stats[CHANGE]
    return frame.to_csv(index=False, float_format="%.10g")  # 10 digits hide float noise
