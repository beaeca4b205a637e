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
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(900)
PLATFORM_PACKAGES = ("ray", "mlflow")


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


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
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "out", source)
    built = {path.suffix if path.suffix == ".whl" else ".tar.gz": path for path in (tmp / "out").iterdir()}
    assert set(built) == {".whl", ".tar.gz"}
    return built


def test_the_wheel_and_sdist_pass_twine_check(dist):
    done = run(sys.executable, "-m", "twine", "check", "--strict", *dist.values())
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_sdist_ships_no_experiment_or_workplace_path(dist):
    import tarfile

    with tarfile.open(dist[".tar.gz"]) as sdist:
        names = [name.partition("/")[2] for name in sdist.getnames()]
    assert [n for n in names if n.startswith(("experiments/", "benchmarks/", "tests/", "examples/"))] == []
    assert "platform/attent/selection/teacher.py" in names and "analysis/stats.py" in names


def test_the_wheel_holds_one_package_with_the_report_inside(dist):
    """analysis/, at the repository's top level, is attent.analysis in the wheel: a user's site-packages gets
    attent and its metadata, no generic top-level ``analysis``."""
    import zipfile

    with zipfile.ZipFile(dist[".whl"]) as wheel:
        names = wheel.namelist()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"attent"}
    for module in ("__init__", "stats", "command", "paper_tables/report", "time_to_accuracy/report"):
        assert f"attent/analysis/{module}.py" in names


def runtime_closure(*names: str) -> dict[str, object]:
    """The installed distributions ``names`` need at run time (their requirements, recursively,
    markers evaluated here, no extras)."""
    found, todo = {}, list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            found[name] = distribution(name)
        except PackageNotFoundError:  # a requirement for another platform or Python
            continue
        for line in found[name].requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def share(folder: Path, names: tuple[str, ...], skip: set[str] = frozenset()) -> list[str]:
    """Symlink into ``folder`` the installed files of ``names`` and of what they need (less
    ``skip``): their top-level packages, modules and dist-info. The distributions shared."""
    folder.mkdir(parents=True, exist_ok=True)
    shared = []
    for name, found in runtime_closure(*names).items():
        if name in skip:
            continue
        shared.append(name)
        site = Path(found.locate_file(""))
        for top in {Path(f).parts[0] for f in found.files or []}:
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not (folder / top).exists():
                (folder / top).symlink_to(site / top)
    return shared


def fresh_venv(path: Path) -> Path:
    """A new venv whose path holds this environment's torch (see the module's docstring)."""
    run(sys.executable, "-m", "venv", path)
    python = path / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    share(path.parent / f"{path.name}-torch", ("torch",))
    (site / "shared_torch.pth").write_text(f"{path.parent / f'{path.name}-torch'}\n")
    return python


def torch_seen(python: Path) -> dict:
    """Where the venv's torch is and its version, as Python and pip see them (without importing it)."""
    code = (
        "import json, importlib.metadata as m, importlib.util as u; "
        "print(json.dumps({'file': u.find_spec('torch').origin, 'version': m.version('torch')}))"
    )
    return json.loads(run(python, "-c", code).stdout)


def installed(python: Path) -> set[str]:
    listed = json.loads(run(python, "-m", "pip", "list", "--format", "json").stdout)
    return {canonicalize_name(p["name"]) for p in listed}


def assert_absent(python: Path, names=PLATFORM_PACKAGES) -> None:
    code = f"import importlib.util; print([n for n in {list(names)!r} if importlib.util.find_spec(n)])"
    assert run(python, "-c", code).stdout.strip() == "[]"


# run in the venv: a script, then the top-level modules it left loaded, as the last line of stdout
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
