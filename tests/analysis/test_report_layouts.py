"""Table 3's interval rows from the selection's own fields: runs as the engine logs them (the
interval's text as its tag, the flattened config as params), grouped by the interval's settings
other than ``redraw`` and ordered by the logged kinds, never by reading the text."""

from __future__ import annotations

import pandas as pd
from attent import contract
from attent.analysis.mlflow_runs import (
    CONTRACT_COLUMNS,
    INTERVAL_FIELDS,
    INTERVAL_SCHEDULE,
    METHOD,
    METHOD_COST,
    RATIO_SCHEDULE,
    STRATEGY,
    param,
)
from attent.analysis.paper_tables.layouts import ablation_table, interval_groups
from attent.experiment.files import flatten
from attent.selection.config import SelectionConfig

RATIO = {"kind": "incremental", "start": 0.2, "end": 0.8}
KEPT_1, DRAWN_1 = "cycles(4 × 1 subset epoch)", "cycles(4 × 1 subset epoch, re-drawn)"
KEPT_2, DRAWN_2 = "cycles(4 × 1→2 subset epochs)", "cycles(4 × 1→2 subset epochs, re-drawn)"


def engine_run(strategy: str, **interval: object) -> dict[str, object]:
    """One AtteNT run's tags and params as the engine logs them (params: ``str`` of the value)."""
    selection = SelectionConfig(method="attent", strategy=strategy, ratio=RATIO, interval=interval)
    return {
        METHOD: contract.METHOD_ATTENT,
        STRATEGY: strategy,
        RATIO_SCHEDULE: selection.ratio_schedule.describe(),
        INTERVAL_SCHEDULE: selection.interval_schedule.describe(),
        METHOD_COST: 1.0,
        **{param(k): str(v) for k, v in flatten(selection, "selection").items()},
    }


def cycles_runs() -> pd.DataFrame:
    """Hard keeps each cycle's pick, Soft re-draws it (the released code's defaults), at two shapes."""
    runs = [engine_run(s, kind="cycles", cycles=4, start=1, end=end) for end in (1, 2) for s in ("hard", "soft")]
    frame = pd.DataFrame(runs)
    frame = frame.reindex(columns=frame.columns.union(CONTRACT_COLUMNS, sort=False))
    return frame.astype({c: object for c in frame.columns if c.startswith(("tags.", "params."))})  # as runs_frame


def test_cycles_intervals_group_by_their_settings_and_order_by_their_logged_kind():
    """Kept and re-drawn share a group per cycles shape; fixed and incremental come first (their
    kind, not their text: "cycles" sorts before both)."""
    runs = pd.concat(
        [
            cycles_runs(),
            pd.DataFrame([engine_run("soft", kind="incremental", start=1, end=4), engine_run("hard", kind="fixed")]),
        ]
    )
    assert runs[INTERVAL_SCHEDULE].tolist()[:4] == [KEPT_1, DRAWN_1, KEPT_2, DRAWN_2]  # the engine's texts
    assert interval_groups(runs) == [["fixed(1)"], ["incremental(1→4)"], [KEPT_1, DRAWN_1], [KEPT_2, DRAWN_2]]


def test_the_grouping_reads_the_settings_not_the_text():
    """A re-drawn interval under any text still groups with its kept twin; runs that logged no
    interval settings are grouped by their text alone."""
    runs = cycles_runs()
    renamed = runs.assign(**{INTERVAL_SCHEDULE: runs[INTERVAL_SCHEDULE].replace(DRAWN_1, "cycles(4 × 1, new draw)")})
    assert [KEPT_1, "cycles(4 × 1, new draw)"] in interval_groups(renamed)
    no_settings = runs.assign(**{c: None for c in runs.columns if c.startswith(INTERVAL_FIELDS)})
    assert sorted(interval_groups(no_settings)) == [[KEPT_1], [DRAWN_1], [KEPT_2], [DRAWN_2]]


def test_the_ablation_holds_one_row_per_interval_and_strategy_under_the_text_it_ran():
    """No empty re-drawn rows for Hard and Random, none kept for Soft: Random, which nobody ran,
    takes the group's first text."""
    table = ablation_table(cycles_runs())
    rows = list(table.labels.itertuples(index=False, name=None))
    ratio = "incremental(0.2→0.8)"
    assert rows[1:] == [
        (ratio, KEPT_1, "Random"),
        (ratio, KEPT_1, "Hard"),
        (ratio, DRAWN_1, "Soft"),
        (ratio, KEPT_2, "Random"),
        (ratio, KEPT_2, "Hard"),
        (ratio, DRAWN_2, "Soft"),
    ]
    assert table.stats["n"].tolist() == [0, 0, 1, 1, 0, 1, 1]
