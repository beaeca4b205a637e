"""The same LoRA job through AtteNTTrainer, the plain Trainer and the engine, measured side by side.

For each seed, one run after another (never two at once), on the same GSM8K training problems and
the same held-out problems (the seed draws both, the same for every arm):

    trainer_full     transformers.Trainer, all data
    trainer_attent   attent.AtteNTTrainer, SelectionConfig(preset="llm")
    engine_attent    the engine's own run of the job (attent.engine.driver.train: Ray Train, one worker,
                     MLflow), selection preset llm
    engine_full      the engine's run on all data

The job is the engine's LLM task (experiments/gsm8k_smollm2.yaml with the sizes below): SmolLM2-135M-
Instruct in float32, LoRA of rank --lora-r on every linear layer of the blocks (alpha = r, dropout
0.05), the task's prompt template and truncation to --max-length tokens, AdamW (0.9, 0.999), no weight
decay, --lr with a cosine schedule after 3 % warm-up, gradient-norm clipping at 1, micro-batches of
--batch-size and gradient accumulation up to --global-batch-size, --epochs epochs. The Trainer arms get
the very same pieces from the engine's task object: its tokenised training set and right-padding
collate (without the index column), its model builder (the same seeded LoRA initialisation), its
optimiser settings.

Measured, per run:
  method_s       the cost of the method, as the engine counts it (``time_method_s``): training +
                 scoring + selection; not evaluation, checkpoints, model logging or start-up. Engine:
                 its own counter (each epoch's train_one_epoch, plus the Selector's scoring and
                 selection clocks), from the run's MLflow metrics. Trainer arms: ``harness.epoch_clock``, a
                 TrainerCallback summing the wall-clock from each on_epoch_begin to its on_epoch_end.
                 That window holds everything Trainer does in the epoch: AtteNTTrainer's scoring pass
                 and re-selection (its ``_run_epoch`` begins with them, after on_epoch_begin), loading
                 each batch, forward, backward, clipping, optimiser and scheduler steps. Outside it:
                 Trainer's set-up before on_train_begin, and what follows on_epoch_end (logging at
                 epoch ends; no evaluation or checkpoint is configured). ``scoring_s`` and
                 ``selection_s`` are the Selector's own clocks (the engine's too), ``train_s`` the rest;
                 ``steps_s`` sums on_step_begin..on_step_end (forward to optimiser step, without the
                 loading of each window's first batch), a diagnostic only.
  samples_backpropagated   distinct samples trained on, summed over epochs (the engine's counter;
                 AtteNTTrainer's Selector; for the plain Trainer the rows of its training batches).
  realized_saving = 1 - method_s / method_s of the same seed's full-data run of the same framework
                 (trainer_full for trainer_attent, engine_full for engine_attent); ideal_saving the
                 same with samples_backpropagated.
  heldout_loss   mean cross-entropy of the response tokens of the held-out problems (GSM8K test
                 problems and their reference solutions, encoded like training examples), token-
                 weighted: one function (``heldout_loss``: the engine task's ``evaluate_response_loss``)
                 run in this process on every arm's final model; the engine's final adapter is read
                 back from the run's logged MLflow model. The engine's own evaluation of the same
                 function inside its worker is kept as ``engine_own_heldout_loss``, a check.

What differs between the frameworks by design, not by this script: Trainer (and so AtteNTTrainer,
which keeps Trainer's reduction) averages the loss over the tokens of an accumulated batch, the
engine over the samples (each sample's mean token loss, equally weighted); Trainer's cosine schedule
is indexed by optimiser steps, the engine's by epoch progress; the plain Trainer shuffles with its own
sampler. The per-sample score AtteNT selects by is the sample's mean response-token loss in both.

Each engine run starts a local Ray and shuts it down after (start-up: not method cost), so no arm
trains beside the processes of another. Torch threads: --threads in every arm (the Ray worker gets
as many CPUs and the same OMP_NUM_THREADS).

Output: ``runs.csv`` (a row per run) and ``summary.md`` (per-arm mean ± std; paired differences per
seed, each column a Holm-adjusted family with its verdicts) under --out. ``runs.csv`` is rewritten after every run;
``--resume`` keeps the rows it holds (the same settings) and trains only the (seed, arm) pairs it lacks.

    # the real run (a quiet machine, nothing else running; about 2 h at one thread, ~35 min a seed):
    python benchmarks/overheads/hf_vs_engine.py --problems 128 --heldout 128 --seeds 0 1 2
    # the smoke run:
    python benchmarks/overheads/hf_vs_engine.py --problems 16 --heldout 16 --seeds 0 --epochs 2 \\
        --out benchmarks/results/hf_vs_engine/smoke
    # the four arms' configurations as JSON, nothing trained; summary.md again from --out/runs.csv:
    python benchmarks/overheads/hf_vs_engine.py --problems 16 --dry-run
    python benchmarks/overheads/hf_vs_engine.py --summarize --out benchmarks/results/hf_vs_engine
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402
from hf_vs_engine_arms import data_identity, heldout_loss, run_engine, run_trainer  # noqa: E402 -- beside this script

REPO = harness.REPO
BASE = REPO / "experiments" / "gsm8k_smollm2.yaml"
RESULTS = harness.RESULTS / "hf_vs_engine"
ARMS = ("trainer_full", "trainer_attent", "engine_attent", "engine_full")
LABELS = {
    "trainer_full": "Trainer, full data",
    "trainer_attent": "AtteNTTrainer (llm preset)",
    "engine_attent": "engine, AtteNT (llm preset)",
    "engine_full": "engine, full data",
}
FULL_OF = {
    "trainer_attent": "trainer_full",
    "engine_attent": "engine_full",
    "trainer_full": "trainer_full",
    "engine_full": "engine_full",
}
# paired differences reported (a - b), per seed
PAIRS = (("trainer_attent", "trainer_full"), ("trainer_attent", "engine_attent"), ("engine_attent", "engine_full"))
COLUMNS = (
    "seed",
    "arm",
    "method_s",
    "train_s",
    "scoring_s",
    "selection_s",
    "steps_s",
    "samples_backpropagated",
    "optimizer_steps",
    "realized_saving",
    "ideal_saving",
    "heldout_loss",
    "engine_own_heldout_loss",
    "wall_s",
    "train_problems",
    "heldout_problems",
    "train_fingerprint",
    "heldout_fingerprint",
    "run_id",
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--problems", type=int, default=128, help="GSM8K training problems (drawn by the seed)")
    parser.add_argument("--heldout", type=int, default=128, help="GSM8K test problems of the held-out loss")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4, help="micro-batch")
    parser.add_argument("--global-batch-size", type=int, default=8, help="reached by gradient accumulation")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--lora-r", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--eval-batch-size", type=int, default=16, help="held-out loss batch")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every arm (Ray: CPUs per worker)")
    parser.add_argument(
        "--margin",
        type=float,
        default=0.02,
        help="equivalence margin of the held-out loss (nats; 0.02 is about 2 %% in perplexity)",
    )
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--resume", action="store_true", help="keep the rows of --out/runs.csv, train the rest")
    parser.add_argument("--dry-run", action="store_true", help="print each arm's configuration (JSON), train nothing")
    parser.add_argument("--summarize", action="store_true", help="write summary.md from --out/runs.csv, train nothing")
    parser.add_argument(
        "--data-dir",
        default=str(REPO.parent / "shared" / "datasets"),
        help="offline mirror holding gsm8k/train.jsonl and gsm8k/test.jsonl",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where runs.csv and summary.md go")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="MLflow store, Ray checkpoints, Trainer output (default: a fresh temp folder)",
    )
    return parser.parse_args(argv)


# --- the job -----------------------------------------------------------------------------------------------
def experiment(args, seed: int, arm: str, workdir: Path, stamp: str):
    """The engine's experiment of ``arm`` at ``seed`` (the Trainer arms read their task from it too)."""
    overrides = [
        f"seed={seed}",
        f"task.data_dir={args.data_dir}",
        f"task.train_limit={args.problems}",
        "task.split_seed=null",
        f"task.max_length={args.max_length}",
        f"task.lora_r={args.lora_r}",
        "task.eval.suites=[gsm8k_loss]",
        f"task.eval.response_loss_limit={args.heldout}",
        f"task.eval.eval_batch_size={args.eval_batch_size}",
        f"train.epochs={args.epochs}",
        f"train.batch_size={args.batch_size}",
        f"train.global_batch_size={args.global_batch_size}",
        f"train.lr={args.lr}",
        f"train.eval_every={args.epochs}",  # the engine evaluates once, after the last epoch
        *(["selection.preset=null", "selection.method=full"] if arm.endswith("_full") else ["selection.preset=llm"]),
    ]
    return harness.experiment(
        BASE,
        f"hf-vs-engine-{arm.replace('_', '-')}-s{seed}-{stamp}",
        overrides,
        workdir,
        "hf-vs-engine",
        workers=1,
        threads=args.threads,
        checkpoint_every=args.epochs,
    )


# --- the report ----------------------------------------------------------------------------------------------
def add_savings(rows: list[dict]) -> None:
    """realized_saving and ideal_saving of each row, against its seed's full-data run of the same
    framework (NaN where that run is missing)."""
    for row in rows:
        full = next((r for r in rows if r["seed"] == row["seed"] and r["arm"] == FULL_OF[row["arm"]]), None)
        row["realized_saving"] = 1 - row["method_s"] / full["method_s"] if full else math.nan
        row["ideal_saving"] = 1 - row["samples_backpropagated"] / full["samples_backpropagated"] if full else math.nan


def judged(rows: list[dict], key: str, margin: float | None) -> list:
    """The PAIRS as one family of paired comparisons of ``key`` over the seeds that ran both arms
    (``harness.judged_pairs``: Holm-adjusted paired t-tests, TOSTs where a margin is declared)."""
    return harness.judged_pairs(rows, key, [(LABELS[a], LABELS[b], a, b) for a, b in PAIRS], margin)


def paired_section(args, rows: list[dict]) -> list[str]:
    """summary.md's paired differences over seeds, with what each allows, and the check of the
    engine's own held-out loss against this script's."""
    lines = [
        "## Paired over seeds: mean difference [interval] and what it allows",
        "",
        f"Each column is one family of {len(PAIRS)} comparisons: paired t-tests Holm-adjusted across the "
        'family (the interval is the t-interval at each comparison\'s Holm step); "lower" / "higher" '
        'only where the adjusted test rejects at 5 %; for the held-out loss, "equivalent within ± '
        f'{args.margin:g}" where Holm-adjusted paired TOSTs with that declared margin (nats) pass; '
        '"inconclusive" otherwise.',
        "",
        "| difference | held-out loss | method cost (s) |",
        "|---|---:|---:|",
    ]
    losses, costs = judged(rows, "heldout_loss", args.margin), judged(rows, "method_s", None)
    for (a, b), loss, cost in zip(PAIRS, losses, costs):
        lines.append(f"| {LABELS[a]} − {LABELS[b]} | {harness.judged_cell(loss)} | {harness.judged_cell(cost)} |")
    checks = [
        r
        for r in rows
        if r["arm"].startswith("engine") and r["engine_own_heldout_loss"] == r["engine_own_heldout_loss"]
    ]
    if checks:
        worst = max(abs(r["heldout_loss"] - r["engine_own_heldout_loss"]) for r in checks)
        lines += [
            "",
            f"Check: the engine's own evaluation of its final model and this script's evaluation of the "
            f"adapter read back from MLflow differ by at most {worst:.2g}.",
        ]
    return lines


def summary(args, rows: list[dict], total: float) -> str:
    """summary.md: the settings and machine, per-arm means over seeds, and the paired differences."""
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        "# The same LoRA job: AtteNTTrainer vs Trainer vs the engine",
        "",
        f"SmolLM2-135M-Instruct, LoRA r={args.lora_r}, {args.problems} GSM8K training problems and "
        f"{args.heldout} held-out GSM8K test problems per seed (drawn by the seed, the same for every arm), "
        f"{args.epochs} epochs, micro-batch {args.batch_size}, global batch {args.global_batch_size}, "
        f"lr {args.lr:g} (cosine, 3 % warm-up), max length {args.max_length}, {args.threads} torch thread(s) "
        f"per arm; seeds {seeds}; one run at a time. `benchmarks/overheads/hf_vs_engine.py` (its docstring: what is "
        "timed and what differs between the frameworks by design).",
        "",
        f"{harness.machine_line()} Total {total / 60:.1f} min.",
        "",
        "## Per arm (mean ± std over seeds)",
        "",
        "| arm | method cost (s) | samples back-propagated | optimiser steps | realized saving | ideal saving "
        "| held-out loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        cells = [
            harness.mean_std([r[k] for r in mine])
            for k in (
                "method_s",
                "samples_backpropagated",
                "optimizer_steps",
                "realized_saving",
                "ideal_saving",
                "heldout_loss",
            )
        ]
        lines.append(f"| {LABELS[arm]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Savings: against the same seed's full-data run of the same framework (Trainer for "
        "AtteNTTrainer, the engine's for the engine's AtteNT).",
        "",
        *paired_section(args, rows),
    ]
    return "\n".join(lines) + "\n"


def finished_rows(args) -> list[dict]:
    """The rows of ``--out/runs.csv`` (numbers as numbers), for ``--resume``."""
    path = args.out / "runs.csv"
    if not (args.resume and path.is_file()):
        return []
    rows = harness.read_rows(path)
    for row in rows:  # a row of other settings would pair with nothing: refuse rather than mix
        if (row["train_problems"], row["heldout_problems"]) != (args.problems, args.heldout):
            raise SystemExit(
                f"{path}: rows of {row['train_problems']} / {row['heldout_problems']} problems, not "
                f"{args.problems} / {args.heldout}: resume into another --out"
            )
    return rows


def write(args, rows: list[dict], total: float) -> None:
    harness.write_rows(args.out / "runs.csv", rows, COLUMNS)
    (args.out / "summary.md").write_text(summary(args, rows, total))


# --- the run -------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:  # the first seed's arms, nothing trained
        workdir = args.workdir or Path(tempfile.gettempdir()) / "attent-hf-vs-engine"
        print(
            json.dumps(
                {arm: experiment(args, args.seeds[0], arm, workdir, "dry").model_dump(mode="json") for arm in args.arms}
            )
        )
        return 0
    if args.summarize:  # summary.md again from the rows of runs.csv
        rows = harness.read_rows(args.out / "runs.csv")
        add_savings(rows)
        (args.out / "summary.md").write_text(summary(args, rows, 0.0))
        return 0
    # every arm on the same number of threads: the Ray worker inherits OMP_NUM_THREADS (Ray's own
    # default would be its CPUs per worker, which --threads also sets)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="attent-hf-vs-engine-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")  # fresh run names: the engine never resumes
    started = time.perf_counter()
    rows: list[dict] = finished_rows(args)
    for seed in args.seeds:
        for arm in [a for a in ARMS if a in args.arms]:
            if any(r["seed"] == seed and r["arm"] == arm for r in rows):
                continue  # --resume: trained by an earlier invocation
            cfg = experiment(args, seed, arm, workdir, stamp)
            print(f"[hf_vs_engine] seed {seed}, {LABELS[arm]} ...", file=sys.stderr, flush=True)
            if arm.startswith("trainer"):
                clock = harness.epoch_clock("cpu")  # the method's cost (the module docstring)
                row, task, model = run_trainer(args, cfg, arm, workdir, clock)
            else:
                row, task, model = run_engine(cfg)
            row.update(seed=seed, arm=arm, heldout_loss=heldout_loss(task, model), **data_identity(task))
            row.setdefault("engine_own_heldout_loss", math.nan)
            rows.append(row)
            add_savings(rows)
            write(args, rows, time.perf_counter() - started)  # a stop loses at most the run in progress
            del model, task
            print(
                f"[hf_vs_engine] seed {seed}, {LABELS[arm]}: method {row['method_s']:.1f} s, "
                f"{row['samples_backpropagated']} samples back-propagated, held-out loss {row['heldout_loss']:.4f}"
                f" ({time.perf_counter() - started:.0f} s so far)",
                file=sys.stderr,
                flush=True,
            )
        same = {(r["train_fingerprint"], r["heldout_fingerprint"]) for r in rows if r["seed"] == seed}
        if len(same) != 1:
            raise RuntimeError(f"seed {seed}: the arms trained or were scored on different problems: {same}")
    add_savings(rows)  # also for rows all read back by --resume
    total = time.perf_counter() - started
    write(args, rows, total)
    print(summary(args, rows, total))
    print(f"total time {total:.0f} s ({total / 60:.1f} min); results in {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
