"""A table's files: the Markdown, LaTeX and CSV text of a ``table_numbers.Table``, best values marked,
from its cells (``cell_format``'s numbers, the selected ratio and the budget mark); where
``verdicts`` judged it, the judged metric's seed interval and the verdicts.
"""

from __future__ import annotations

import math

import pandas as pd
from attent import contract
from attent.analysis.cell_format import MISSING, change_cell, interval_cell, percent_cell, ratio_cell, stat_cell
from attent.analysis.paper_tables.table_numbers import (
    BUDGET_DIFFERS,
    BUDGET_MARK,
    COST,
    COST_CHANGE,
    EVAL_TIME,
    IDEAL_SAVING,
    REALIZED_SAVING,
    SAVING_RATIO,
    Table,
    best_rows,
)

COST_HEADER = "Method cost (s)"
EVAL_HEADER = "Eval (s)"
SELECTED_HEADER = "Selected ratio"


def metric_header(metric_name: str) -> str:
    """``eval_accuracy`` -> ``accuracy``; a downstream job's ``downstream.semseg.miou`` ->
    ``semseg miou``."""
    if metric_name.startswith(contract.DOWNSTREAM_PREFIX):
        return " ".join(metric_name.removeprefix(contract.DOWNSTREAM_PREFIX).split(".", 1))
    return metric_name.removeprefix(contract.EVAL_PREFIX)


def decimals(means: pd.Series) -> int:
    """Downstream metrics: 4 decimals for fractions like accuracy, 2 for percent-scale values."""
    return 4 if means.abs().max() < 10 else 2


def stat_cells(stats: pd.DataFrame, metric_name: str, places: int) -> list[str]:
    return [stat_cell(m, s, places) for m, s in zip(stats[f"{metric_name}_mean"], stats[f"{metric_name}_std"])]


def interval_header(metric_name: str) -> str:
    return f"{metric_header(metric_name)} 95% CI"


def selected_cell(ratio: float, differs: bool) -> str:
    if math.isnan(ratio):
        return MISSING
    return f"{ratio:.3f} {BUDGET_MARK}" if differs else f"{ratio:.3f}"


# Columns derived from the comparison with the full-data row: header, stats column, format.
SAVING_COLUMNS = (
    ("Δ cost vs full", COST_CHANGE, change_cell),
    ("Ideal saving", IDEAL_SAVING, percent_cell),
    ("Realized saving", REALIZED_SAVING, percent_cell),
    ("Realized / ideal", SAVING_RATIO, ratio_cell),
)


def cell_text(table: Table) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Display strings (labels, n, cost and savings, selected ratio, evaluation time,
    downstream metrics, the judged metric's seed interval, the verdicts) and, per cell, whether it
    is best."""
    stats = table.stats
    cells = table.labels.astype(str)
    cells["n"] = stats["n"].astype(str)
    cells[COST_HEADER] = stat_cells(stats, COST, 1)
    for header, column, render in SAVING_COLUMNS:
        cells[header] = stats[column].map(render)
    cells[SELECTED_HEADER] = [
        selected_cell(r, bool(d)) for r, d in zip(stats[f"{contract.MEAN_SELECTED_RATIO}_mean"], stats[BUDGET_DIFFERS])
    ]
    cells[EVAL_HEADER] = stat_cells(stats, EVAL_TIME, 1)
    best = pd.DataFrame(False, index=cells.index, columns=cells.columns)
    best[COST_HEADER] = best_rows(table, COST)
    for name in table.metrics:
        header = metric_header(name)
        cells[header] = stat_cells(stats, name, decimals(stats[f"{name}_mean"]))
        best[header] = best_rows(table, name)
    if table.judged:
        places = decimals(stats[f"{table.judged}_mean"])
        cells[interval_header(table.judged)] = [
            interval_cell(low, high, places)
            for low, high in zip(stats[f"{table.judged}_low"], stats[f"{table.judged}_high"])
        ]
    for column in table.verdicts.columns:
        cells[column] = table.verdicts[column]
    return cells, best.reindex(columns=cells.columns, fill_value=False)


def text_columns(table: Table) -> list[str]:
    """The left-aligned columns: labels and verdicts."""
    return [*table.labels.columns, *table.verdicts.columns]


def to_markdown(table: Table) -> str:
    """The table, then its footnotes (if any), each after a blank line."""
    cells, best = cell_text(table)
    cells = cells.mask(best, cells.map("**{}**".format))
    numeric = [c not in text_columns(table) for c in cells.columns]
    lines = [
        "| " + " | ".join(cells.columns) + " |",
        "|" + "|".join("---:" if right else ":---" for right in numeric) + "|",
    ]
    lines += ["| " + " | ".join(v.replace("|", "\\|") for v in row) + " |" for row in cells.itertuples(index=False)]
    notes = [part for note in table.notes for part in ("", note)]  # a paragraph each
    return "\n".join([*lines, *notes])


LATEX_REPLACEMENTS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "→": r"$\rightarrow$",
    "·": r"$\cdot$",
    "×": r"$\times$",
    "Δ": r"$\Delta$",
    "—": "---",
    BUDGET_MARK: r"\dag{}",
}


def latex_escape(text: str) -> str:
    return "".join(LATEX_REPLACEMENTS.get(ch, ch) for ch in text)


def to_latex(table: Table) -> str:
    cells, best = cell_text(table)
    escaped = cells.map(latex_escape)
    cells = escaped.mask(best, escaped.map(r"\textbf{{{}}}".format))
    align = "".join("l" if c in text_columns(table) else "r" for c in cells.columns)
    body = [" & ".join(row) + r" \\" for row in cells.itertuples(index=False)]
    reference = len(table.baseline_rows)
    if reference and table.baseline_rows == list(range(reference)):
        body.insert(reference, r"\midrule")  # rule under the reference rows, as in the paper
    notes = [r"\par\smallskip\footnotesize " + latex_escape(note) for note in table.notes]
    return "\n".join(
        [
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{latex_escape(table.title)}}}",
            rf"\label{{tab:{table.name}}}",
            rf"\begin{{tabular}}{{{align}}}",
            r"\toprule",
            " & ".join(latex_escape(c) for c in cells.columns) + r" \\",
            r"\midrule",
            *body,
            r"\bottomrule",
            r"\end{tabular}",
            *notes,
            r"\end{table}",
            "",
        ]
    )


def to_csv(table: Table) -> str:
    """Numbers, not display strings: empty = missing, ``*`` in ``<metric>_best`` = best and in
    ``budget_differs`` = another budget than AtteNT's; the judged metric's seed interval as
    ``<metric>_low_95`` / ``_high_95``, and the verdicts as they read."""
    stats, frame = table.stats, table.labels.copy()
    frame["n"] = stats["n"]
    mark = {True: "*", False: ""}
    for name in (COST, EVAL_TIME, contract.MEAN_SELECTED_RATIO, contract.SAMPLES_BACKPROPAGATED, *table.metrics):
        frame[f"{name}_mean"] = stats[f"{name}_mean"]
        frame[f"{name}_std"] = stats[f"{name}_std"]
        if name == COST or name in table.metrics:
            frame[f"{name}_best"] = best_rows(table, name).map(mark)
    for _, column, _ in SAVING_COLUMNS:
        frame[column] = stats[column]
    frame[BUDGET_DIFFERS] = stats[BUDGET_DIFFERS].map(mark)
    if table.judged:
        frame[f"{table.judged}_low_95"] = stats[f"{table.judged}_low"]
        frame[f"{table.judged}_high_95"] = stats[f"{table.judged}_high"]
    for column in table.verdicts.columns:
        frame[column] = table.verdicts[column]
    return frame.to_csv(index=False, float_format="%.10g")  # 10 digits hide float noise
