"""The ViT factory and VisionTask: config checks, per-sample loss, training, sharded evaluation."""

from __future__ import annotations

import json

import pytest
import timm
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from attent.tasks.vision.config import VisionTaskConfig
from attent.tasks.vision.task import VisionTask
from attent.tasks.vit import PRESETS, build_vit, vit_config
from pydantic import ValidationError
from torch.utils.data import DataLoader

from tests.helpers.ranks import start_method

# 8x8 digits in 2x2 patches of 4x4 pixels: 4 tokens, trains in seconds.
DIGITS = dict(dataset="digits", model={"preset": "vit_tiny_cpu", "patch_size": 4})


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one intra-op thread is as fast and leaves cores to other tests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the ViT factory ------------------------------------------------------------------------


def test_cpu_preset_forward_shape_and_size():
    model = build_vit(vit_config("vit_tiny_cpu", img_size=28, in_chans=1, num_classes=10))

    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert 50_000 < sum(p.numel() for p in model.parameters()) < 500_000
    assert len(model.blocks) == PRESETS["vit_tiny_cpu"]["depth"]


def test_timm_presets_match_timm_models():
    config = vit_config("vit_tiny_patch16_224", img_size=224, in_chans=3, num_classes=1000)
    ours, timms = build_vit(config), timm.create_model("vit_tiny_patch16_224", pretrained=False)

    assert [p.shape for p in ours.parameters()] == [p.shape for p in timms.parameters()]


def test_vit_config_overrides_and_refusals():
    config = vit_config("vit_tiny_cpu", img_size=28, in_chans=3, num_classes=5, patch_size=7, depth=2)
    assert (config.patch_size, config.depth, config.embed_dim) == (7, 2, 64)
    with pytest.raises(ValueError, match="patch_size=5 does not divide img_size=28"):
        vit_config("vit_tiny_cpu", img_size=28, in_chans=1, num_classes=10, patch_size=5)
    with pytest.raises(ValueError, match="unknown ViT preset 'vit_huge'"):
        vit_config("vit_huge", img_size=28, in_chans=1, num_classes=10)


# --- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(test_limit=0), "test_limit=0 must be a positive number"),
        (dict(val_limit=0), "val_limit=0 must be a positive number"),
        (dict(model={"patch_size": 5}), "patch_size=5 does not divide img_size=28"),
        (dict(model={"num_heads": 5}), "num_heads=5 does not divide embed_dim=64"),
        (dict(model={"preset": "vit_gigantic"}), "unknown ViT preset"),
        (dict(dataset="image_folder"), "needs data_path"),
        (dict(dataset="digits", color_mode="rgb"), "digits is grayscale"),
        (dict(dataset="digits", download=True), "download only applies to"),
        (dict(batch_size=32), "Extra inputs are not permitted"),
    ],
)
def test_config_refuses_impossible_values(fields, message):
    with pytest.raises(ValidationError, match=message):
        VisionTaskConfig(**fields)


def test_check_data_reports_missing_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        VisionTaskConfig(data_path=str(tmp_path)).check_data()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        VisionTaskConfig(dataset="image_folder", data_path=str(tmp_path / "no"), img_size=32).check_data()
    VisionTaskConfig(dataset="digits").check_data()  # bundled with scikit-learn


# --- the task -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_task() -> VisionTask:
    return VisionTask(VisionTaskConfig(**DIGITS, eval_batch_size=64), seed=0)


def test_task_data_and_seeded_model(digits_task):
    dataset = digits_task.train_dataset()
    batch = digits_task.collate([dataset[i] for i in range(4)])

    assert torch.equal(batch["index"], torch.arange(4))
    assert torch.equal(digits_task.group_labels(), dataset.labels)
    assert len(digits_task.group_labels()) == len(dataset) == 1438
    same = [digits_task.build_model().state_dict() for _ in range(2)]
    other = VisionTask(digits_task.config, seed=1).build_model().state_dict()
    assert all(torch.equal(same[0][k], same[1][k]) for k in same[0])
    assert not torch.equal(same[0]["pos_embed"], other["pos_embed"])


def test_per_sample_loss_is_each_samples_cross_entropy(digits_task):
    model = digits_task.build_model().eval()
    dataset = digits_task.train_dataset()
    batch = digits_task.collate([dataset[i] for i in range(6)])

    losses = digits_task.per_sample_loss(model, batch)

    assert losses.shape == (6,) and losses.dtype == torch.float32
    alone = [F.cross_entropy(model(batch["image"][i : i + 1]), batch["label"][i : i + 1]) for i in range(6)]
    assert torch.allclose(losses, torch.stack(alone), atol=1e-5)
    losses.sum().backward()
    assert model.head.weight.grad is not None


def test_label_smoothing_mixes_in_the_uniform_target():
    task = VisionTask(VisionTaskConfig(**DIGITS, label_smoothing=0.1, test_limit=50), seed=0)
    model = task.build_model().eval()
    batch = task.collate([task.train_dataset()[i] for i in range(5)])

    log_p = F.log_softmax(model(batch["image"]), dim=-1)
    nll = -log_p.gather(1, batch["label"][:, None])[:, 0]
    expected = 0.9 * nll + 0.1 * -log_p.mean(dim=-1)
    assert torch.allclose(task.per_sample_loss(model, batch), expected, atol=1e-5)


def train(task: VisionTask, steps: int) -> torch.nn.Module:
    """Plain minibatch AdamW on the task's per-sample loss, as the engine does without selection."""
    torch.manual_seed(0)
    model = task.build_model().train()
    spec = task.optimizer_spec()
    optimizer = torch.optim.AdamW(task.parameter_groups(model, spec.weight_decay), lr=spec.lr, betas=spec.betas)
    loader = DataLoader(task.train_dataset(), batch_size=64, shuffle=True, collate_fn=task.collate)
    step = 0
    while step < steps:
        for batch in loader:
            loss = task.per_sample_loss(model, batch).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == steps:
                break
    return model.eval()


@pytest.fixture(scope="module")
def trained_digits(digits_task) -> torch.nn.Module:
    return train(digits_task, steps=200)


def test_training_beats_chance_by_far(digits_task, trained_digits):
    untrained = digits_task.evaluate(digits_task.build_model().eval(), rank=0, world_size=1)
    metrics = digits_task.evaluate(trained_digits, rank=0, world_size=1)

    assert set(metrics) == {"test_accuracy", "test_loss"}
    assert metrics["test_accuracy"] > 0.5 > untrained["test_accuracy"]
    assert metrics["test_loss"] < untrained["test_loss"]


def test_evaluate_scores_the_validation_set_and_the_run_records_it(trained_digits):
    task = VisionTask(
        VisionTaskConfig(**DIGITS, val_limit=120, train_limit=500, test_limit=80, eval_batch_size=32), seed=3
    )
    messages: list[str] = []
    metrics = task.evaluate(trained_digits, rank=0, world_size=1, progress=messages.append)

    assert set(metrics) == {"test_accuracy", "test_loss", "val_accuracy", "val_loss"}
    val = task.collate([task.splits.val[i] for i in range(120)])
    logits = trained_digits(val["image"])
    assert metrics["val_accuracy"] == (logits.argmax(dim=-1) == val["label"]).sum().item() / 120
    assert metrics["val_loss"] == pytest.approx(F.cross_entropy(logits, val["label"]).item(), rel=1e-5)
    assert "evaluated 4/4 val batches" in messages and "evaluated 3/3 test batches" in messages
    described = {(d.name, d.context, d.num_samples) for d in task.describe_data()}
    assert described == {("digits-train", "train", 500), ("digits-val", "validation", 120), ("digits-test", "eval", 80)}


def evaluate_on_rank(rank: int, world_size: int, config: VisionTaskConfig, state: dict, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        task = VisionTask(config, seed=0)
        model = task.build_model()
        model.load_state_dict(state)
        metrics = task.evaluate(model.eval(), rank=rank, world_size=world_size)
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(metrics, f)
    finally:
        dist.destroy_process_group()


def test_evaluate_sharded_over_two_gloo_ranks_matches_one(tmp_path, digits_task, trained_digits):
    # 101 test and 37 validation images in batches of 16: uneven shards and partial last batches.
    config = VisionTaskConfig(**DIGITS, test_limit=101, val_limit=37, eval_batch_size=16)
    single = VisionTask(config, seed=0).evaluate(trained_digits, rank=0, world_size=1)

    mp.start_processes(
        evaluate_on_rank,
        nprocs=2,
        start_method=start_method(),
        args=(2, config, trained_digits.state_dict(), str(tmp_path / "store"), str(tmp_path)),
    )

    for rank in range(2):
        sharded = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for split in ("test", "val"):
            assert sharded[f"{split}_accuracy"] == single[f"{split}_accuracy"]
            assert sharded[f"{split}_loss"] == pytest.approx(single[f"{split}_loss"], rel=1e-6)


def test_evaluate_refuses_shards_without_a_process_group(digits_task, trained_digits):
    with pytest.raises(RuntimeError, match="needs an initialised torch.distributed"):
        digits_task.evaluate(trained_digits, rank=0, world_size=2)
