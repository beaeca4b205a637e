"""Result tables in the paper's layouts, built from an experiment's runs (``experiment_runs``):
which rows each of the paper's tables expects, each run's row key, and which layouts the runs
fill. ``table_numbers`` turns the keyed runs into a table's numbers (``build_table``).

The plateau control (``plateau_controls``: full data for twice the epochs of the other runs) is
no row of a table: ``verdicts`` reads it for the table's regime verdict.
"""

from __future__ import annotations

from itertools import product

import pandas as pd
from attent import contract
from attent.analysis.cell_format import MISSING
from attent.analysis.mlflow_runs import (
    EPOCHS,
    INTERVAL_FIELDS,
    INTERVAL_KIND,
    INTERVAL_REDRAW,
    INTERVAL_SCHEDULE,
    LABEL,
    METHOD,
    RATIO_KIND,
    RATIO_SCHEDULE,
    RATIO_START,
    STRATEGY,
)
from attent.analysis.paper_tables import TABLE_KINDS
from attent.analysis.paper_tables.experiment_runs import (
    METHOD_NAMES,
    STRATEGY_NAMES,
    downstream_metrics,
    is_full,
    label_names,
)
from attent.analysis.paper_tables.table_numbers import Row, Table, build_table

BASELINE_NAME = METHOD_NAMES[contract.METHOD_FULL]
PAPER_STRATEGIES = ("random", "hard", "soft")
PAPER_RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)  # below the 100 % full-data row
RANDOM = "random"  # AtteNT's Random strategy (selection.strategy: random; tag attent.strategy)
RANDOM_SUBSET = "random_subset"  # the comparison's row of AtteNT's Random strategy runs: a row key, no method tag
ROW_NAMES = {**METHOD_NAMES, RANDOM_SUBSET: "Random subset"}  # the methods' names and that row's
COMPARISON_METHODS = (
    contract.METHOD_ATTENT,
    "class_weight",
    "group_weight",
    "gradnorm",
    "infobatch",
    RANDOM_SUBSET,
    contract.METHOD_FULL,
)
SCHEDULE_KINDS = ("fixed", "incremental", "cosine")


def unique_in_order(values: pd.Series, order: tuple[str, ...] = ()) -> list[str]:
    """``order`` first (all of it: the paper's grid), then the other values present, sorted."""
    present = sorted(set(values.dropna().astype(str)) - set(order))
    return [*order, *present]


def schedule_order(runs: pd.DataFrame, schedule: str, kind: str) -> list[str]:
    """The schedules present, by kind as in the paper (fixed, incremental, cosine; others after), then by text.

    Args:
        runs: The runs, one a row.
        schedule: The column of each run's schedule text (a tag: ``RATIO_SCHEDULE``, ``INTERVAL_SCHEDULE``).
        kind: The column of the schedule's kind, the logged param (``RATIO_KIND``, ``INTERVAL_KIND``).

    Returns:
        The schedule texts, or ``[MISSING]`` where no run names one.
    """
    present = runs[runs[schedule].notna()]
    ranks = {
        str(text): (SCHEDULE_KINDS.index(k) if k in SCHEDULE_KINDS else len(SCHEDULE_KINDS), str(text))
        for text, k in zip(present[schedule], present[kind])
    }
    return sorted(ranks, key=ranks.__getitem__) or [MISSING]


def interval_groups(runs: pd.DataFrame) -> list[list[str]]:
    """The interval schedules the runs name (``schedule_order``), grouped by the interval's
    settings (its params) other than ``redraw``: a cycles interval kept and re-drawn is one group.

    A run that logged no interval settings is grouped by its schedule text alone.

    Args:
        runs: The runs, one a row.

    Returns:
        Each group's schedule texts, in order.
    """
    fields = sorted(c for c in runs.columns if c.startswith(INTERVAL_FIELDS) and c != INTERVAL_REDRAW)
    settings = runs[fields].astype(object)
    rows = settings.where(settings.notna(), None).itertuples(index=False, name=None)
    texts = runs[INTERVAL_SCHEDULE].astype(str)
    key_of = {text: row if any(v is not None for v in row) else text for row, text in zip(rows, texts)}
    groups: dict[object, list[str]] = {}
    for text in schedule_order(runs, INTERVAL_SCHEDULE, INTERVAL_KIND):
        groups.setdefault(key_of.get(text, text), []).append(text)
    return list(groups.values())


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
    keyed = pd.concat(
        [
            runs[is_full(runs)].assign(**dict(zip(headers, baseline))),
            attent.assign(
                **{
                    headers[0]: attent[RATIO_SCHEDULE],
                    headers[1]: attent[INTERVAL_SCHEDULE],
                    headers[2]: attent[STRATEGY].map(strategy_label),
                }
            ),
        ]
    )
    strategies = unique_in_order(attent[STRATEGY], PAPER_STRATEGIES)
    # Under the cycles reading a strategy keeps or re-draws each cycle's pick (Soft re-draws by
    # default), which its interval's text says: one row per interval and strategy, under the text it ran.
    ran = set(zip(keyed[headers[1]], keyed[headers[2]]))
    grid = [
        (ratio, next((i for i in same if (i, label) in ran), same[0]), label)
        for ratio, same, label in product(
            schedule_order(attent, RATIO_SCHEDULE, RATIO_KIND),
            interval_groups(attent),
            [strategy_label(s) for s in strategies],
        )
    ]
    return build_table(
        name,
        "Ablation: ratio schedule × interval schedule × strategy",
        keyed,
        headers,
        [baseline, *grid],
        baseline,
        downstream_metrics(keyed),
    )


def ratio_table(runs: pd.DataFrame, name: str = "ratio") -> Table:
    """Table 7: fixed sample ratios 100 % (full data), 90 %, ..., 40 %."""
    headers = ["Sample ratio", "Strategy", "Interval schedule"]
    fixed = runs[runs[METHOD].eq(contract.METHOD_ATTENT) & runs[RATIO_KIND].eq("fixed")]
    baseline: Row = (f"100% ({BASELINE_NAME.lower()})", MISSING, MISSING)
    keyed = pd.concat(
        [
            runs[is_full(runs)].assign(**dict(zip(headers, baseline))),
            fixed.assign(
                **{
                    headers[0]: fixed[RATIO_START].map(percent, na_action="ignore"),
                    headers[1]: fixed[STRATEGY].map(strategy_label),
                    headers[2]: fixed[INTERVAL_SCHEDULE],
                }
            ),
        ]
    )
    ratios = sorted(set(PAPER_RATIOS) | set(fixed[RATIO_START].dropna()), reverse=True)
    grid = product(
        [percent(r) for r in ratios],
        [strategy_label(s) for s in unique_in_order(fixed[STRATEGY])] or [MISSING],
        schedule_order(fixed, INTERVAL_SCHEDULE, INTERVAL_KIND),
    )
    return build_table(
        name, "Fixed sample ratio", keyed, headers, [baseline, *grid], baseline, downstream_metrics(keyed)
    )


def random_strategy(runs: pd.DataFrame) -> pd.Series:
    """Runs of AtteNT's Random strategy (``selection.strategy: random``: tagged ``attent.method:
    attent``, ``attent.strategy: random``). Beside other methods they are the comparison's Random
    subset."""
    return runs[METHOD].eq(contract.METHOD_ATTENT) & runs[STRATEGY].eq(RANDOM)


def comparison_table(runs: pd.DataFrame, name: str = "comparison") -> Table:
    """Table 8: AtteNT vs the other sample-selection and reweighting methods."""
    runs = runs.assign(**{METHOD: runs[METHOD].mask(random_strategy(runs), RANDOM_SUBSET)})
    keyed = runs.assign(Method=method_names(runs))
    rows: list[Row] = []
    for method in unique_in_order(runs[METHOD], COMPARISON_METHODS):
        present = keyed.loc[runs[METHOD].eq(method), "Method"]
        rows.extend((n,) for n in sorted(set(present)) or [ROW_NAMES.get(method, method)])
    return build_table(
        name, "Comparison with other methods", keyed, ["Method"], rows, (BASELINE_NAME,), downstream_metrics(keyed)
    )


def with_without_table(runs: pd.DataFrame, name: str = "with_without") -> Table:
    """Tables 1/2: training with vs without AtteNT."""
    without = "w/o AtteNT"
    runs = runs[runs[METHOD].isin([contract.METHOD_ATTENT, contract.METHOD_FULL])]
    keyed = runs.assign(Setting=("w/ " + method_names(runs)).where(~is_full(runs), without))
    attent_rows = sorted(set(keyed.loc[runs[METHOD].eq(contract.METHOD_ATTENT), "Setting"]))
    rows = [(without,), *((setting,) for setting in attent_rows or ["w/ AtteNT"])]
    return build_table(name, "With vs without AtteNT", keyed, ["Setting"], rows, (without,), downstream_metrics(keyed))


def summary_table(runs: pd.DataFrame, name: str = "summary") -> Table:
    """Fallback when no paper layout fits: one row per configuration."""
    keyed = runs.assign(Configuration=label_names(runs))  # configs sharing a label: split later
    baseline_names = sorted(set(keyed.loc[is_full(runs), "Configuration"]))
    rows = [*baseline_names, *sorted(set(keyed["Configuration"]) - set(baseline_names))]
    baseline = (baseline_names[0],) if baseline_names else None
    return build_table(
        name, "All configurations", keyed, ["Configuration"], [(r,) for r in rows], baseline, downstream_metrics(keyed)
    )


TABLE_BUILDERS = dict(
    zip(TABLE_KINDS, (ablation_table, ratio_table, comparison_table, with_without_table, summary_table))
)


def applicable_kinds(runs: pd.DataFrame) -> list[str]:
    """The layouts the runs present fill; ``summary`` when none does."""
    methods = set(runs[METHOD].dropna())
    compared = bool(methods - {contract.METHOD_ATTENT, contract.METHOD_FULL})
    # beside other methods, AtteNT's Random strategy is the comparison's Random subset, no ablation row
    attent = runs[runs[METHOD].eq(contract.METHOD_ATTENT) & ~(random_strategy(runs) & compared)]
    schedule_configs = (
        pd.DataFrame({"ratio": attent[RATIO_KIND], "interval": attent[INTERVAL_SCHEDULE], "strategy": attent[STRATEGY]})
        .astype(object)
        .fillna(MISSING)
    )
    fixed_ratios = set(attent.loc[attent[RATIO_KIND].eq("fixed"), RATIO_START].dropna())
    kinds = [
        kind
        for kind, applies in [
            ("ablation", len(schedule_configs.drop_duplicates()) >= 2),
            ("ratio", len(fixed_ratios) >= 2),
            ("comparison", compared),
            (
                "with_without",
                methods == {contract.METHOD_ATTENT, contract.METHOD_FULL} and attent[LABEL].nunique() <= 1,
            ),
        ]
        if applies
    ]
    return kinds or ["summary"]


def method_names(runs: pd.DataFrame) -> pd.Series:
    """Method display name, with the config label added where a method ran several configs."""
    names = runs[METHOD].map(ROW_NAMES).fillna(runs[METHOD]).fillna(MISSING)
    labels_per_method = runs.groupby(METHOD)[LABEL].transform("nunique")
    several = labels_per_method.gt(1) & ~is_full(runs)
    return names.where(~several, names + " (" + runs[LABEL].astype(str) + ")")


def strategy_label(strategy: object) -> object:
    return STRATEGY_NAMES.get(strategy, strategy)


def percent(ratio: float) -> str:
    return f"{ratio:.0%}"
