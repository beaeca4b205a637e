"""The theory lab as one experiment: the gradient check, then the teaching experiment over seeds,
logged to MLflow and (optionally) written to a folder.

MLflow layout, in the experiment ``mlflow.experiment``:

* one parent run (tag ``attent.role`` = ``theory``): the flattened config as params,
  ``config.json``, ``gradient_check.md``, ``summary.md``, ``summary.json``, ``figures/*.png``
  (loss vs iterations, loss vs wall-clock, ANTK drift, kernel heatmaps), and per teaching rule and
  target ``<rule>.iterations_to_<target>``, ``.seconds_to_<target>``, ``.cpu_seconds_to_<target>``
  (means over the seeds that reached it), ``<rule>.final_loss``, ``<rule>.ms_per_iteration``;
* one child run per teaching rule × seed (``attent.role`` = ``theory_run``, the rule in the tag
  ``attent.theory.method`` and the param ``method``,
  ``attent.theory.seed``, ``mlflow.parentRunId``) with per-iteration metrics (step = iteration)
  ``loss``, ``max_discrepancy``, ``time_method_s`` (wall-clock), ``cpu_method_s``; at the ANTK
  checkpoints ``antk_drift_to_final``, ``antk_drift_to_initial``, ``antk_drift_step``,
  ``antk_drift_alignment_to_final``; at the end ``iterations``, ``final_loss``,
  ``samples_backpropagated``, ``iterations_to_<target>``, ``seconds_to_<target>``,
  ``cpu_seconds_to_<target>``; and ``antk.json`` (the probe kernels at every checkpoint).

The roles are not training roles, so ``attent report`` and the time-to-accuracy analysis leave
these runs alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Metric, Param, RunStatus

from .. import contract
from ..engine.tracking import client_for, driver_tags, git_commit, open_experiment
from ..theory.config import TheoryConfig, flatten
from ..theory.gradients import gradient_check, gradient_table
from ..theory.tangent_kernel import kernel_drift
from ..theory.teaching import RunRecord, run_all
from . import report

TASK_THEORY = "theory"  # attent.task of the lab's runs


@dataclass
class TheoryResult:
    run_id: str
    tracking_uri: str
    summary: dict
    markdown: str  # gradient check + teaching and ANTK tables, as written to summary.md
    records: list[RunRecord]


def run_experiment(cfg: TheoryConfig, *, out: str | Path | None = None, progress=print) -> TheoryResult:
    """Gradient check, teaching runs, summary, figures; everything into one MLflow parent run: the store
    resolved and checked as an experiment's (``TheoryConfig.resolved``, ``preflight.check_theory``)."""
    from ..engine.preflight import check_theory

    cfg = cfg.resolved()
    check_theory(cfg)
    uri = cfg.mlflow.tracking_uri
    client = client_for(uri)
    experiment_id = open_experiment(client, cfg.mlflow.experiment, uri)
    parent = client.create_run(
        experiment_id,
        run_name=cfg.name,
        tags={
            contract.TAG_ROLE: contract.ROLE_THEORY,
            contract.TAG_TASK: TASK_THEORY,
            contract.TAG_GIT_COMMIT: git_commit(),
            **driver_tags(),
        },
    )
    run_id = parent.info.run_id
    try:
        _log_params(client, run_id, cfg)
        load_before = os.getloadavg()[0]
        grad_md = gradient_table(gradient_check())
        progress("gradient check (closed form vs autograd, float64):\n" + grad_md)
        started = time.perf_counter()
        records = run_all(cfg, progress)
        seconds = time.perf_counter() - started
        summary = report.summarize(records, cfg)
        context = (
            f"{len(cfg.seeds)} seeds, {seconds:.0f}s for all runs; 1-minute load average "
            f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs"
        )
        markdown = _markdown(cfg, summary, grad_md, context)
        for record in records:
            _log_child(client, experiment_id, run_id, record, cfg)
        _log_parent(client, run_id, cfg, summary, markdown, grad_md, records, out)
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    except BaseException:
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
        raise
    return TheoryResult(run_id, uri, summary, markdown, records)


def _markdown(cfg: TheoryConfig, summary: dict, grad_md: str, context: str) -> str:
    p, t = cfg.problem, cfg.teach
    return "\n".join(
        [
            f"# {cfg.name}",
            "",
            f"{p.kind}-attention learner, N={p.num_sequences} sequences of n={p.seq_len} elements, d={p.dim}, "
            f"d_k={p.key_dim}, d_v={p.value_dim}; f* weight scale {p.target_scale:g}, learner init scale "
            f"{p.init_scale:g}; SGD lr={t.lr:g}, m={t.subset}, T={t.max_iterations}, ε={t.epsilon:g}; "
            f"ANTK on {cfg.kernel.probe} probe sequences every {cfg.kernel.every} iterations. {context}.",
            "",
            "Cells: mean ± std over the seeds (and how many seeds reached the target); wall-clock and CPU "
            "time are the teaching rule's own work (greedy: scoring the dense set + selection + update), evaluation "
            "excluded; CPU time (one torch thread) is what the wall-clock would be on an idle core.",
            "",
            report.summary_markdown(summary, cfg),
            "",
            "## Gradient check (closed form vs autograd, float64, max over 3 draws)",
            "",
            grad_md,
            "",
        ]
    )


def _log_params(client, run_id: str, cfg: TheoryConfig) -> None:
    params = [Param(k, json.dumps(v) if isinstance(v, list) else str(v)) for k, v in flatten(cfg).items()]
    client.log_batch(run_id, params=params)
    client.log_dict(run_id, dataclasses.asdict(cfg), "config.json")


def _target_metrics(record: RunRecord, cfg: TheoryConfig) -> dict[str, float]:
    metrics = {}
    for target in cfg.teach.target_losses:
        iterations, seconds, cpu_seconds = record.to_target(target)
        if iterations is not None:
            metrics[f"iterations_to_{target:g}"], metrics[f"seconds_to_{target:g}"] = iterations, seconds
            metrics[f"cpu_seconds_to_{target:g}"] = cpu_seconds
    return metrics


def _log_child(client, experiment_id: str, parent_id: str, record: RunRecord, cfg: TheoryConfig) -> None:
    run = client.create_run(
        experiment_id,
        run_name=f"{record.rule}-seed{record.seed}",
        tags={
            contract.TAG_ROLE: contract.ROLE_THEORY_RUN,
            contract.TAG_TASK: TASK_THEORY,
            contract.TAG_PARENT_RUN_ID: parent_id,
            contract.TAG_THEORY_METHOD: record.rule,
            contract.TAG_THEORY_SEED: str(record.seed),
        },
    )
    now = int(time.time() * 1000)
    metrics = [
        Metric(name, value, now, step)
        for step in range(len(record.loss))
        for name, value in (
            ("loss", record.loss[step]),
            ("max_discrepancy", record.max_discrepancy[step]),
            ("time_method_s", record.time_s[step]),
            ("cpu_method_s", record.cpu_s[step]),
        )
    ]
    drift = kernel_drift(record.kernels)
    metrics += [
        Metric(f"antk_drift_{kind}", values[k], now, step)
        for kind, values in drift.items()
        for k, step in enumerate(record.kernel_iterations)
    ]
    final = {
        "iterations": record.iterations,
        "final_loss": record.loss[-1],
        "samples_backpropagated": record.samples_backpropagated,
        **_target_metrics(record, cfg),
    }
    metrics += [Metric(name, float(value), now, record.iterations) for name, value in final.items()]
    params = [Param("method", record.rule), Param("seed", str(record.seed))]
    for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
        client.log_batch(run.info.run_id, metrics=metrics[start : start + 1000], params=params if not start else [])
    client.log_dict(
        run.info.run_id,
        {"iterations": record.kernel_iterations, "kernels": [k.tolist() for k in record.kernels]},
        "antk.json",
    )
    client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))


def _log_parent(
    client,
    run_id: str,
    cfg: TheoryConfig,
    summary: dict,
    markdown: str,
    grad_md: str,
    records: list[RunRecord],
    out: str | Path | None,
) -> None:
    now, metrics = int(time.time() * 1000), []
    for rule, row in summary.items():
        values = {
            "final_loss": row["final_loss"]["mean"],
            "ms_per_iteration": row["ms_per_iteration"]["mean"],
            "cpu_ms_per_iteration": row["cpu_ms_per_iteration"]["mean"],
        }
        for target, hit in row["targets"].items():
            values[f"iterations_to_{float(target):g}"] = hit["iterations"]["mean"]
            values[f"seconds_to_{float(target):g}"] = hit["seconds"]["mean"]
            values[f"cpu_seconds_to_{float(target):g}"] = hit["cpu_seconds"]["mean"]
        metrics += [Metric(f"{rule}.{name}", float(v), now, 0) for name, v in values.items() if v is not None]
    client.log_batch(run_id, metrics=metrics)
    client.log_text(run_id, markdown, "summary.md")
    client.log_text(run_id, grad_md, "gradient_check.md")
    client.log_dict(run_id, summary, "summary.json")
    out = Path(out) if out else None
    if out:
        (out / "figures").mkdir(parents=True, exist_ok=True)
        (out / "summary.md").write_text(markdown)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for name, fig in report.figures(records, cfg).items():
        client.log_figure(run_id, fig, f"figures/{name}.png")
        if out:
            fig.savefig(out / "figures" / f"{name}.png", dpi=110)
        report.close(fig)
