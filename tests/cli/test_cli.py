"""The command line as a user meets it: `attent validate` reads the YAML before importing any
heavy library, and validates sweep files by expanding and checking every trial."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from attent.cli import extras
from attent.cli.main import main

from tests.helpers.paths import REPO

SWEEPS = sorted((REPO / "experiments" / "sweeps").glob("*.yaml"))
HEAVY = ("torch", "ray", "transformers", "timm", "mlflow", "datasets", "peft")
# In a fresh interpreter: run the CLI, then report its exit code and the heavy modules it loaded.
PROBE = """
import json, sys
from attent.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted(m for m in {HEAVY!r} if m in sys.modules)}))
""".replace("{HEAVY!r}", repr(HEAVY))


def run_cli_probe(*args: str, cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


@pytest.mark.parametrize(
    "text,message",
    [
        ("name: x\ntask: {name: vision}\ntrain: {epochs: 0}\n", "train.epochs"),
        ("name: x\ntask: {name: nosuchtask}\ntrain: {epochs: 1}\n", "task"),
        ("name: x\ntask: {name: vision}\ntrain: {epochs: 1}\nselection: {ratio: {start: 1.5}}\n", "ratio"),
    ],
)
def test_a_bad_file_is_refused_before_any_heavy_import(text, message, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = run_cli_probe("validate", str(path), cwd=tmp_path)
    assert result["code"] == 2 and message in result["stderr"]
    assert result["loaded"] == []  # refused before torch, Ray, MLflow, timm...


def test_overrides_after_an_option_are_overrides(tmp_path):
    """`attent bench spec.yaml --workload w train.epochs=3`: argparse gives the positional list
    only the words before the first option; the rest are overrides all the same."""
    result = run_cli_probe(
        "validate", str(REPO / "experiments/digits_vit.yaml"), "--decode", "train.epochs=0", cwd=tmp_path
    )
    assert result["code"] == 2 and "train.epochs" in result["stderr"], result["stderr"]
    assert "unrecognized" not in result["stderr"]
    bogus = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from attent.cli.main import main; sys.exit(main())",
            "validate",
            str(REPO / "experiments/digits_vit.yaml"),
            "--decode",
            "--bogus",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert bogus.returncode == 2 and "unrecognized arguments: --bogus" in bogus.stderr


def test_a_report_of_a_missing_store_is_refused_without_making_one(tmp_path):
    """A mistyped --tracking-uri made MLflow create an empty store (and its folder) in 5 s, then
    reported that the experiment did not exist."""
    store = tmp_path / "typo" / "mlflow.db"
    result = run_cli_probe("report", "--experiment", "x", "--tracking-uri", f"sqlite:///{store}", cwd=tmp_path)
    assert result["code"] == 2 and f"no MLflow store at {store}" in result["stderr"], result["stderr"]
    assert not store.parent.exists() and "mlflow" not in result["loaded"]


def test_a_good_file_is_validated_without_torch(tmp_path):
    result = run_cli_probe("validate", str(REPO / "experiments/digits_vit.yaml"), cwd=tmp_path)
    assert result["code"] == 0, result["stderr"]
    assert "torch" not in result["loaded"] and "mlflow" not in result["loaded"]


@pytest.mark.parametrize("path", [p for p in SWEEPS if "gpu" not in p.name], ids=lambda p: p.name)
def test_every_offline_sweep_file_validates(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if "scenes" in path.name:  # its data: what `attent data scenes --out data/scenes` writes
        from attent.tasks.mae import scenes

        scenes.write_dataset(tmp_path / "data" / "scenes", train=10, test=5, size=32, workers=1)
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    trials = [line for line in out.splitlines() if line.startswith("  t")]
    assert out.startswith(f"{path}: OK — sweep ") and len(trials) >= 2


def test_a_sweep_with_one_bad_trial_names_it(tmp_path, capsys):
    (tmp_path / "sweep.yaml").write_text(
        f"sweep:\n  name: s\n  base: {REPO / 'experiments/digits_vit.yaml'}\n"
        "  grid:\n    selection.ratio.end: [0.8, 1.7]\n"
    )
    assert main(["validate", str(tmp_path / "sweep.yaml")]) == 2
    err = capsys.readouterr().err
    assert "trial t01" in err and "1.7" in err and "t00" not in err


@pytest.mark.parametrize(
    "command",
    [
        ["train"],
        ["validate"],
        ["sweep"],
        ["bench"],
        ["bench", "--dry-run"],
        ["theory"],
        ["downstream", "--run-id", "0123abcd"],
    ],
    ids=" ".join,
)
def test_a_missing_file_is_refused_in_one_line_before_any_heavy_import(command, tmp_path):
    """Every command that reads a file names the missing one and the fix, exit 2, before it
    imports Ray, torch or MLflow (Ray alone took `attent sweep` 9.5 s to refuse it)."""
    result = run_cli_probe(*command, "missing.yaml", cwd=tmp_path)
    assert result["code"] == 2
    (line,) = result["stderr"].strip().splitlines()
    assert line == (
        f"attent {command[0]}: error: config file 'missing.yaml' does not exist (looked in "
        f"{tmp_path}). Fix: give the path of a YAML file, e.g. experiments/digits_vit.yaml"
    )
    assert result["loaded"] == []


@pytest.mark.parametrize("mode,bars", [("plain", False), ("live", False), ("stream", True)])
def test_a_quiet_console_turns_the_workers_hugging_face_progress_bars_off(mode, bars):
    """A Train worker's environment under each console: transformers' and datasets' own bars are off
    unless the user asked for the full stream (--verbose). A bar's updates end no line, so Ray
    forwarded an interrupted run's "Loading weights" bar to the terminal after its log closed."""
    import os

    from attent.engine.driver import worker_env_vars
    from attent.engine.progress import Console

    env = {k: v for k, v in os.environ.items() if not k.endswith("_DISABLE_PROGRESS_BARS")}
    probe = (
        "import datasets; from transformers.utils import logging; "
        "print(logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        env=env | worker_env_vars(Console(mode)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.split() == [str(bars), str(bars)], proc.stderr[-2000:]


EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
RELEASED = "once attent is released on PyPI, "  # what follows names the PyPI install, for after a release


def fix_lines(monkeypatch, tmp_path) -> dict[str, str]:
    """Every message that names an install: the missing extra's (run from this clone, and from an install
    that is not one), `attent demo`'s without its benchmark, `attent server --auth` without Flask-WTF."""
    import importlib.metadata

    from attent.cli import demo
    from attent.experiment.schema import ConfigError
    from attent.server.auth import NEEDS_EXTRA

    found = {"extra, in a clone": extras.install_line("platform")}
    monkeypatch.setattr(extras, "CLONE", tmp_path)  # site-packages' parent folders: no pyproject.toml
    found["extra, not in a clone"] = extras.install_line("platform")
    monkeypatch.setattr(demo, "CLONE", tmp_path)

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ConfigError) as refused:
        demo.demo_benchmark()
    found["demo"] = str(refused.value)
    found["server"] = NEEDS_EXTRA
    return found


def test_every_fix_line_names_an_install_that_works_before_a_release(monkeypatch, tmp_path):
    """The fix lines said `pip install 'attent[platform]'`, which finds nothing while no release is on
    PyPI: each now names an install from a clone (or MLflow's own extra) first, and the PyPI line only
    as what it will be once released, as the README and docs/getting-started.md do."""
    lines = fix_lines(monkeypatch, tmp_path)
    assert lines["extra, in a clone"].startswith(f"pip install -e {shlex.quote(f'{REPO}[platform]')} (this clone")
    assert lines["extra, not in a clone"].startswith("from a clone of attent's repository, pip install '.[platform]'")
    assert "pip install --force-reinstall '.[platform]'" in lines["demo"] and "make demo" in lines["demo"]
    assert "pip install 'mlflow[auth]'" in lines["server"] and "pip install -e '.[server]'" in lines["server"]
    for name, line in lines.items():
        today, _, released = line.partition(RELEASED)
        assert "pip install" in today and "'attent[" not in today, f"{name}: {line}"  # no PyPI line before it
        assert re.fullmatch(r"pip install (--force-reinstall )?'attent\[(\w+)\]'\)?", released), f"{name}: {line}"
        named = set(re.findall(r"\[(\w+)\]", line)) - {"auth"}  # mlflow[auth]: MLflow's own extra
        assert named <= set(EXTRAS), f"{name}: {line}"
