"""The paper tables' regime check, seed intervals and verdicts, from the statistics the
time-to-accuracy report judges with too (``attent.analysis.stats``), so that both reports reach
their verdicts by the same rules:

- **Plateau, by the control.** Per full-data row, the plateau control (``layouts.plateau_controls``:
  full data for 2E epochs, matched on every other config field) minus full data for E, seed by
  seed, final value of the judged metric, against the tolerance (the larger of 0.005 absolute, or
  1 % of the value for a lower-is-better metric, and the seed std of full data's final value):
  ``plateau_of`` and ``target_of``. "plateaued" when the upper end of the 90 % paired interval lies
  below the tolerance, "still improving" when its lower end lies above it, "undetermined"
  otherwise. A table whose full data is not shown to have plateaued says that it may measure the
  training budget rather than the selection; one whose full data is still improving says that it
  does.
- **Seed intervals.** Per row, the 95 % t-interval over seeds of the judged metric's mean.
- **Verdicts.** Each row against the full-data row of its training context and, where the table
  holds methods other than AtteNT and full data (the comparison table), against the AtteNT row
  of its context (a row trained on another budget than AtteNT's is not judged against it),
  paired seed by seed. One family per table (``judge_family``): Holm-adjusted paired t-tests
  give "better" / "worse"; else a Holm-adjusted paired TOST gives "equivalent within ± m"; else
  "inconclusive". A row with one seed gets no verdict.

The judged metric is the table's first higher-is-better metric (accuracy), else its first.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
from attent import contract
from attent.analysis.cell_format import MISSING
from attent.analysis.mlflow_runs import EPOCHS, METHOD, SEED, metric
from attent.analysis.paper_tables.experiment_runs import identity_columns
from attent.analysis.paper_tables.table_files import metric_header
from attent.analysis.paper_tables.table_numbers import (
    BUDGET_DIFFERS,
    BUDGET_MARK,
    CONFIG_HEADER,
    Table,
    matching_baseline,
    row_contexts,
)
from attent.analysis.stats import (
    ALPHA,
    APART,
    CONFIDENCE,
    FINAL,
    PLATEAU_CONFIDENCE,
    PLATEAUED,
    STILL_RISING,
    Paired,
    Plateau,
    Target,
    judge_family,
    numeric,
    plateau_of,
    seed_pair,
    t_test,
    target_of,
)
from attent.contract import lower_is_better

DEFAULT_MARGIN = 0.01  # equivalence margin of a higher-is-better metric (accuracy), unless given
CONTROL_NAME = "2E"  # what the plateau verdict calls the control: "undetermined: no 2E control"
VS_FULL, VS_ATTENT = "vs full data", "vs AtteNT"  # the verdicts' columns
ONE_SEED = "one seed: not judged"
JUDGED = "table row"  # a comparison's budget match (Paired): judged, unlike APART (not on AtteNT's budget)
REFERENCE = "reference"


def judged_metric(table: Table) -> str | None:
    higher = [name for name in table.metrics if not lower_is_better(name)]
    return (higher or table.metrics or [None])[0]


def judge_table(table: Table, controls: pd.DataFrame, margin: float | None = None) -> Table:
    """``table`` with its judged metric's seed intervals (stats ``<metric>_low`` / ``_high``), the
    verdicts per row, the comparisons behind them, and notes (before its own) giving the plateau
    verdict of each full-data row and the rule of the verdicts. ``controls``: the plateau-control
    runs of the table's task; ``margin``: the equivalence margin (default: DEFAULT_MARGIN for a
    higher-is-better metric, none for a lower-is-better one)."""
    name = judged_metric(table)
    if name is None or table.runs.empty:
        return table
    lower = lower_is_better(name)
    if margin is None:
        margin = math.nan if lower else DEFAULT_MARGIN
    finals = table.runs.assign(final_metric=numeric(table.runs, metric(name)))
    stats = table.stats.assign(**seed_intervals(finals, len(table.stats), name))
    plateau_notes = [
        line
        for row in table.baseline_rows
        if stats.loc[row, "n"] > 0
        for line in plateau_lines(table, finals, controls, row, lower, name)
    ]
    if not plateau_notes:
        plateau_notes = [
            "Plateau: undetermined: no full-data row, so nothing shows that the table's "
            "epochs suffice: it may measure the training budget, not the selection."
        ]
    comparisons, verdicts = compare_rows(table, finals, stats, lower, margin)
    notes = [*plateau_notes, verdicts_note(name, comparisons, verdicts, margin), *table.notes]
    return dataclasses.replace(table, stats=stats, judged=name, verdicts=verdicts, comparisons=comparisons, notes=notes)


def seed_intervals(finals: pd.DataFrame, n_rows: int, name: str) -> dict[str, pd.Series]:
    """Per row, the 95 % t-interval over seeds of the mean final value (NaN for one seed)."""
    tests = {row: t_test(group["final_metric"], CONFIDENCE) for row, group in finals.groupby("row")}
    low = pd.Series({row: t.low for row, t in tests.items()}, dtype=float).reindex(range(n_rows))
    high = pd.Series({row: t.high for row, t in tests.items()}, dtype=float).reindex(range(n_rows))
    return {f"{name}_low": low, f"{name}_high": high}


def per_seed(values: pd.Series, runs: pd.DataFrame) -> pd.Series:
    """``final_metric`` by ``seed``: the mean where one config ran a seed twice (a re-run sweep),
    so that pairs are made seed by seed; runs without a seed cannot be paired."""
    return values.groupby(runs[SEED]).mean().rename("final_metric").rename_axis("seed")


# --- the plateau -------------------------------------------------------------------------------
def config_without_epochs(runs: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Per run, its identity params but the epochs: what a control shares with its full data."""
    values = runs.reindex(columns=columns).astype(str)
    return pd.Series([tuple(v) for v in values.itertuples(index=False)], index=runs.index, dtype=object)


def plateau_of_row(
    finals: pd.DataFrame, controls: pd.DataFrame, row: int, lower: bool, name: str
) -> tuple[Plateau, Target, pd.DataFrame]:
    """The plateau verdict of full-data row ``row`` by the controls trained like it but for
    twice the epochs; also its target (whose tolerance the verdict uses) and its runs."""
    full = finals[finals["row"].eq(row)]
    columns = [c for c in identity_columns(full) if c != EPOCHS]
    control = controls[config_without_epochs(controls, columns).isin(set(config_without_epochs(full, columns)))]
    per_run = pd.concat(
        [
            per_seed(full["final_metric"], full).reset_index().assign(method=contract.METHOD_FULL),
            per_seed(numeric(control, metric(name)), control).reset_index().assign(method=contract.METHOD_FULL_LONG),
        ]
    )
    target = target_of(full["final_metric"], lower)
    return plateau_of(per_run, lower, target.tolerance, CONTROL_NAME), target, full


def plateau_lines(
    table: Table, finals: pd.DataFrame, controls: pd.DataFrame, row: int, lower: bool, name: str
) -> list[str]:
    """The plateau verdict of one full-data row, and what it means for the table."""
    if finals.loc[finals["row"].eq(row), "final_metric"].isna().all():
        return [f"Plateau: undetermined: full data logged no final {metric_header(name)}."]
    plateau, target, full = plateau_of_row(finals, controls, row, lower, name)
    epochs = numeric(full, EPOCHS).dropna()
    e, two_e = (f"{epochs.median():g}", f"{2 * epochs.median():g}") if len(epochs) else ("E", "2E")
    config = table.labels[CONFIG_HEADER][row] if CONFIG_HEADER in table.labels else ""
    where = f" ({config})" if config else ""
    if not plateau.control:
        head = f"Plateau{where}: {plateau.verdict} (no full-data run for {two_e} epochs beside the {e}-epoch ones)."
    elif math.isnan(plateau.low):
        head = f"Plateau{where}: {plateau.verdict} (gain {plateau.mean:+.4f})."
    else:
        head = (
            f"Plateau{where}: full data for {two_e} epochs minus for {e}, final {metric_header(name)}, signed "
            f"so that positive is an improvement: {plateau.mean:+.4f}, {PLATEAU_CONFIDENCE:.0%} paired interval "
            f"[{plateau.low:+.4f}, {plateau.high:+.4f}] over {plateau.seeds} seeds, against the tolerance "
            f"{plateau.tolerance:.4f} ({target.rule}): {plateau.verdict}."
        )
    if plateau.verdict == PLATEAUED:
        meaning = (
            f"Twice the epochs gain less than the tolerance: at {e} epochs the rows compare selection, "
            "not training budgets."
        )
    elif plateau.verdict == STILL_RISING:
        meaning = (
            f"Full data was still improving at {e} epochs: this table measures the training budget, not the selection."
        )
    else:
        meaning = (
            f"Nothing shows that full data had plateaued at {e} epochs: the table may measure the "
            "training budget, not the selection."
        )
    return [head, meaning]


# --- the verdicts ------------------------------------------------------------------------------
def row_names(table: Table) -> list[str]:
    """Each row's labels joined, for the comparisons: ``cosine(0.2→0.8) / fixed(1) / Hard``."""
    return [
        " / ".join(v for v in values if v not in ("", MISSING)) or MISSING
        for values in table.labels.astype(str).itertuples(index=False)
    ]


def compare_rows(
    table: Table, finals: pd.DataFrame, stats: pd.DataFrame, lower: bool, margin: float
) -> tuple[list[Paired], pd.DataFrame]:
    """Every row against full data of its context and, where other methods than AtteNT and full
    data are rows, against AtteNT's row of its context; judged as one family. Returns the
    comparisons and the verdict cells (one column per reference)."""
    n_rows, names, n = len(stats), row_names(table), stats["n"]
    baseline_of = matching_baseline(finals, finals["row"], n_rows, table.baseline_rows)
    context = row_contexts(finals, finals["row"])
    method = finals.groupby("row")[METHOD].first().reindex(range(n_rows))
    by_row = {row: per_seed(group["final_metric"], group).to_frame() for row, group in finals.groupby("row")}
    attent_rows = [r for r in range(n_rows) if method[r] == contract.METHOD_ATTENT]
    others = set(method.dropna()) - {contract.METHOD_ATTENT, contract.METHOD_FULL}
    references = {VS_FULL: lambda row: baseline_of[row]}
    if others and attent_rows:

        def attent_of(row: int) -> int | None:
            mine = [a for a in attent_rows if context.get(a) == context.get(row)]
            return mine[0] if len(mine) == 1 and method[row] != contract.METHOD_FULL else None

        references[VS_ATTENT] = attent_of

    pairs: dict[tuple[int, str], Paired] = {}
    for row in range(n_rows):
        for column, reference_of in references.items():
            reference = reference_of(row)
            if n[row] == 0 or reference is None or reference == row:
                continue
            apart = column == VS_ATTENT and bool(stats.loc[row, BUDGET_DIFFERS])
            pairs[row, column] = Paired(
                names[row],
                names[reference],
                APART if apart else JUDGED,
                FINAL,
                *seed_pair(by_row[row], by_row[reference], "final_metric"),
                "lower" if lower else "higher",
                f"another budget than AtteNT's ({BUDGET_MARK})" if apart else "",
            )
    judge_family(list(pairs.values()), margin)

    verdicts = pd.DataFrame(index=range(n_rows))
    for column, reference_of in references.items():
        verdicts[column] = [verdict_cell(row, reference_of(row), n, pairs.get((row, column))) for row in range(n_rows)]
    return list(pairs.values()), verdicts


def verdict_cell(row: int, reference: int | None, n: pd.Series, paired: Paired | None) -> str:
    if n[row] == 0:
        return MISSING
    if reference == row:
        return REFERENCE
    if paired is None:
        return MISSING
    if n[row] < 2 or n[reference] < 2:
        return ONE_SEED
    return f"{paired.verdict} ({paired.mean:+.4f})" if paired.judged else paired.verdict


def verdicts_note(name: str, comparisons: list[Paired], verdicts: pd.DataFrame, margin: float) -> str:
    tested = sum(p.judged for p in comparisons)
    if not tested:
        return (
            "No verdicts: no row has two seeds paired with its reference's (a row with one seed is not judged). "
            "Interval column: the 95 % t-interval over seeds of the row's mean."
        )
    against = "full data of its context" + (" and AtteNT" if VS_ATTENT in verdicts else "")
    equivalence = (
        f'else "equivalent within ± {margin:.4g}" by a paired TOST, Holm-adjusted likewise; '
        if not math.isnan(margin)
        else ""
    )
    undeclared = " (no equivalence margin declared for a lower-is-better metric)" if math.isnan(margin) else ""
    return (
        f"Verdicts (final {metric_header(name)}, each row's against {against}, in brackets the mean paired "
        f"difference): paired t-tests over seeds, Holm-adjusted across the table's {tested} comparisons at "
        f'{ALPHA}, give "better" / "worse"; {equivalence}else "inconclusive"{undeclared}. Rows with one seed '
        "are not judged. Interval column: the 95 % t-interval over seeds of the row's mean."
    )
