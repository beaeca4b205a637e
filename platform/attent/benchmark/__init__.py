"""The benchmark (``attent bench``), a time-to-accuracy study: every arm on every workload, over
seeds, one run at a time.

    benchmark:
      name: tta-small                        # MLflow experiment and parent run
      seeds: [0, 1, 2]
      threads: 1                             # torch threads per worker (Ray's CPUs per worker)
      workloads:
        - name: fmnist-vit
          base: ../experiments/fashion_mnist_vit.yaml     # relative to this file
          variant: vit                       # AtteNT's preset for the workload (vit | llm)
          overrides: {train.epochs: 12}      # on the base, for every arm
          metric: eval_test_accuracy         # the per-epoch curve time-to-accuracy reads (the verdict's)
          tune:                              # the selection stage, on validation, in this order
            - {arm: full, key: train.epochs, values: [8, 16, 32]}               # E, for every arm
            - {arm: attent, key: selection.temperature, values: [1, 4, 16]}     # then AtteNT's T
          arms: {full: {}, full_long: {}, full_equal_cost: {}, attent: {}, random: {}}

Arms are named; ``ARMS`` says what each means on top of the workload's AtteNT variant, so
budgeted baselines share AtteNT's ratio and interval schedules (matched budgets).

Two stages. The **selection stage** makes every choice that is made by looking at results (a
knob's value per ``tune`` entry: full data's epoch count E, Soft's temperature): it trains the
candidates on the selection seeds and picks the best final value of the workload's validation
metric (``eval_val_*``: a split drawn from the training pool; no test metric is read), records
the choices on the parent run (``choices.json``) and freezes them. The **verdict stage** then
trains every arm with the choices applied, and only its runs' test metric gives the verdict. Runs go
through the same engine as ``attent train`` (downstream jobs included), strictly one after another,
as MLflow children of the benchmark's parent run: on Ray Train in one Ray session, or every run in
this process on one device (``executor="local"``, ``attent bench --local``: Ray Train's local mode,
no Ray cluster). A finished run is not trained again: re-running the command after an interruption
continues. ``attent.analysis.time_to_accuracy`` then builds the report from MLflow alone.

The parts: ``spec`` (the YAML section and the runs it expands to), ``calibration`` (choices and
calibrated arms, from finished runs), ``runner`` (the executors, the seed budget, the reuse of a
run that is the same computation as an earlier one).
"""

from __future__ import annotations

from .calibration import (
    calibrate_equal_cost,
    calibrate_infobatch,
    choice_record,
    choose,
    computation,
    equal_cost_epochs,
    validation_finals,
    with_epochs,
)
from .runner import EXECUTORS, SeedBudget, executor_overrides, run_benchmark
from .spec import (
    ARMS,
    CALIBRATED_FROM,
    BenchmarkRun,
    BenchmarkSpec,
    Choices,
    TuneSpec,
    WorkloadSpec,
    describe,
    load_benchmark,
    selection_runs,
)

__all__ = [
    "ARMS",
    "CALIBRATED_FROM",
    "EXECUTORS",
    "BenchmarkRun",
    "BenchmarkSpec",
    "Choices",
    "SeedBudget",
    "TuneSpec",
    "WorkloadSpec",
    "calibrate_equal_cost",
    "calibrate_infobatch",
    "choice_record",
    "choose",
    "computation",
    "describe",
    "equal_cost_epochs",
    "executor_overrides",
    "load_benchmark",
    "run_benchmark",
    "selection_runs",
    "validation_finals",
    "with_epochs",
]
