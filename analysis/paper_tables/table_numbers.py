"""A paper table's numbers, whatever its layout: the ``Table`` and ``build_table``, which
``layouts`` fills with the rows each of the paper's tables expects.

Every table is the same core: give each run a layout row key (display strings) and list the
rows the layout expects (rows nobody ran stay in the table with ``—`` cells, so partial sweeps
render). Each layout row is then split by run identity (``attent.identity``): runs that differ
in more than the seed are never averaged together, and the config fields that tell them apart
label the row. Per row: the mean ± std over seeds (ddof=1, pandas' default) and the run count n;
the method's cost (training + scoring + selection seconds; evaluation, checkpointing and start-up
apart) against the full-data row trained in the same context, as the realized saving beside the
ideal saving the back-propagated samples promise; the mean selected ratio, flagged where a
method trained on another budget than AtteNT; and the best value per column marked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
from attent import contract
from attent.analysis.cell_format import MISSING
from attent.analysis.mlflow_runs import IDENTITY, METHOD, metric, param
from attent.analysis.paper_tables.experiment_runs import SHORT_PREFIX, config_details, varying_fields
from attent.contract import lower_is_better

COST = contract.TIME_METHOD  # the time column: training + scoring + selection
EVAL_TIME = contract.time_metric("eval")
RUN_METRICS = (
    COST,
    EVAL_TIME,
    contract.MEAN_SELECTED_RATIO,
    contract.SAMPLES_BACKPROPAGATED,
)  # summarized in every table

COST_CHANGE = "cost_change_pct"  # method cost vs the full-data row's, in %
IDEAL_SAVING = "ideal_saving"  # 1 - samples back-propagated / the full-data row's
REALIZED_SAVING = "realized_saving"  # 1 - method cost / the full-data row's
SAVING_RATIO = "realized_over_ideal"
BUDGET_DIFFERS = "budget_differs"
BUDGET_TOLERANCE = 0.02  # relative difference of mean selected ratios still called one budget
BUDGET_MARK = "†"
CONFIG_HEADER = "Config"  # the fields telling apart configurations that share a layout row

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
    # Filled in by verdicts.judge_table: the metric judged (its 95 % seed interval in stats as
    # <metric>_low / _high), the verdicts per row (one column per reference: "vs full data", ...)
    # and the comparisons behind them (stats.Paired).
    judged: str | None = None
    verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)
    comparisons: list = field(default_factory=list)


def layout_positions(keyed: pd.DataFrame, key_headers: list[str], rows: list[Row]) -> pd.Series:
    """Per run, the position of its layout row; runs whose row the layout lacks are left out."""
    position = {row: i for i, row in enumerate(rows)}
    keys = keyed[key_headers].fillna(MISSING).astype(str).itertuples(index=False)
    positions = pd.Series([position.get(tuple(key)) for key in keys], index=keyed.index, dtype=object)
    return positions.dropna().astype(int)


def split_rows(n_layout_rows: int, layout: pd.Series, identity: pd.Series, detail: pd.Series) -> pd.DataFrame:
    """The table's rows (``position``, ``identity``, ``detail``): per layout row one per identity
    among its runs (runs without the tag share one), ordered by detail; a layout row that no
    run fills appears once."""
    present = pd.DataFrame({"position": layout, "identity": identity, "detail": detail})
    present = present.drop_duplicates(["position", "identity"])
    empty = pd.DataFrame({"position": sorted(set(range(n_layout_rows)) - set(layout)), "identity": "", "detail": ""})
    rows = pd.concat([present, empty]).astype({"position": int})
    return rows.sort_values(["position", "detail", "identity"]).reset_index(drop=True)


def summarize(runs: pd.DataFrame, row_of_run: pd.Series, n_rows: int, metrics: list[str]) -> pd.DataFrame:
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


def matching_baseline(
    runs: pd.DataFrame, row_of_run: pd.Series, n_rows: int, baseline_rows: list[int]
) -> list[int | None]:
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
        return pd.Series(
            [math.nan if b is None else stats.at[b, column] for b in baseline_of_row], index=stats.index, dtype=float
        )

    cost_ratio = stats[f"{COST}_mean"] / of_baseline(f"{COST}_mean")
    ideal = 1.0 - stats[f"{contract.SAMPLES_BACKPROPAGATED}_mean"] / of_baseline(
        f"{contract.SAMPLES_BACKPROPAGATED}_mean"
    )
    realized = 1.0 - cost_ratio
    return stats.assign(
        **{
            COST_CHANGE: (cost_ratio - 1.0) * 100.0,
            IDEAL_SAVING: ideal,
            REALIZED_SAVING: realized,
            SAVING_RATIO: (realized / ideal).where(ideal.abs() > 1e-9),
        }
    )


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
    references = ", ".join(
        f"{r:.3f}"
        for r in stats.loc[methods.eq(contract.METHOD_ATTENT), f"{contract.MEAN_SELECTED_RATIO}_mean"].dropna()
    )
    return [
        f"{BUDGET_MARK} Budget differs: mean selected ratio more than "
        f"{BUDGET_TOLERANCE:.0%} (relative) away from AtteNT's ({references}); "
        "not a same-budget comparison."
    ]


def build_table(
    name: str,
    title: str,
    keyed: pd.DataFrame,
    key_headers: list[str],
    rows: list[Row],
    baseline: Row | None,
    metrics: list[str],
) -> Table:
    """Summarize ``keyed`` (runs plus one display column per key header) into ``rows``, each
    split by run identity."""
    keyed = keyed.reset_index(drop=True)
    layout = layout_positions(keyed, key_headers, rows)
    placed = keyed.loc[layout.index]
    identity = placed[IDENTITY].fillna("")
    table_rows = split_rows(len(rows), layout, identity, config_details(placed, layout))
    row_index = pd.MultiIndex.from_frame(table_rows[["position", "identity"]])
    row_of_run = pd.Series(row_index.get_indexer(pd.MultiIndex.from_arrays([layout, identity])), index=placed.index)
    n_rows = len(table_rows)
    stats = summarize(placed, row_of_run, n_rows, [*RUN_METRICS, *metrics])
    baseline_position = rows.index(baseline) if baseline in rows else None
    baseline_rows = table_rows.index[table_rows["position"].eq(baseline_position)].tolist()
    stats = compare_with_baseline(stats, matching_baseline(placed, row_of_run, n_rows, baseline_rows))
    methods = placed[METHOD].groupby(row_of_run).first().reindex(range(n_rows))
    stats[BUDGET_DIFFERS] = budget_differs(stats, methods, row_contexts(placed, row_of_run))
    labels = pd.DataFrame([rows[p] for p in table_rows["position"]], columns=key_headers)
    if table_rows["detail"].ne("").any():
        labels[CONFIG_HEADER] = table_rows["detail"].tolist()
    return Table(
        name,
        title,
        labels,
        stats,
        metrics,
        baseline_rows,
        budget_notes(stats, methods),
        runs=placed.assign(row=row_of_run),
    )


def best_rows(table: Table, metric_name: str) -> pd.Series:
    """Rows holding the best mean of ``metric_name`` (ties all marked); none if nobody logged it."""
    means = table.stats[f"{metric_name}_mean"]
    best = means.min() if lower_is_better(metric_name) else means.max()
    return means.eq(best) & means.notna()
