"""One GPU check, one command, within a time budget (default 480 s) on one GPU node: the GPU tests, the
rehearsals of the paper-scale MAE file and of the LLaMA-2 milestone sweep on the GPU, `attent plan
--measure` of the MAE ViT-B and of the 7B-shaped LoRA, the input pipeline's samples per second of one
loader process, and AtteNTTrainer's realized and ideal saving under the `llm` and `vit` presets.

    make gpu-check                                   # = python benchmarks/gpu/gpu_check.py
    python benchmarks/gpu/gpu_check.py --budget-s 480 --out DIR
    python benchmarks/gpu/gpu_check.py --cpu --out /tmp/gpu-check   # every step at its smallest, on the CPU

Each step (``gpu_check_steps.STEPS``) runs as a subprocess of its own, in a new session, with a time
limit: its weight's share of the budget left when it starts (what a fast step leaves goes to the
later ones); one over its limit is stopped, with every process it started (Ray's too), and recorded
as timed out, and the next step starts. The rehearsals and the plans read a folder standing for the
cluster's shared storage (the tests' stand-in: a few samples of each data set, a Hugging Face cache
with the models' configs and a tokenizer), built first from the GSM8K and MBPP mirror beside the
clone (``--datasets``); the node needs no network.

Writes ``gpu_check.json`` (the machine: GPU, CPU model, date, commit; each step's status, seconds,
limit and figures; the last lines of a step that did not pass) and ``gpu_check.md`` (a table of the
steps) into ``--out``, by default ``benchmarks/results/gpu_check/``. Exit 1 when a step failed or
timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402
from gpu_check_steps import STEPS, Context, Step, remove, write_shim  # noqa: E402 -- beside this script

OUT = harness.RESULTS / "gpu_check"
GPU_BUDGET_S, CPU_BUDGET_S = 480.0, 1500.0  # the CPU's rehearsals alone take minutes on two loaded cores
TAIL_LINES = 30
MACHINE_CODE = "import json, runpy; print(json.dumps(runpy.run_path('benchmarks/harness.py')['machine']()))"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--budget-s", type=float, default=None, help="the whole check's seconds (GPU: 480, --cpu: 1500)"
    )
    parser.add_argument("--cpu", action="store_true", help="every step at its smallest on the CPU (no CUDA needed)")
    parser.add_argument("--out", type=Path, default=OUT, help="where gpu_check.json and gpu_check.md go")
    parser.add_argument(
        "--datasets", type=Path, default=None, help="the GSM8K/MBPP mirror (default: ../shared/datasets)"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temp one, removed)")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in STEPS], help="these steps (and the storage)")
    args = parser.parse_args(argv)
    args.budget_s = args.budget_s or (CPU_BUDGET_S if args.cpu else GPU_BUDGET_S)
    return args


def default_datasets() -> Path | None:
    """The tests' mirror beside the clone, else one copied into the repository's shared/ (what travels
    to a lent GPU node with the working tree)."""
    for folder in (harness.REPO.parent / "shared" / "datasets", harness.REPO / "shared" / "datasets"):
        if folder.is_dir():
            return folder
    return None


def base_env(ctx: Context) -> dict[str, str]:
    """Every step's environment: the working tree's package and tests importable, `attent` on PATH,
    output unbuffered (a stopped step keeps what it printed)."""
    env = dict(os.environ)
    paths = [str(ctx.repo / "platform"), str(ctx.repo), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PATH"] = os.pathsep.join((str(ctx.shim), str(Path(sys.executable).parent), env.get("PATH", "")))
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("RAY_ADDRESS", None)  # each step's Ray is its own
    return env


def step_env(ctx: Context, step: Step, folder: Path) -> dict[str, str]:
    env = base_env(ctx)
    if step.needs_storage:  # a job's environment on the cluster, its shared storage the stand-in
        env |= ctx.job_env | {"MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    return env


def session_members(session: int) -> list[int]:
    """The processes of ``session`` (a step's, started in a new one): Ray moves its own processes to
    process groups of their own, but not out of the session."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == session and fields[0] != "Z":  # a zombie is gone, only not yet reaped
                members.append(int(entry.name))
    return members


def stop_session(session: int, grace_s: float = 10.0) -> None:
    """SIGTERM to every process of the step's session (a Ray driver shuts its cluster down on it),
    then SIGKILL to what is left after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        members = session_members(session) if Path("/proc").is_dir() else [session]
        for pid in members:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while wait and time.monotonic() < deadline and session_members(session):
            time.sleep(0.5)


def run_step(ctx: Context, step: Step, limit: float) -> dict[str, Any]:
    """One step in a session of its own, stopped at ``limit`` seconds; its record."""
    folder = ctx.work / step.name
    folder.mkdir(parents=True, exist_ok=True)
    command = step.command(ctx, folder)
    if isinstance(command, str):
        return {"status": "skipped", "seconds": 0.0, "limit_s": round(limit), "figures": {"summary": command}}
    log = folder / "output.log"
    start = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=ctx.repo, env=step_env(ctx, step, folder), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            code: int | None = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = None
        stop_session(process.pid, grace_s=10.0 if code is None else 0.0)  # what it left running, too
        process.wait()
    seconds = time.monotonic() - start
    output = log.read_text(errors="replace")
    status = "timed out" if code is None else "passed" if code == 0 else "failed"
    try:
        figures = step.figures(ctx, folder, output) if status == "passed" else {}
    except Exception as exc:  # noqa: BLE001 -- a step that ran but wrote no figures: recorded, not fatal
        status, figures = "failed", {"summary": f"its figures could not be read: {type(exc).__name__}: {exc}"}
    status = figures.pop("status", status)
    record = {"status": status, "seconds": round(seconds, 1), "limit_s": round(limit), "command": command_text(command)}
    stopped = f"stopped at its limit of {limit:.0f} s; its last line: " if code is None else ""
    record["figures"] = figures or {"summary": stopped + (last_line(output) or f"exit {code}")}
    if status in ("failed", "timed out"):
        record["tail"] = output.splitlines()[-TAIL_LINES:]
    return record


def command_text(command: list[str]) -> str:
    """The command as a reader would type it (paths in the repository relative to it, the storage
    step's inline code abbreviated)."""
    shown = ["python" if arg == sys.executable else arg.replace(f"{harness.REPO}/", "") for arg in command]
    return " ".join("<code>" if "\n" in arg else arg for arg in shown)


def last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def run_all(ctx: Context, steps: list[Step], budget_s: float, started: float) -> dict[str, dict[str, Any]]:
    """Each step in turn, its limit its weight's share of what is left of the budget."""
    records: dict[str, dict[str, Any]] = {}
    for index, step in enumerate(steps):
        left = budget_s - (time.monotonic() - started)
        limit = max(1.0, left * step.weight / sum(s.weight for s in steps[index:]))
        if step.needs_storage and records.get("storage", {}).get("status") != "passed":
            record = {"status": "skipped", "seconds": 0.0, "limit_s": round(limit),
                      "figures": {"summary": "needs the stand-in storage, which was not built"}}  # fmt: skip
        else:
            print(f"[gpu-check] {step.name}: up to {limit:.0f} s ...", flush=True)
            record = run_step(ctx, step, limit)
        records[step.name] = {"title": step.title, **record}
        print(f"[gpu-check] {step.name}: {record['status']} in {record['seconds']:.0f} s: "
              f"{record['figures'].get('summary', '')}", flush=True)  # fmt: skip
    return records


def machine(ctx: Context, cpu: bool) -> dict[str, Any]:
    """The machine (harness.machine: GPU name from torch.cuda.get_device_name, CPU model, date, commit),
    read in a subprocess: this process never holds a CUDA context the steps would share the GPU with."""
    done = subprocess.run(
        [sys.executable, "-c", MACHINE_CODE],
        cwd=ctx.repo,
        env=base_env(ctx),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode:
        raise SystemExit(f"gpu-check: the machine could not be read: {done.stderr.strip()[-500:]}")
    info = json.loads(done.stdout.strip().splitlines()[-1])
    if not cpu and not info.get("gpu"):
        raise SystemExit("gpu-check: no CUDA device is visible here; --cpu runs every step at its smallest on the CPU")
    return info


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def page(report: dict[str, Any]) -> str:
    """gpu_check.md: the machine, the budget, a row per step, then the end of each failed step's output."""
    steps = report["steps"]
    counts = {s: sum(r["status"] == s for r in steps.values()) for s in ("passed", "failed", "timed out", "skipped")}
    lines = [
        "# GPU check",
        "",
        f"`{report['command']}`",
        "",
        harness.machine_line(report["machine"]),
        "",
        f"{report['mode']}; budget {report['budget_s']:.0f} s, used {report['seconds']:.0f} s; "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + ". Each step's limit is its share of the budget left when it started.",
        "",
        "| step | status | seconds (limit) | figures |",
        "|---|---|---:|---|",
    ]
    for record in steps.values():
        seconds = f"{record['seconds']:.0f} ({record['limit_s']})"
        lines.append(f"| {record['title']} | {record['status']} | {seconds} | {cell(record['figures']['summary'])} |")
    for name, record in steps.items():
        if record.get("tail"):
            lines += ["", f"## {name}: {record['status']}", "", f"`{record['command']}`", "", "```"]
            lines += [*record["tail"][-12:], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    ctx = Context(harness.REPO, work, args.cpu, args.datasets or default_datasets(), write_shim(work / "bin"))
    chosen = [s for s in STEPS if not args.only or s.name in args.only]
    if any(s.needs_storage for s in chosen) and STEPS[0] not in chosen:
        chosen.insert(0, STEPS[0])  # the stand-in storage those steps read
    try:
        info = machine(ctx, args.cpu)
        where = info.get("gpu") or info["cpu"]
        print(f"[gpu-check] {len(chosen)} steps within {args.budget_s:.0f} s on {where}", flush=True)
        records = run_all(ctx, chosen, args.budget_s, started)
    finally:
        if args.workdir is None:
            remove(work)
    report = {
        "command": harness.command_line(argv),
        "mode": "CPU (--cpu: every step at its smallest)" if args.cpu else "GPU",
        "machine": info,
        "budget_s": args.budget_s,
        "seconds": round(time.monotonic() - started, 1),
        "steps": records,
    }
    harness.write_json(args.out / "gpu_check.json", report)
    (args.out / "gpu_check.md").write_text(page(report))
    print(f"[gpu-check] {report['seconds']:.0f} s; written: {args.out / 'gpu_check.json'}, gpu_check.md", flush=True)
    return 1 if any(r["status"] in ("failed", "timed out") for r in records.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
