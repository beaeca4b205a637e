"""The time-to-accuracy benchmark's runs and per-epoch curves, read from MLflow alone (the names
of the run contract): whether an experiment holds a benchmark, its finished verdict-stage runs per
workload, method and seed, the parent run they report to and the selection stage's choices
recorded on it, and each run's curve with its cumulative method cost, selected ratio, hardness and
agreement."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field

import pandas as pd
from attent import contract  # the names the engine logs (no engine import)
from attent.analysis import ReportError
from attent.analysis.mlflow_runs import runs_frame, search_all_runs
from mlflow import MlflowClient

WORKLOAD = f"tags.{contract.TAG_BENCH_WORKLOAD}"
METHOD = f"tags.{contract.TAG_BENCH_METHOD}"
CURVE_METRIC = f"tags.{contract.TAG_BENCH_METRIC}"
STAGE = f"tags.{contract.TAG_BENCH_STAGE}"
PARENT = f"tags.{contract.TAG_PARENT_RUN_ID}"
ROLE = f"tags.{contract.TAG_ROLE}"
SEED = f"params.{contract.PARAM_SEED}"
EPOCHS = "params.train.epochs"
CURVE_COLUMNS = [
    "workload",
    "method",
    "seed",
    "run_id",
    "epoch",
    "metric",
    "value",
    "method_cost_s",
    "selected_ratio",
    "samples_backpropagated",
    "hardness",
    "overlap",
    "agreement",
]


@dataclass
class Benchmark:
    runs: pd.DataFrame  # finished verdict-stage runs, one per workload, method and seed
    parent: str | None  # the parent run the report is logged to
    superseded: dict[str, int] = field(default_factory=dict)  # workload -> older finished runs left out
    selection_runs: dict[str, int] = field(default_factory=dict)  # workload -> selection-stage runs left out
    choices: list[dict] = field(default_factory=list)  # the selection stage's choices (choices.json)


def is_benchmark(client: MlflowClient, experiment: str) -> bool:
    """Whether the experiment holds an `attent bench` parent run."""
    found = client.get_experiment_by_name(experiment)
    return found is not None and bool(
        client.search_runs(
            [found.experiment_id], f"tags.`{contract.TAG_ROLE}` = '{contract.ROLE_BENCHMARK}'", max_results=1
        )
    )


def load_benchmark(client: MlflowClient, experiment: str) -> Benchmark:
    """Finished verdict-stage runs of ``experiment`` (the latest of each workload, method and
    seed; runs without a stage tag count as verdict runs, as older benchmarks logged them), the
    parent run (the one they are children of, else the newest benchmark parent: the one
    ``attent bench`` reuses) and the choices recorded on it. Selection-stage runs are counted,
    never read: they chose on validation, and the verdict reads the test split of other runs."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ReportError(f"MLflow experiment {experiment!r} does not exist ({client.tracking_uri})")
    found_runs = search_all_runs(client, found.experiment_id)
    if not found_runs:
        raise ReportError(f"MLflow experiment {experiment!r} has no runs")
    frame = runs_frame(found_runs)
    started = {run.info.run_id: run.info.start_time for run in found_runs}
    frame = frame.assign(start_time=frame["run_id"].map(started)).sort_values("start_time", kind="stable")
    if WORKLOAD not in frame:
        raise ReportError(f"experiment {experiment!r} holds no benchmark runs")
    finished = frame[frame[WORKLOAD].notna() & frame["status"].eq("FINISHED")]
    selection = (
        finished[STAGE].eq(contract.BENCH_STAGE_SELECTION)
        if STAGE in finished
        else pd.Series(False, index=finished.index)
    )
    runs = finished[~selection]
    if runs.empty:
        raise ReportError(f"experiment {experiment!r} has no finished verdict-stage benchmark runs")
    runs = runs.assign(seed=pd.to_numeric(runs[SEED], errors="coerce"))
    latest = runs.drop_duplicates([WORKLOAD, METHOD, "seed"], keep="last").reset_index(drop=True)
    parents = frame.loc[frame[ROLE].eq(contract.ROLE_BENCHMARK), "run_id"]
    linked = latest[PARENT][latest[PARENT].isin(parents)] if PARENT in latest else pd.Series(dtype=object)
    parent = linked.mode().iloc[0] if not linked.empty else (parents.iloc[-1] if not parents.empty else None)
    older = runs[runs.duplicated([WORKLOAD, METHOD, "seed"], keep="last")]
    return Benchmark(
        latest,
        parent,
        older[WORKLOAD].value_counts().to_dict(),
        finished[selection][WORKLOAD].value_counts().to_dict(),
        load_choices(client, parent) if parent else [],
    )


def load_choices(client: MlflowClient, parent: str) -> list[dict]:
    """The selection stage's choices on the parent run (``choices.json``: a list of {workload,
    method, key, value, metric, scores}); none where the file is absent (older benchmarks, or
    nothing was chosen)."""
    return parent_json(client, parent, contract.BENCH_CHOICES_FILE) or []


def parent_json(client: MlflowClient, parent: str, name: str):
    """A JSON file the benchmark logged on its parent run; None where it is absent."""
    if name not in {a.path for a in client.list_artifacts(parent)}:
        return None
    with tempfile.TemporaryDirectory(prefix="attent-parent-") as tmp:
        with open(client.download_artifacts(parent, name, tmp)) as f:
            return json.load(f)


def metric_history(client: MlflowClient, run_id: str, name: str) -> dict[int, float]:
    """step -> value; where a step was logged twice (a run restored from a checkpoint repeats
    epochs), the later value."""
    history = sorted(client.get_metric_history(run_id, name), key=lambda m: (m.step, m.timestamp))
    return {m.step: m.value for m in history}


def epoch_steps(client: MlflowClient, run: dict, steps: set[int]) -> list[int]:
    """The steps that are epochs: below ``train.epochs`` (the end-of-run metrics repeat the last
    epoch at step = epochs), else those of the per-epoch ``epoch`` metric, else all."""
    epochs = pd.to_numeric(pd.Series([run.get(EPOCHS)]), errors="coerce").iloc[0]
    if epochs == epochs:
        return sorted(s for s in steps if s < epochs)
    logged = metric_history(client, run["run_id"], "epoch")
    return sorted(steps & set(logged)) if logged else sorted(steps)


def load_curves(client: MlflowClient, runs: pd.DataFrame) -> pd.DataFrame:
    """Per run and epoch (1-based): the curve metric (NaN on epochs without an evaluation), the
    cumulative method cost, the selected ratio, the cumulative samples back-propagated and the
    hardness and overlap of the pick in force and the agreement of training and scoring losses
    at its scoring pass (NaN without one, e.g. full data)."""
    names = {
        "method_cost_s": contract.TIME_METHOD,
        "selected_ratio": contract.SELECTED_RATIO,
        "samples_backpropagated": contract.SAMPLES_BACKPROPAGATED,
        "hardness": contract.SELECTION_HARDNESS,
        "overlap": contract.SELECTION_OVERLAP,
        "agreement": contract.SCORE_AGREEMENT,
    }
    frames = []
    for run in runs.to_dict("records"):
        metric = str(run[CURVE_METRIC]).removeprefix("metrics.")
        histories = {
            "value": metric_history(client, run["run_id"], metric),
            **{column: metric_history(client, run["run_id"], name) for column, name in names.items()},
        }
        steps = epoch_steps(client, run, set().union(*histories.values()))
        if not steps:
            continue
        frames.append(
            pd.DataFrame(
                {
                    "workload": run[WORKLOAD],
                    "method": run[METHOD],
                    "seed": run["seed"],
                    "run_id": run["run_id"],
                    "epoch": [s + 1 for s in steps],
                    "metric": metric,
                    **{column: [history.get(s, math.nan) for s in steps] for column, history in histories.items()},
                }
            )
        )
    if not frames:
        return pd.DataFrame({column: pd.Series(dtype=float) for column in CURVE_COLUMNS})
    return pd.concat(frames, ignore_index=True)[CURVE_COLUMNS]
