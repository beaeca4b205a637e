"""A user's plain loop trains the multi-modal MAE as the engine does: per-sample losses of three
components (RGB, depth, semseg) through ``attent.Selector`` (``components=``, the task's scoring
set without augmentation, its seeded scoring masks by ``selector.epoch``) choose the engine's
subsets at every re-selection, hold its score table and end on its weights, bit for bit.

The two loops share everything the engine does not own: the rendered scenes, the initial weights,
the optimiser (AdamW on the task's parameter groups, constant learning rate, no clipping) and the
seed of each epoch's randomness (masks, crops), which the engine draws from ``(seed, epoch)``.
"""

from __future__ import annotations

import attent
import pytest
import torch
from attent import contract
from attent.engine.recipe import TrainingRecipe, WorkerContext, to_device
from attent.experiment.schema import build_experiment
from attent.tasks.mae import scenes
from attent.tasks.registry import build_task

EPOCHS = 4
RATIO = {"kind": "incremental", "start": 0.5, "end": 0.8}
SELECTIONS = {
    # Soft with scoring passes of seeded masks; the components summed into each sample's score
    "vit": {"preset": "vit", "ratio": RATIO},
    # the components weighed in the training loss by the method (depth and semseg twice RGB)
    "group_weight": {"method": "group_weight", "group_weights": [1, 2, 2], "ratio": RATIO},
}


@pytest.fixture(scope="module")
def scene_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    scenes.write_dataset(root, train=48, test=16, size=32, seed=0, workers=1)
    return root


def experiment(root, selection: dict):
    return build_experiment(
        {
            "name": "selector-components",
            "seed": 2,
            "task": {"name": "multimae", "data_path": str(root), "visible_tokens": 32},
            "train": {
                "epochs": EPOCHS,
                "batch_size": 16,
                "lr": 1e-3,
                "schedule": "constant",
                "warmup_ratio": 0.0,
                "grad_clip": None,
                "eval_every": EPOCHS,
            },
            "selection": selection,
        }
    )


def epoch_seed(cfg, epoch: int) -> int:
    """The engine's seed of an epoch's randomness on rank 0 (``TrainingRecipe.run_epoch``)."""
    return cfg.seed * 7919 + epoch * 104729


def train_plain(cfg, initial: dict[str, torch.Tensor], optim) -> attent.Selector:
    """The README's loop on the MAE task, as a user writes it."""
    task = build_task(cfg.task, seed=cfg.seed)
    model = task.build_model()
    model.load_state_dict(initial)
    selector = attent.Selector(
        task.train_dataset(),
        selection=cfg.selection,
        epochs=EPOCHS,
        seed=cfg.seed,
        model=model,
        loss_fn=lambda model, batch: task.score(model, batch, selector.epoch),
        collate_fn=task.collate,
        score_dataset=task.scoring_dataset(),
        score_batch_size=2 * cfg.train.batch_size,
        groups=task.group_labels(),
        components=task.loss_components,
    )
    optimizer = torch.optim.AdamW(
        task.parameter_groups(model, optim.weight_decay), lr=optim.lr, betas=optim.betas, eps=optim.eps
    )
    loader = selector.loader(cfg.train.batch_size)
    model.train()
    for epoch in range(EPOCHS):
        torch.manual_seed(epoch_seed(cfg, epoch))
        selector.begin_epoch(epoch)
        for batch in loader:
            selector.update(task.per_sample_loss(model, batch)).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        selector.end_epoch()
    selector.trained_model = model
    return selector


@pytest.mark.parametrize("name", SELECTIONS)
def test_a_plain_selector_loop_trains_the_mae_to_the_engines_subsets(scene_root, name):
    cfg = experiment(scene_root, SELECTIONS[name])
    engine = TrainingRecipe(cfg, WorkerContext())
    engine.setup()
    assert engine.task.loss_components == ("rgb", "depth", "semseg")
    initial = {k: v.clone() for k, v in engine.raw_model.state_dict().items()}
    rows = [engine.run_epoch(epoch) for epoch in range(EPOCHS)]

    plain = train_plain(cfg, initial, engine.optim)

    subsets = [(r.epoch, r.indices.tolist()) for r in engine.selector.history]
    assert [(r.epoch, r.indices.tolist()) for r in plain.history] == subsets
    assert any(len(indices) < 48 for _, indices in subsets)  # a real selection, not all data
    assert torch.equal(plain.component_scores, engine.selector.component_scores)
    assert torch.equal(plain.component_weights, engine.selector.component_weights)
    if name == "group_weight":
        assert not torch.equal(plain.component_weights, torch.ones(3))
    for key, value in plain.trained_model.state_dict().items():
        assert torch.equal(value, engine.raw_model.state_dict()[key]), key
    # the selector reports what the engine logs, under the same names
    metrics, last = plain.metrics(), rows[-1]
    for metric in (
        contract.TRAIN_LOSS,
        contract.SAMPLES_FORWARDED,
        contract.SAMPLES_BACKPROPAGATED,
        contract.SUBSET_CHECKSUM,
        *(contract.component_loss_metric(c) for c in ("rgb", "depth", "semseg")),
        *(contract.component_weight_metric(c) for c in ("rgb", "depth", "semseg")),
    ):
        assert metrics[metric] == last[metric], metric


def test_component_losses_need_their_names(scene_root):
    cfg = experiment(scene_root, {"method": "full"})
    task = build_task(cfg.task, seed=cfg.seed)
    selector = attent.Selector(task.train_dataset(), selection=cfg.selection, epochs=EPOCHS, collate_fn=task.collate)
    model = task.build_model()
    selector.begin_epoch(0)
    batch = next(iter(selector.loader(8)))
    with pytest.raises(ValueError, match=r"shape \[B\], got \(8, 3\).*components="):
        selector.update(task.per_sample_loss(model, to_device(batch, torch.device("cpu"))))
