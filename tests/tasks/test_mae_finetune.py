"""The fine-tuning side of the Multi-Modal MAE task as the paper's fine-tuning table sets it: large
scale jittering and RandAugment (``attent.tasks.mae.augment``), a job's own image size on a
pretrained encoder, and a job's model fields (drop path) on top of the encoder's."""

from __future__ import annotations

import pytest
import torch
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import build_experiment
from attent.tasks.mae import augment, scenes
from attent.tasks.mae.data import IMAGENET_MEAN, IMAGENET_STD
from attent.tasks.mae.files import IGNORE_INDEX

SIZE = 32


@pytest.fixture(scope="module")
def scene_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    scenes.write_dataset(root, train=40, test=16, size=SIZE, seed=0, workers=1)
    return root


def column_item(size: int = SIZE) -> dict:
    """An item whose every modality encodes the pixel's column: depth = 1 + column (metres),
    semseg = column // 4, RGB's first channel = column / size (normalised)."""
    column = torch.arange(size, dtype=torch.float32).expand(size, size)
    rgb = torch.stack([column / size, torch.zeros(size, size), torch.zeros(size, size)])
    rgb = (rgb - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return {"index": 0, "label": 0, "rgb": rgb, "depth": (1 + column)[None], "semseg": (column // 4).long()}


def test_lsj_shrinks_and_pads_with_values_that_carry_no_loss():
    torch.manual_seed(0)
    out = augment.large_scale_jitter(column_item(), scale=(0.5, 0.5))
    assert out["rgb"].shape == (3, SIZE, SIZE) and out["depth"].shape == (1, SIZE, SIZE)
    assert out["semseg"].shape == (SIZE, SIZE) and out["semseg"].dtype == torch.long
    half = SIZE // 2
    pad_depth = torch.ones(SIZE, SIZE, dtype=torch.bool)
    pad_depth[:half, :half] = False  # the image lies top-left, the padding right and bottom
    assert torch.equal(out["depth"][0] == 0, pad_depth)
    assert torch.equal(out["semseg"] == IGNORE_INDEX, pad_depth)
    grey = (128 / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    assert torch.allclose(out["rgb"][:, -1, -1], grey)


def test_lsj_moves_every_modality_alike():
    for seed in range(8):
        torch.manual_seed(seed)
        out = augment.large_scale_jitter(column_item())  # scale drawn from [0.1, 2.0], flip, crop
        valid = out["depth"][0] > 0
        assert torch.equal(valid, out["semseg"] != IGNORE_INDEX)
        column = out["depth"][0][valid] - 1  # nearest: depth and semseg read the same source pixel
        assert torch.equal(out["semseg"][valid], (column // 4).long())


def test_lsj_on_stored_integers_pads_grey_and_keeps_the_dtypes():
    size = SIZE
    column = torch.arange(size).expand(size, size)
    item = {
        "index": 0,
        "label": 0,
        "rgb": torch.full((3, size, size), 200, dtype=torch.uint8),
        "depth": (1000 + column)[None].to(torch.uint16),
        "semseg": (column // 4).to(torch.uint8),
    }
    torch.manual_seed(0)
    out = augment.large_scale_jitter(item, scale=(0.5, 0.5))
    assert [out[m].dtype for m in ("rgb", "depth", "semseg")] == [torch.uint8, torch.uint16, torch.uint8]
    assert out["rgb"][:, -1, -1].tolist() == [128, 128, 128] and out["rgb"][:, 0, 0].tolist() == [200, 200, 200]
    assert int(out["depth"][0, -1, -1]) == 0 and int(out["semseg"][-1, -1]) == IGNORE_INDEX
    valid = out["depth"][0].int() > 0
    assert torch.equal(out["semseg"][valid].long(), ((out["depth"][0][valid].int() - 1000) // 4).long())
    assert augment.rand_augment(item)["rgb"].dtype == torch.uint8


def test_lsj_enlarges_without_padding():
    torch.manual_seed(1)
    out = augment.large_scale_jitter(column_item(), scale=(2.0, 2.0))
    assert (out["depth"] > 0).all() and (out["semseg"] != IGNORE_INDEX).all()


def test_rand_augment_changes_rgb_only():
    torch.manual_seed(0)
    item = column_item()
    out = augment.rand_augment(item)
    assert out["rgb"].shape == item["rgb"].shape and out["rgb"].dtype == torch.float32
    assert out["depth"] is item["depth"] and out["semseg"] is item["semseg"]


def job(root, pretrained=None, **task):
    return build_experiment(
        {
            "name": "job",
            "task": {"name": "mae_downstream", "data_path": str(root), "pretrained": pretrained, **task},
            "train": {"epochs": 1, "batch_size": 8},
        }
    )


@pytest.mark.parametrize(("target", "augmentation"), [("semseg", "lsj"), ("classification", "rand_augment")])
def test_a_job_trains_under_its_augmentation(scene_root, target, augmentation):
    r = TrainingRecipe(job(scene_root, target=target, augmentation=augmentation), WorkerContext())
    r.setup()
    train = r.task.train_dataset()
    assert isinstance(train, augment.Augmented) and train.augmentation == augmentation
    assert train.fmt is r.task.splits.train.fmt  # what the wrapper does not hold is the dataset's
    assert torch.equal(train.labels, r.task.splits.train.labels) and len(train) == len(r.task.splits.train)
    assert not r.task.splits.train.augment or augmentation == "rand_augment"  # lsj jitters plain images
    assert torch.isfinite(torch.tensor(r.run_epoch(0)["train_loss"]))


def test_a_pretrained_encoder_fine_tunes_at_another_size(scene_root, tmp_path):
    """The paper's depth job runs at 256 px on a 224 px encoder: positions are sin-cos, built for
    the job's grid, and nothing of the encoder's state depends on the size."""
    pre = build_experiment(
        {
            "name": "pre",
            "task": {"name": "multimae", "data_path": str(scene_root), "visible_tokens": 32},
            "train": {"epochs": 1, "batch_size": 16},
        }
    )
    r = TrainingRecipe(pre, WorkerContext())
    r.setup()
    torch.save(r.task.export(r.raw_model), tmp_path / "pretrained.pt")
    d = TrainingRecipe(job(scene_root, str(tmp_path), target="depth", img_size=48, augmentation="lsj"), WorkerContext())
    d.setup()
    assert d.task.spec.grid == 48 // 4 and d.raw_model.encoder.pos_embed.shape[1] == (48 // 4) ** 2
    qkv = d.raw_model.encoder.blocks[0].attn.qkv.weight
    assert torch.equal(qkv, r.raw_model.encoder.blocks[0].attn.qkv.weight)
    assert d.task.train_dataset()[0]["rgb"].shape == (3, 48, 48)
    assert 0.0 <= d.run_epoch(0)["eval_delta1"] <= 1.0


def test_a_jobs_model_fields_land_on_the_encoders():
    cfg = build_experiment(
        {
            "name": "pre",
            "task": {"name": "multimae", "data_path": "/nowhere", "model": {"preset": "vit_small_cpu"}},
            "train": {"epochs": 1},
            "downstream": [
                {
                    "name": "semseg",
                    "task": {"target": "semseg", "model": {"drop_path_rate": 0.1}},
                    "train": {"epochs": 1},
                }
            ],
        }
    )
    task = cfg.downstream_experiment(cfg.downstream[0], pretrained=None).task
    assert (task.model.preset, task.model.drop_path_rate) == ("vit_small_cpu", 0.1)
