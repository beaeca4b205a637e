"""A benchmark spec's workload on one CUDA GPU without Ray or MLflow (a lent GPU node has
neither and reaches no package index), then its runs logged to MLflow here, so that
`attent report` judges them as it judges any benchmark's runs.

    # on the GPU node: the selection stage on validation, then the verdict runs, one at a time
    python benchmarks/llm_gpu.py run benchmarks/llm_size.yaml --workload gsm8k-128 --out runs.json \\
        --budget-s 420 train.precision=bf16 task.data_dir=$PWD/data
    # here: one MLflow run per GPU run, children of a benchmark parent run, then the report
    python benchmarks/llm_gpu.py log runs.json --tracking-uri sqlite:///gpu.db --experiment llm-size-gpu
    attent report --experiment llm-size-gpu --tracking-uri sqlite:///gpu.db --out reports

The runs are the spec's own (`attent.benchmark` builds them, chooses on validation and
calibrates full data at equal measured cost with the same functions as `attent bench`); the
recipe is the one Ray Train workers run, on one device. A seed after the first starts only when
it would end within `--budget-s` (the time spent plus the longest seed so far), and runs.json is
rewritten after every run: a time-out loses one run.
`--resume runs.json` goes on from an earlier file: its choices stand (no selection stage again) and
its finished runs are kept. A calibrated run whose configuration equals a run already made for the
same seed (full data at equal cost landing on the equal-samples epochs) is that run's result again,
marked ``same_run_as``, rather than the same computation twice; so is a selection candidate that
repeats an earlier stage's run (the chosen learning rate's run at the epochs the next stage tries).
"""
from __future__ import annotations

import argparse
import json
import os
import platform as host
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "platform"), str(Path(__file__).resolve().parents[1])]

from attent import contract
from attent.benchmark import (
    BenchmarkRun,
    base_method,
    choice_record,
    choose,
    equal_cost_epochs,
    load_benchmark,
    selection_runs,
    with_epochs,
)


def train_on_device(run: BenchmarkRun, device: str) -> dict[str, Any]:
    """One run of the recipe on ``device``: its per-epoch rows, end-of-run metrics and set-up time."""
    import torch
    from attent.engine.recipe import TrainingRecipe, WorkerContext, format_row
    cfg = run.experiment.resolved()
    started = time.perf_counter()
    recipe = TrainingRecipe(cfg, WorkerContext(device=torch.device(device)))
    recipe.setup(wrap_model=lambda model: model.to(device))
    setup_s = time.perf_counter() - started
    rows = []
    for epoch in range(cfg.train.epochs):
        rows.append(recipe.run_epoch(epoch))
        print(f"  {cfg.name} {format_row(rows[-1], cfg.train.epochs)}", flush=True)
    return {"workload": run.workload.name, "method": run.method, "stage": run.stage, "seed": cfg.seed,
            "candidate": list(run.candidate) if run.candidate else None,
            "config": cfg.model_dump(mode="json"), "rows": rows, "finals": recipe.final_metrics(),
            "setup_s": setup_s, "wall_s": time.perf_counter() - started}


def computation(config: dict[str, Any]) -> dict[str, Any]:
    """What a run computes: its configuration less its name and where it is recorded."""
    return {**config, "name": None, "mlflow": None, "ray": {**config["ray"], "storage_path": None}}


def repeated(runs: list[dict[str, Any]], config: dict[str, Any], method: str, **fields: Any) -> dict[str, Any] | None:
    """The first of ``runs`` that is the same computation as ``config``, recorded again for
    ``method`` (marked ``same_run_as``); None when there is none."""
    same = next((r for r in runs if computation(r["config"]) == computation(config)), None)
    return None if same is None else {**same, **fields, "method": method, "config": config, "same_run_as": same["method"]}


def seed_seconds(runs: list[dict[str, Any]]) -> dict[int, float]:
    """Each seed's wall-clock seconds over its verdict runs (a reused run took none)."""
    seconds: dict[int, float] = {}
    for r in runs:
        if r["stage"] == contract.BENCH_STAGE_VERDICT and not r.get("same_run_as"):
            seconds[r["seed"]] = seconds.get(r["seed"], 0.0) + r["wall_s"]
    return seconds


def run(args: argparse.Namespace) -> None:
    import torch
    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    machine = {"device": torch.cuda.get_device_name() if device == "cuda" else host.processor() or host.machine(),
               "torch": torch.__version__, "cuda": torch.version.cuda, "overrides": args.overrides}
    spec, _ = load_benchmark(args.spec, args.overrides, workloads=[args.workload])
    workload = spec.workloads[0]
    out = {"spec": spec.model_dump(mode="json"), "machine": machine, "choices": [], "runs": []}
    if args.resume:
        earlier = json.loads(Path(args.resume).read_text())
        if earlier["machine"]["device"] != machine["device"]:
            sys.exit(f"--resume {args.resume}: its runs ran on {earlier['machine']['device']}, not {machine['device']}")
        out.update(choices=earlier["choices"], runs=earlier["runs"])
        print(f"[gpu] resumed {args.resume}: {len(out['runs'])} runs, choices {[(c['key'], c['value']) for c in out['choices']]}",
              flush=True)

    def save() -> None:
        Path(args.out).write_text(json.dumps(out, default=float))

    chosen = []
    for tune in workload.tune:  # the selection stage: validation metrics only
        earlier = [c["value"] for c in out["choices"] if c["workload"] == workload.name and c["key"] == tune.key]
        if earlier:
            chosen.append((tune, earlier[0]))
            continue
        metric = workload.selection_metric()
        finals: dict[Any, list[float]] = {}
        tried = selection_runs(args.spec, workload, tune, chosen, args.overrides)
        for candidate in tried:
            earlier_stages = [r for r in out["runs"] if r["stage"] == contract.BENCH_STAGE_SELECTION]
            result = (repeated(earlier_stages, candidate.experiment.resolved().model_dump(mode="json"), candidate.method,
                               candidate=list(candidate.candidate)) or train_on_device(candidate, device))
            out["runs"].append(result)
            save()
            finals.setdefault(candidate.candidate[1], []).append(float(result["finals"][metric]))
        value, scores = choose(tune, finals, contract.lower_is_better(metric))
        chosen.append((tune, value))
        out["choices"].append(choice_record(workload, tune, value, scores, seeds=[r.experiment.seed for r in tried]))
        print(f"[gpu] {tune.key} = {value} chosen on validation ({scores})", flush=True)
        save()
    _, runs = load_benchmark(args.spec, args.overrides, choices={workload.name: chosen}, workloads=[workload.name])
    for number, verdict_run in enumerate(runs, 1):
        seed = verdict_run.experiment.seed
        done = [r for r in out["runs"] if r["stage"] == contract.BENCH_STAGE_VERDICT and r["seed"] == seed]
        if any(r["method"] == verdict_run.method for r in done):
            continue
        first_of_seed = number == 1 or runs[number - 2].experiment.seed != seed
        spent, longest = time.perf_counter() - started, max(seed_seconds(out["runs"]).values(), default=0.0)
        if first_of_seed and number > 1 and spent + longest > args.budget_s:
            print(f"[gpu] seed {seed} would end past the budget of {args.budget_s:.0f} s ({spent:.0f} s spent, the longest "
                  f"seed took {longest:.0f} s): seed {seed} and later not started", flush=True)
            break
        if base_method(verdict_run.method) == contract.METHOD_FULL_EQUAL_COST:
            cost = {r["method"]: contract.method_cost(r["finals"]) for r in done}
            full = next(r.experiment for r in runs if r.method == contract.METHOD_FULL and r.experiment.seed == seed)
            epochs = equal_cost_epochs(full.train.epochs, cost[contract.METHOD_ATTENT], cost[contract.METHOD_FULL])
            verdict_run = verdict_run.model_copy(update={"experiment": with_epochs(verdict_run.experiment, epochs)})
        config = verdict_run.experiment.resolved().model_dump(mode="json")
        again = repeated(done, config, verdict_run.method)
        if again:  # deterministic recipe, same configuration: the same computation, not run twice
            out["runs"].append(again)
            print(f"[gpu] {number}/{len(runs)} {verdict_run.experiment.name}: the same run as {again['same_run_as']}", flush=True)
        else:
            print(f"[gpu] {number}/{len(runs)} {verdict_run.experiment.name}", flush=True)
            out["runs"].append(train_on_device(verdict_run, device))
        save()
    print(f"[gpu] {len(out['runs'])} runs in {time.perf_counter() - started:.0f} s", flush=True)


def log(args: argparse.Namespace) -> None:
    """Each run of ``runs.json`` as an MLflow run of ``--experiment``, a child of one benchmark
    parent run holding the spec and the choices, with the per-epoch rows at step = epoch - 1
    and the end-of-run metrics at step = epochs, as the driver logs them."""
    from attent.config import ExperimentConfig
    from attent.engine.tracking import (
        RunLogger,
        client_for,
        finish_run,
        open_experiment,
        start_or_resume_run,
    )
    saved = json.loads(Path(args.runs).read_text())
    client = client_for(args.tracking_uri)
    experiment_id = open_experiment(client, args.experiment, args.tracking_uri)
    machine = saved["machine"]
    device = {"attent.device": machine["device"]}
    parent = client.create_run(experiment_id, run_name=args.experiment,
                               tags={contract.TAG_ROLE: contract.ROLE_BENCHMARK, **device}).info.run_id
    client.log_dict(parent, {**saved["spec"], "name": args.experiment}, contract.BENCH_SPEC_FILE)
    client.log_dict(parent, saved["choices"], contract.BENCH_CHOICES_FILE)
    client.log_dict(parent, machine, "machine.json")
    metrics = {w["name"]: w["metric"] for w in saved["spec"]["workloads"]}
    for result in saved["runs"]:
        data = result["config"]
        data["mlflow"] = {**data["mlflow"], "tracking_uri": args.tracking_uri, "experiment": args.experiment}
        cfg = ExperimentConfig.model_validate(data)
        label = result["method"] if result["candidate"] is None else f"select {result['method']}"
        run_id, _ = start_or_resume_run(cfg, role=contract.ROLE_TRIAL, parent_run_id=parent, extra_tags={
            contract.TAG_BENCH_WORKLOAD: result["workload"], contract.TAG_BENCH_METHOD: result["method"],
            contract.TAG_BENCH_METRIC: metrics[result["workload"]], contract.TAG_BENCH_STAGE: result["stage"],
            contract.TAG_RUN_NAME: f"{label} s{result['seed']} {result['workload']}", **device,
            **({"attent.same_run_as": result["same_run_as"]} if result.get("same_run_as") else {})})
        logger = RunLogger(args.tracking_uri, run_id)
        logger.log_metrics({contract.TIME_SETUP: result["setup_s"]})
        for row in result["rows"]:
            logger.log_metrics(row, step=int(row["epoch"]) - 1)
        logger.log_metrics(result["finals"], step=cfg.train.epochs)
        finish_run(args.tracking_uri, run_id, ok=True)
    client.set_terminated(parent)
    print(f"{len(saved['runs'])} runs logged to {args.experiment} ({args.tracking_uri}), parent {parent}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    on_gpu = commands.add_parser("run", help="the workload's runs on this machine's GPU, into a JSON file")
    on_gpu.add_argument("spec")
    on_gpu.add_argument("--workload", required=True)
    on_gpu.add_argument("--out", required=True)
    on_gpu.add_argument("--budget-s", type=float, default=float("inf"), help="start a seed only when it would end within this many seconds (by the longest seed so far)")
    on_gpu.add_argument("--resume", help="an earlier runs.json of the same workload on the same device: its choices and runs are kept")
    here = commands.add_parser("log", help="the JSON file's runs into MLflow")
    here.add_argument("runs")
    here.add_argument("--tracking-uri", required=True)
    here.add_argument("--experiment", required=True)
    args, overrides = parser.parse_known_args(argv)  # key.path=value anywhere: applied to every run
    unknown = [o for o in overrides if "=" not in o or o.startswith("-")]
    if unknown or (overrides and args.command != "run"):
        parser.error(f"unrecognized arguments: {' '.join(unknown or overrides)}")
    args.overrides = overrides
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    (run if args.command == "run" else log)(args)


if __name__ == "__main__":
    main()
