"""Result tables in the paper's layouts, built from the runs frame of ``attent.analysis.runs``.

Every table is the same core: give each run a layout row key (display strings) and list the
rows the layout expects (rows nobody ran stay in the table with ``—`` cells, so partial sweeps
render). Each layout row is then split by run identity (``attent.identity``): runs that differ
in more than the seed are never averaged together, and the config fields that tell them apart
label the row. Per row: the mean ± std over seeds (ddof=1, pandas' default) and the run count n;
the method's cost (training + scoring + selection seconds; evaluation, checkpointing and start-up
apart) against the full-data row trained in the same context, as the realized saving beside the
ideal saving the back-propagated samples promise; the mean selected ratio, flagged where a
method trained on another budget than AtteNT; and the best value per column marked.

The plateau control (``plateau_controls``: full data for twice the epochs of the other runs) is
no row of a table: ``attent.analysis.table_verdicts`` reads it for the table's regime verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product

import pandas as pd

from attent.analysis.runs import (EPOCHS, IDENTITY, INTERVAL_SCHEDULE, LABEL, METHOD,
                           METHOD_NAMES, MISSING, RATIO_KIND, RATIO_SCHEDULE, RATIO_START,
                           SHORT_PREFIX, STRATEGY, STRATEGY_NAMES, config_details, label_names,
                           downstream_metrics, is_full, metric, param,
                           varying_fields)
from attent import contract
from attent.contract import lower_is_better

COST = contract.TIME_METHOD  # the time column: training + scoring + selection
EVAL_TIME = contract.time_metric("eval")
RUN_METRICS = (COST, EVAL_TIME, contract.MEAN_SELECTED_RATIO, contract.SAMPLES_BACKPROPAGATED)  # summarized in every table

COST_CHANGE = "cost_change_pct"  # method cost vs the full-data row's, in %
IDEAL_SAVING = "ideal_saving"  # 1 - samples back-propagated / the full-data row's
REALIZED_SAVING = "realized_saving"  # 1 - method cost / the full-data row's
SAVING_RATIO = "realized_over_ideal"
BUDGET_DIFFERS = "budget_differs"
BUDGET_TOLERANCE = 0.02  # relative difference of mean selected ratios still called one budget
BUDGET_MARK = "†"
CONFIG_HEADER = "Config"  # the fields telling apart configurations that share a layout row

BASELINE_NAME = METHOD_NAMES[contract.METHOD_FULL]
PAPER_STRATEGIES = ("random", "hard", "soft")
PAPER_RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)  # below the 100 % full-data row
REDRAWN = ", re-drawn"  # in a cycles interval's label (SelectionConfig.label) when each subset epoch re-draws
RANDOM = "random"  # the Random subset: AtteNT's strategy, and the method tag of runs recorded before issue 46
COMPARISON_METHODS = (contract.METHOD_ATTENT, "class_weight", "group_weight", "gradnorm", "infobatch",
                      RANDOM, contract.METHOD_FULL)
SCHEDULE_KINDS = ("fixed", "incremental", "cosine")

Row = tuple[str, ...]


@dataclass(frozen=True)
class Table:
    name: str  # file stem, e.g. "ablation" or "ablation_vision"
    title: str
    labels: pd.DataFrame  # one display column per row key, plus Config where rows split
    stats: pd.DataFrame  # n, <metric>_mean/_std (RUN_METRICS and metrics), savings, budget flag
    metrics: list[str]  # downstream metrics, best marked
    baseline_rows: list[int]  # positions of the full-data rows
    notes: list[str] = field(default_factory=list)  # footnotes, e.g. the budget flag's
    # The runs summarized, each with its table ``row``: what the verdicts pair seed by seed.
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Filled in by analysis.table_verdicts: the metric judged (its 95 % seed interval in stats as
    # <metric>_low / _high), the words per row (one column per reference: "vs full data", ...)
    # and the comparisons behind them (tta_results.Paired).
    judged: str | None = None
    words: pd.DataFrame = field(default_factory=pd.DataFrame)
    comparisons: list = field(default_factory=list)


# --- the generic core ----------------------------------------------------------------------
def layout_positions(keyed: pd.DataFrame, key_headers: list[str], rows: list[Row]) -> pd.Series:
    """Per run, the position of its layout row; runs whose row the layout lacks are left out."""
    position = {row: i for i, row in enumerate(rows)}
    keys = keyed[key_headers].fillna(MISSING).astype(str).itertuples(index=False)
    positions = pd.Series([position.get(tuple(key)) for key in keys], index=keyed.index,
                          dtype=object)
    return positions.dropna().astype(int)


def split_rows(n_layout_rows: int, layout: pd.Series, identity: pd.Series,
               detail: pd.Series) -> pd.DataFrame:
    """The table's rows (``position``, ``identity``, ``detail``): per layout row one per identity
    among its runs (runs without the tag share one), ordered by detail; a layout row that no
    run fills appears once."""
    present = pd.DataFrame({"position": layout, "identity": identity, "detail": detail})
    present = present.drop_duplicates(["position", "identity"])
    empty = pd.DataFrame({"position": sorted(set(range(n_layout_rows)) - set(layout)),
                          "identity": "", "detail": ""})
    rows = pd.concat([present, empty]).astype({"position": int})
    return rows.sort_values(["position", "detail", "identity"]).reset_index(drop=True)


def summarize(runs: pd.DataFrame, row_of_run: pd.Series, n_rows: int,
              metrics: list[str]) -> pd.DataFrame:
    """Per table row: run count n and mean/std (ddof=1) of each final metric (NaN where no run
    logged it)."""
    grouped = runs.reindex(columns=[metric(m) for m in metrics]).groupby(row_of_run)
    stats = pd.DataFrame({"n": grouped.size()})
    for name in metrics:
        values = grouped[metric(name)]
        stats[f"{name}_mean"] = values.mean()
        stats[f"{name}_std"] = values.std(ddof=1)
    stats = stats.reindex(range(n_rows))
    stats["n"] = stats["n"].fillna(0).astype(int)
    return stats


def row_contexts(runs: pd.DataFrame, row_of_run: pd.Series) -> dict[int, tuple]:
    """Per table row, its training context: the values of the fields outside ``selection.``
    that vary in the table (model, dataset, ...). Rows are compared only within a context."""
    context_columns = [c for c in varying_fields(runs) if not c.startswith(param(SHORT_PREFIX))]
    values = runs[context_columns].astype(str)
    first_run = pd.Series(row_of_run.index, index=row_of_run.to_numpy())
    first_run = first_run[~first_run.index.duplicated()]
    return {row: tuple(values.loc[run]) for row, run in first_run.items()}


def matching_baseline(runs: pd.DataFrame, row_of_run: pd.Series, n_rows: int,
                      baseline_rows: list[int]) -> list[int | None]:
    """Per table row, the full-data row to compare with: the one trained in the same context
    (the fields outside ``selection.`` that vary in the table, e.g. model and dataset)."""
    context = row_contexts(runs, row_of_run)
    baseline_of_context: dict[tuple, int] = {}
    for row in baseline_rows:
        if row in context:
            baseline_of_context.setdefault(context[row], row)
    return [baseline_of_context.get(context.get(row)) for row in range(n_rows)]


def compare_with_baseline(stats: pd.DataFrame, baseline_of_row: list[int | None]) -> pd.DataFrame:
    """Cost change and savings of each row against its full-data row (NaN without one). The
    realized/ideal ratio says how much of the sample saving turned into a time saving."""
    def of_baseline(column: str) -> pd.Series:
        return pd.Series([math.nan if b is None else stats.at[b, column] for b in baseline_of_row],
                         index=stats.index, dtype=float)
    cost_ratio = stats[f"{COST}_mean"] / of_baseline(f"{COST}_mean")
    ideal = 1.0 - stats[f"{contract.SAMPLES_BACKPROPAGATED}_mean"] / of_baseline(f"{contract.SAMPLES_BACKPROPAGATED}_mean")
    realized = 1.0 - cost_ratio
    return stats.assign(**{COST_CHANGE: (cost_ratio - 1.0) * 100.0, IDEAL_SAVING: ideal,
                           REALIZED_SAVING: realized,
                           SAVING_RATIO: (realized / ideal).where(ideal.abs() > 1e-9)})


def budget_differs(stats: pd.DataFrame, methods: pd.Series, context: dict[int, tuple]) -> pd.Series:
    """Rows of other methods (not AtteNT, not full data) whose mean selected ratio lies more
    than BUDGET_TOLERANCE (relative) away from every AtteNT row's of the same training context:
    another training budget."""
    ratio = stats[f"{contract.MEAN_SELECTED_RATIO}_mean"]
    attent = [row for row in stats.index[methods.eq(contract.METHOD_ATTENT)] if ratio[row] == ratio[row]]

    def differs(row: int) -> bool:
        references = [ratio[a] for a in attent if context.get(a) == context.get(row)]
        return bool(references) and min(abs(ratio[row] / r - 1.0) for r in references) > BUDGET_TOLERANCE
    others = methods.notna() & ~methods.isin([contract.METHOD_ATTENT, contract.METHOD_FULL])
    return others & pd.Series([differs(row) for row in stats.index], index=stats.index)


def budget_notes(stats: pd.DataFrame, methods: pd.Series) -> list[str]:
    if not stats[BUDGET_DIFFERS].any():
        return []
    references = ", ".join(f"{r:.3f}" for r in
                           stats.loc[methods.eq(contract.METHOD_ATTENT), f"{contract.MEAN_SELECTED_RATIO}_mean"].dropna())
    return [f"{BUDGET_MARK} Budget differs: mean selected ratio more than "
            f"{BUDGET_TOLERANCE:.0%} (relative) away from AtteNT's ({references}); "
            "not a same-budget comparison."]


def build_table(name: str, title: str, keyed: pd.DataFrame, key_headers: list[str],
                rows: list[Row], baseline: Row | None, metrics: list[str]) -> Table:
    """Summarize ``keyed`` (runs plus one display column per key header) into ``rows``, each
    split by run identity."""
    keyed = keyed.reset_index(drop=True)
    layout = layout_positions(keyed, key_headers, rows)
    placed = keyed.loc[layout.index]
    identity = placed[IDENTITY].fillna("")
    table_rows = split_rows(len(rows), layout, identity, config_details(placed, layout))
    row_index = pd.MultiIndex.from_frame(table_rows[["position", "identity"]])
    row_of_run = pd.Series(row_index.get_indexer(pd.MultiIndex.from_arrays([layout, identity])),
                           index=placed.index)
    n_rows = len(table_rows)
    stats = summarize(placed, row_of_run, n_rows, [*RUN_METRICS, *metrics])
    baseline_position = rows.index(baseline) if baseline in rows else None
    baseline_rows = table_rows.index[table_rows["position"].eq(baseline_position)].tolist()
    stats = compare_with_baseline(
        stats, matching_baseline(placed, row_of_run, n_rows, baseline_rows))
    methods = placed[METHOD].groupby(row_of_run).first().reindex(range(n_rows))
    stats[BUDGET_DIFFERS] = budget_differs(stats, methods, row_contexts(placed, row_of_run))
    labels = pd.DataFrame([rows[p] for p in table_rows["position"]], columns=key_headers)
    if table_rows["detail"].ne("").any():
        labels[CONFIG_HEADER] = table_rows["detail"].tolist()
    return Table(name, title, labels, stats, metrics, baseline_rows, budget_notes(stats, methods),
                 runs=placed.assign(row=row_of_run))


def best_rows(table: Table, metric_name: str) -> pd.Series:
    """Rows holding the best mean of ``metric_name`` (ties all marked); none if nobody logged it."""
    means = table.stats[f"{metric_name}_mean"]
    best = means.min() if lower_is_better(metric_name) else means.max()
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


# --- the plateau control -------------------------------------------------------------------
def plateau_controls(runs: pd.DataFrame) -> pd.Series:
    """Per run, whether it is the plateau control: full data trained for twice the epochs
    (``train.epochs``) of the table's other runs, the selection runs (or, with none, of the
    shortest full-data runs), at an epoch count no selection run has. Keyed on the epochs
    rather than a label or tag, so a sweep needs only the trial ``{selection.method: full,
    train.epochs: 2E}``; runs that logged no epochs are never the control."""
    epochs = pd.to_numeric(runs.get(EPOCHS, pd.Series(index=runs.index, dtype=float)), errors="coerce")
    full = is_full(runs)
    selection_epochs = set(epochs[~full].dropna())
    table_epochs = selection_epochs or set(epochs[full].dropna().nsmallest(1))
    doubled = {2 * e for e in table_epochs} - selection_epochs
    return full & epochs.isin(doubled)


# --- the paper's layouts -------------------------------------------------------------------
def ablation_table(runs: pd.DataFrame, name: str = "ablation") -> Table:
    """Table 3: ratio schedule x interval schedule x strategy, plus the no-selection row."""
    headers = ["Ratio schedule", "Interval schedule", "Strategy"]
    attent = runs[runs[METHOD].eq(contract.METHOD_ATTENT)]
    baseline: Row = (MISSING, MISSING, BASELINE_NAME)
    keyed = pd.concat([
        runs[is_full(runs)].assign(**dict(zip(headers, baseline))),
        attent.assign(**{headers[0]: attent[RATIO_SCHEDULE], headers[1]: attent[INTERVAL_SCHEDULE],
                         headers[2]: attent[STRATEGY].map(strategy_label)})])
    strategies = unique_in_order(attent[STRATEGY], PAPER_STRATEGIES)
    # Under the cycles reading an interval's label says whether its strategy re-draws at every
    # subset epoch (Soft by default): one row per interval and strategy, under the label it ran.
    ran = set(zip(keyed[headers[1]], keyed[headers[2]]))
    grid = [(ratio, next((i for i in same if (i, label) in ran), same[0]), label)
            for ratio, same, label in product(schedule_order(attent[RATIO_SCHEDULE]),
                                              redraw_groups(schedule_order(attent[INTERVAL_SCHEDULE])),
                                              [strategy_label(s) for s in strategies])]
    return build_table(name, "Ablation: ratio schedule × interval schedule × strategy",
                       keyed, headers, [baseline, *grid], baseline, downstream_metrics(keyed))


def redraw_groups(intervals: list[str]) -> list[list[str]]:
    """Interval labels grouped by the schedule they name, with and without ", re-drawn"."""
    groups: dict[str, list[str]] = {}
    for label in intervals:
        groups.setdefault(str(label).replace(REDRAWN, ""), []).append(label)
    return list(groups.values())


def ratio_table(runs: pd.DataFrame, name: str = "ratio") -> Table:
    """Table 5: fixed sample ratios 100 % (full data), 90 %, ..., 40 %."""
    headers = ["Sample ratio", "Strategy", "Interval schedule"]
    fixed = runs[runs[METHOD].eq(contract.METHOD_ATTENT) & runs[RATIO_KIND].eq("fixed")]
    baseline: Row = (f"100% ({BASELINE_NAME.lower()})", MISSING, MISSING)
    keyed = pd.concat([
        runs[is_full(runs)].assign(**dict(zip(headers, baseline))),
        fixed.assign(**{headers[0]: fixed[RATIO_START].map(percent, na_action="ignore"),
                        headers[1]: fixed[STRATEGY].map(strategy_label),
                        headers[2]: fixed[INTERVAL_SCHEDULE]})])
    ratios = sorted(set(PAPER_RATIOS) | set(fixed[RATIO_START].dropna()), reverse=True)
    grid = product([percent(r) for r in ratios],
                   [strategy_label(s) for s in unique_in_order(fixed[STRATEGY])] or [MISSING],
                   schedule_order(fixed[INTERVAL_SCHEDULE]))
    return build_table(name, "Fixed sample ratio", keyed, headers, [baseline, *grid], baseline,
                       downstream_metrics(keyed))


def random_strategy(runs: pd.DataFrame) -> pd.Series:
    """Runs of AtteNT's Random strategy (``selection.strategy: random``). Beside other methods they
    are the comparison's Random subset, as the runs recorded under the deprecated
    ``selection.method: random`` (tagged ``attent.method: random``) are."""
    return runs[METHOD].eq(contract.METHOD_ATTENT) & runs[STRATEGY].eq(RANDOM)


def comparison_table(runs: pd.DataFrame, name: str = "comparison") -> Table:
    """Table 6: AtteNT vs the other sample-selection and reweighting methods."""
    runs = runs.assign(**{METHOD: runs[METHOD].mask(random_strategy(runs), RANDOM)})
    keyed = runs.assign(Method=method_names(runs))
    rows: list[Row] = []
    for method in unique_in_order(runs[METHOD], COMPARISON_METHODS):
        present = keyed.loc[runs[METHOD].eq(method), "Method"]
        rows.extend((n,) for n in sorted(set(present)) or [METHOD_NAMES.get(method, method)])
    return build_table(name, "Comparison with other methods", keyed, ["Method"], rows,
                       (BASELINE_NAME,), downstream_metrics(keyed))


def with_without_table(runs: pd.DataFrame, name: str = "with_without") -> Table:
    """Tables 1/2: training with vs without AtteNT."""
    without = "w/o AtteNT"
    runs = runs[runs[METHOD].isin([contract.METHOD_ATTENT, contract.METHOD_FULL])]
    keyed = runs.assign(Setting=("w/ " + method_names(runs)).where(~is_full(runs), without))
    attent_rows = sorted(set(keyed.loc[runs[METHOD].eq(contract.METHOD_ATTENT), "Setting"]))
    rows = [(without,), *((setting,) for setting in attent_rows or ["w/ AtteNT"])]
    return build_table(name, "With vs without AtteNT", keyed, ["Setting"], rows, (without,),
                       downstream_metrics(keyed))


def summary_table(runs: pd.DataFrame, name: str = "summary") -> Table:
    """Fallback when no paper layout fits: one row per configuration."""
    keyed = runs.assign(Configuration=label_names(runs))  # configs sharing a label: split later
    baseline_names = sorted(set(keyed.loc[is_full(runs), "Configuration"]))
    rows = [*baseline_names, *sorted(set(keyed["Configuration"]) - set(baseline_names))]
    baseline = (baseline_names[0],) if baseline_names else None
    return build_table(name, "All configurations", keyed, ["Configuration"],
                       [(r,) for r in rows], baseline, downstream_metrics(keyed))


TABLE_BUILDERS = {"ablation": ablation_table, "ratio": ratio_table,
                  "comparison": comparison_table, "with_without": with_without_table,
                  "summary": summary_table}


def applicable_kinds(runs: pd.DataFrame) -> list[str]:
    """The layouts the runs present fill; ``summary`` when none does."""
    methods = set(runs[METHOD].dropna())
    compared = bool(methods - {contract.METHOD_ATTENT, contract.METHOD_FULL})
    # beside other methods, AtteNT's Random strategy is the comparison's Random subset, no ablation row
    attent = runs[runs[METHOD].eq(contract.METHOD_ATTENT) & ~(random_strategy(runs) & compared)]
    schedule_configs = pd.DataFrame({"ratio": attent[RATIO_SCHEDULE].map(schedule_kind),
                                     "interval": attent[INTERVAL_SCHEDULE],
                                     "strategy": attent[STRATEGY]}).astype(object).fillna(MISSING)
    fixed_ratios = set(attent.loc[attent[RATIO_KIND].eq("fixed"), RATIO_START].dropna())
    kinds = [kind for kind, applies in [
        ("ablation", len(schedule_configs.drop_duplicates()) >= 2),
        ("ratio", len(fixed_ratios) >= 2),
        ("comparison", compared),
        ("with_without", methods == {contract.METHOD_ATTENT, contract.METHOD_FULL} and attent[LABEL].nunique() <= 1),
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
