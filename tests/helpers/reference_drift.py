"""How far the reference runs (``shared_runs.py``, beside this file) drift from their record when other CPU
kernels run them: the measurement behind the off-machine tolerance of ``assert_reproduces``.

Each kernel set trains the reference runs in its own process with its own local Ray (two CPUs,
one torch thread per process, as the test suite's Ray), its environment inherited by every Ray
worker; a Ray task on that cluster reports what the workers really run (torch's CPU capability,
the variables, a few kernels' bits). Kernel sets:

- native: what torch picks here;
- avx2: ``ATEN_CPU_CAPABILITY=avx2`` (ATen's own vectorised kernels at AVX2);
- avx2-all: that, plus MKL and oneDNN held to AVX2 (``MKL_ENABLE_INSTRUCTIONS``,
  ``ONEDNN_MAX_CPU_ISA``): as much of an AVX2-only machine as one machine can emulate. (MKL's
  code paths for AMD processors cannot be emulated on Intel.)
- default: ATen without vector instructions (no CI machine runs this): stored held out
  (``--held-out``), a check of the tolerance that the others set.

The report gives, per run and metric, the largest relative and absolute deviation over the
epochs (and the epoch where the relative one peaks) of each kernel set from the record, and of
each set from ``native``; and whether every re-selection's subset matched the record. With
``--lr-scale``, the runs are trained once more (native kernels) at that multiple of their
learning rate: a real change, for scale.

``--update-tests`` writes the histories into ``tests/reference_drift.json``, from which
``shared_runs.py`` derives the tolerance off the recording's kernels; kernel sets measured
on other machines against the same record stay there (a run re-recorded starts afresh).

Run from the clone's root, as a module of the tests' package:

    python -m tests.helpers.reference_drift --update-tests --lr-scale 1.1 \\
        --json tests/results/reference_drift.json --md tests/results/reference_drift.md
    python -m tests.helpers.reference_drift --runs digits-full --kernels native avx2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers.paths import REPO

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2"}
KERNELS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": AVX2,
    "avx2-all": {**AVX2, "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default"},  # no vector ISA at all: no CI machine runs this
}
PROBED_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")


def probe() -> dict:
    """Inside a Ray worker: the kernels it runs, and the bits of a few of their results (a
    matmul, a softmax, a layer norm, a GELU: the ViT's ops), which differ where the kernels do."""
    import os

    import torch

    from tests.helpers import shared_runs

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 48, generator=g), torch.randn(48, 96, generator=g)
    y = x @ w
    outs = {
        "matmul": y,
        "softmax": torch.softmax(y, -1),
        "layer_norm": torch.nn.functional.layer_norm(y, (96,)),
        "gelu": torch.nn.functional.gelu(y),
    }
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_kernels": shared_runs.cpu_kernels(),
        "env": {k: os.environ.get(k) for k in PROBED_ENV},
        "bits": {k: v.double().sum().item().hex() for k, v in outs.items()},
    }


def experiment(name: str, root: Path, lr_scale: float | None):
    """Reference run ``name``, at ``lr_scale`` times its learning rate if given (the task's
    default where the run sets none)."""
    from tests.helpers import shared_runs

    cfg = shared_runs.reference_experiment(name, root)
    if not lr_scale:
        return cfg
    from attent.tasks.registry import build_task

    lr = cfg.train.lr or build_task(cfg.task, seed=cfg.seed).optimizer_spec().lr
    return shared_runs.reference_experiment(
        name, root, overrides={"name": f"{name}-lr{lr_scale:g}", "train": {"lr": lr * lr_scale}}
    )


def child(kernels: str, runs: list[str], out: Path, lr_scale: float | None) -> None:
    """Train ``runs`` under this process's environment (at ``lr_scale`` times their learning
    rate if given); write their histories and the probe."""
    import ray
    from attent.engine.driver import ensure_ray

    from tests.helpers import shared_runs

    root = Path(tempfile.mkdtemp(prefix=f"reference-drift-{kernels}-"))
    ensure_ray(shared_runs.reference_experiment(runs[0], root))
    result = {
        "kernels": kernels,
        "driver": probe(),
        "worker": ray.get(ray.remote(num_cpus=1)(probe).remote()),
        "runs": {},
    }
    for name in runs:
        start = time.perf_counter()
        run = shared_runs.train_run(experiment(name, root, lr_scale), root / "read")
        result["runs"][name] = {
            "epochs": shared_runs.untimed(run.epochs),
            "subsets": run.subsets,
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(f"[{kernels}] {name}: {result['runs'][name]['seconds']} s", file=sys.stderr, flush=True)
    ray.shutdown()
    out.write_text(json.dumps(result))


def deviation(got: float, want: float) -> tuple[float, float]:
    """(absolute, relative) deviation; the relative one against the larger magnitude."""
    diff = abs(got - want)
    scale = max(abs(got), abs(want))
    return diff, (diff / scale if scale else 0.0)


def compare(got: list[dict], want: list[dict]) -> dict[str, dict]:
    """Per metric of ``want``: the largest absolute and relative deviation over the epochs."""
    table: dict[str, dict] = {}
    for epoch, (row, ref) in enumerate(zip(got, want), start=1):
        for key, value in ref.items():
            if key == "epoch" or key not in row:
                continue
            absolute, relative = deviation(row[key], value)
            cell = table.setdefault(key, {"abs": 0.0, "rel": 0.0, "epoch": None, "per_epoch_rel": []})
            cell["per_epoch_rel"].append(relative)
            if relative > cell["rel"]:
                cell["rel"], cell["epoch"] = relative, epoch
            cell["abs"] = max(cell["abs"], absolute)
    return table


def report(results: dict[str, dict], record: dict) -> dict:
    out = {
        "machine": results[next(iter(results))]["driver"]["cpu_kernels"],
        "record": {n: r["recorded_with"] for n, r in record.items()},
        "kernels": {k: {"env": r["env"], "worker": r["worker"]} for k, r in results.items()},
        "runs": {},
    }
    for name in dict.fromkeys(n for r in results.values() for n in r["runs"]):
        entry = out["runs"][name] = {}
        for k, r in results.items():
            if name not in r["runs"]:
                continue
            run = r["runs"][name]
            entry[k] = {
                "seconds": run["seconds"],
                "subsets_match_record": run["subsets"] == record[name]["subsets"],
                "vs_record": compare(run["epochs"], record[name]["epochs"]),
            }
            if k != "native" and name in results.get("native", {}).get("runs", {}):
                native = results["native"]["runs"][name]
                entry[k]["subsets_match_native"] = run["subsets"] == native["subsets"]
                entry[k]["vs_native"] = compare(run["epochs"], native["epochs"])
    return out


def markdown(out: dict, tolerances: dict[str, list[dict]]) -> str:
    lines = [
        "# Reference runs' drift across CPU kernels\n",
        f"Machine: {out['machine']}. Record: {sorted(set(out['record'].values()))}.\n",
        "Kernels as a Ray worker saw them: "
        + "; ".join(
            f"{k}: {v['worker']['cpu_capability']} {dict((e, x) for e, x in v['worker']['env'].items() if x)}"
            for k, v in out["kernels"].items()
        )
        + "\n",
        "Largest deviation over the epochs: relative (epoch where it peaks) / absolute. "
        "`=` is bit for bit. `default` (ATen without vector instructions) is held out of the tolerance, "
        "a check of it; `native lr x…` is a real change, for scale. Seconds: wall-clock of each run "
        "on a shared 2-core machine.\n",
    ]
    for name, per_kernel in out["runs"].items():
        kernels = list(per_kernel)
        columns = [f"{k} vs record" for k in kernels] + [
            f"{k} vs native" for k in kernels if "vs_native" in per_kernel[k]
        ]
        lines += [f"\n## {name}\n", "| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
        for metric in per_kernel[kernels[0]]["vs_record"]:
            cells = [cell(per_kernel[k]["vs_record"].get(metric)) for k in kernels]
            cells += [cell(per_kernel[k]["vs_native"].get(metric)) for k in kernels if "vs_native" in per_kernel[k]]
            lines.append(f"| {metric} | " + " | ".join(cells) + " |")
        lines.append(
            "\nSubsets equal to the record: "
            + ", ".join(f"{k} {'yes' if v['subsets_match_record'] else 'NO'}" for k, v in per_kernel.items())
            + ". Seconds: "
            + ", ".join(f"{k} {v['seconds']}" for k, v in per_kernel.items())
            + "."
        )
        if name in tolerances:
            lines.append(
                "\nTolerance off the recording's kernels (`shared_runs`), relative, epoch by epoch, "
                "where the drift sets it above the floor (rel 1e-5): "
                + "; ".join(
                    f"{metric} " + ", ".join(f"{t:.1e}" if t else "-" for t in series)
                    for metric, series in tolerances[name].items()
                )
            )
    return "\n".join(lines) + "\n"


def cell(c: dict | None) -> str:
    if c is None:
        return "-"
    if c["abs"] == 0:
        return "="
    return f"{c['rel']:.1e} (e{c['epoch']}) / {c['abs']:.1e}"


def update_tests(results: dict[str, dict], record: dict, held_out: set[str]) -> None:
    """Merge the kernel sets' histories into ``shared_runs.DRIFT``: per run, the record they were
    compared with and each set's epochs under its kernels' name (this machine's earlier entries
    replaced, other machines' kept while the record is the same); those in ``held_out`` marked
    so, to check the tolerance without setting it. A set whose subsets differ from the record is
    left out (its run went another way: no drift to measure)."""
    from tests.helpers import shared_runs

    drift = json.loads(shared_runs.DRIFT.read_text()) if shared_runs.DRIFT.exists() else {"runs": {}}
    drift["about"] = (
        "The reference runs trained under other CPU kernels (tests/helpers/reference_drift.py "
        "--update-tests): tests/helpers/shared_runs.py derives the off-machine tolerance from them."
    )
    for name in dict.fromkeys(n for r in results.values() for n in r["runs"]):
        entry = drift["runs"].get(name)
        if entry is None or entry["record"] != record[name]["epochs"]:
            entry = drift["runs"][name] = {"record": record[name]["epochs"], "kernels": {}}
        for k, r in results.items():
            run = r["runs"].get(name)
            if run is None:
                continue
            if run["subsets"] != record[name]["subsets"]:
                print(
                    f"[{k}] {name}: subsets differ from the record, left out of {shared_runs.DRIFT.name}",
                    file=sys.stderr,
                )
                continue
            entry["kernels"][f"{r['worker']['cpu_kernels']} ({k})"] = {
                "env": r["env"],
                "epochs": run["epochs"],
                **({"held_out": True} if k in held_out else {}),
            }
    shared_runs.DRIFT.write_text(json.dumps(drift, indent=1, sort_keys=True) + "\n")


def tolerance_table(runs: list[str]) -> dict[str, dict[str, list[float]]]:
    """Per run and metric, the off-machine tolerance per epoch relative to the recorded value,
    for the metrics whose measured drift sets it above the floor somewhere."""
    from tests.helpers import shared_runs

    table = {}
    for name in runs:
        try:
            shared_runs.drift_envelope(name)  # a run without a measured drift has no table
        except AssertionError:
            continue
        want = shared_runs.recorded(name)["epochs"]
        table[name] = {}
        for key in want[-1]:
            series = [
                max(shared_runs.drift_tolerance(name, e, key) / abs(row[key]), shared_runs.REL_FLOOR)
                if row.get(key)
                else None
                for e, row in enumerate(want)
            ]
            if any(t and t > shared_runs.REL_FLOOR for t in series):
                table[name][key] = series
    return table


def parse_args() -> argparse.Namespace:
    """The command line: which runs and kernel sets, what to write, and the child's own options."""
    from tests.helpers import shared_runs

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=list(shared_runs.REFERENCE_RUNS))
    parser.add_argument("--kernels", nargs="*", default=["native", "avx2", "avx2-all"], choices=list(KERNELS))
    parser.add_argument(
        "--lr-scale",
        type=float,
        help="also train the runs at this multiple of their learning rate, native kernels: a real change, for scale",
    )
    parser.add_argument(
        "--update-tests", action="store_true", help=f"merge the histories into tests/{shared_runs.DRIFT.name}"
    )
    parser.add_argument(
        "--held-out",
        nargs="*",
        default=["default"],
        choices=list(KERNELS),
        help="kernel sets stored held out: checked against the tolerance, not setting it",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    parser.add_argument("--raw", type=Path, help="also keep every run's histories here (one JSON per kernel set)")
    parser.add_argument("--from-raw", type=Path, help="report on histories kept by --raw, training nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def train_in_child(label: str, kernel_env: dict[str, str], lr_scale: float | None, runs: list[str], raw: Path) -> None:
    """Train ``runs`` in a child process under the kernel set's environment; it writes its result to ``raw``."""
    raw.parent.mkdir(parents=True, exist_ok=True)
    # the clone's root: the child and its Ray workers import tests.helpers.shared_runs
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **kernel_env}
    env.pop("RAY_ADDRESS", None)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.helpers.reference_drift",
            "--child",
            label,
            "--out",
            str(raw),
            "--runs",
            *runs,
            *(["--lr-scale", str(lr_scale)] if lr_scale else []),
        ],
        env=env,
        cwd=REPO,
        check=True,
    )


def kernel_set_results(args: argparse.Namespace, runs: list[str]) -> dict[str, dict]:
    """Per kernel set (and the learning-rate scale's, if asked): its result, trained in a child
    process or read from ``--from-raw``, with the set's environment."""
    sets = [(k, KERNELS[k], None) for k in args.kernels]
    if args.lr_scale:
        sets.append((f"native lr x{args.lr_scale:g}", KERNELS["native"], args.lr_scale))
    results = {}
    for label, kernel_env, lr_scale in sets:
        raw = (args.from_raw or args.raw or Path(tempfile.mkdtemp())) / f"{label.replace(' ', '-')}.json"
        if not args.from_raw:
            train_in_child(label, kernel_env, lr_scale, runs, raw)
        results[label] = {**json.loads(raw.read_text()), "env": kernel_env}
        worker = results[label]["worker"]
        print(f"[{label}] Ray worker: {worker['cpu_capability']}, {worker['env']}, {worker['bits']}", file=sys.stderr)
    return results


def main() -> None:
    from tests.helpers import shared_runs

    args = parse_args()
    if args.child:
        return child(args.child, args.runs, args.out, args.lr_scale)
    runs = [n for n in args.runs if n != "llm" or (shared_runs.SHARED / "datasets/gsm8k/train.jsonl").exists()]
    results = kernel_set_results(args, runs)
    record = json.loads(shared_runs.RECORD.read_text())
    if args.update_tests:
        update_tests({k: r for k, r in results.items() if k in KERNELS}, record, set(args.held_out))
    out = report(results, record)
    out["tolerance"] = tolerance_table(runs)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    text = markdown(out, out["tolerance"])
    if args.md:
        args.md.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
