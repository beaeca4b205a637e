"""The masked-autoencoder tasks on real rendered scenes, driven by the engine's recipe on plain
torch: per-sample scores, deterministic scoring, modality groups, export and downstream load."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import build_experiment
from attent.tasks.mae import scenes
from attent.tasks.mae.downstream import layer_of
from attent.tasks.registry import build_task


@pytest.fixture(scope="module")
def scene_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    scenes.write_dataset(root, train=60, test=20, size=32, seed=0, workers=1)
    return root


def experiment(root, task=None, selection=None, **train):
    return build_experiment(
        {
            "name": "mae-test",
            "task": {"name": "multimae", "data_path": str(root), "visible_tokens": 32, **(task or {})},
            "train": {"epochs": 2, "batch_size": 16, "lr": 1e-3, **train},
            "selection": selection or {"preset": "vit"},
        }
    )


def recipe(cfg) -> TrainingRecipe:
    r = TrainingRecipe(cfg, WorkerContext())
    r.setup()
    return r


def test_a_samples_score_does_not_depend_on_its_batch(scene_root):
    """The authors' scoring stored one mean per batch; here each sample has its own loss."""
    r = recipe(experiment(scene_root))
    task, model, data = r.task, r.raw_model.eval(), r.task.scoring_dataset()
    alone = torch.stack([task.score(model, task.collate([data[i]]), round_=3)[0] for i in (0, 5, 9)])
    together = task.score(model, task.collate([data[i] for i in (9, 0, 5, 17, 30)]), round_=3)[[1, 2, 0]]
    assert alone.shape == (3, 3)  # three samples x three modalities
    torch.testing.assert_close(alone, together, rtol=1e-4, atol=1e-5)
    assert together.sum(dim=1).std() > 0  # and samples do differ


def test_scoring_is_deterministic_and_training_is_not(scene_root):
    r = recipe(experiment(scene_root))

    def scores(round_: int) -> torch.Tensor:
        table = torch.full((60, 3), float("nan"))
        r.selector.scoring.loss_fn = functools.partial(r.scoring_loss, round_=round_)  # the pass's round
        for indices, losses in r.selector.scoring_pass(torch.arange(60)):
            table[indices] = losses
        return table

    first = scores(2)
    assert not torch.isnan(first).any()
    assert torch.equal(first, scores(2))
    assert not torch.equal(first, scores(3))  # a new round draws new masks
    # a pass over some samples (stale-only re-scoring) scores just those, to the same values
    r.selector.scoring.loss_fn = functools.partial(r.scoring_loss, round_=2)
    part = {
        int(i): loss
        for idx, losses in r.selector.scoring_pass(torch.tensor([5, 17, 42]))
        for i, loss in zip(idx, losses)
    }
    assert sorted(part) == [5, 17, 42] and all(torch.equal(part[i], first[i]) for i in part)
    batch = r.task.collate([r.train_set[i] for i in range(8)])
    with torch.no_grad():
        assert not torch.equal(
            r.task.per_sample_loss(r.raw_model, batch), r.task.per_sample_loss(r.raw_model, batch)
        )  # fresh masks, fresh crops


def test_modalities_are_the_groups_of_group_weight_and_gradnorm(scene_root):
    fixed = recipe(
        experiment(
            scene_root,
            selection={"method": "group_weight", "group_weights": [1, 2, 2], "ratio": {"kind": "fixed", "start": 0.5}},
        )
    )
    row = fixed.run_epoch(0)
    assert [row[f"loss_weight_{m}"] for m in ("rgb", "depth", "semseg")] == pytest.approx([0.6, 1.2, 1.2])
    assert row["selected_ratio"] == 0.5 and {"train_loss_rgb", "train_loss_depth", "train_loss_semseg"} <= set(row)
    gradnorm = recipe(
        experiment(scene_root, selection={"method": "gradnorm", "ratio": {"kind": "fixed", "start": 0.5}}, epochs=3)
    )
    weights = []
    for epoch in range(3):
        row = gradnorm.run_epoch(epoch)
        weights.append([row[f"loss_weight_{m}"] for m in ("rgb", "depth", "semseg")])
    assert sum(weights[-1]) == pytest.approx(3.0)
    assert weights[-1] != pytest.approx([1.0, 1.0, 1.0])  # the per-modality loss rates moved them


def test_group_weights_must_match_the_modalities(scene_root):
    with pytest.raises(ValueError, match="3 loss components"):
        recipe(experiment(scene_root, selection={"method": "group_weight", "group_weights": [1, 2]}))


def test_mae_hides_the_configured_share_of_patches(scene_root):
    cfg = build_experiment(
        {"name": "m", "task": {"name": "mae", "data_path": str(scene_root), "mask_ratio": 0.75}, "train": {"epochs": 1}}
    )
    task = build_task(cfg.task, seed=0)
    assert task.modalities == ("rgb",) and task.budget == 16 and task.loss_components == ()
    model = task.build_model().eval()
    losses = task.score(model, task.collate([task.scoring_dataset()[i] for i in range(4)]), round_=0)
    assert losses.shape == (4,) and torch.isfinite(losses).all()


def test_pretrained_encoder_reaches_each_downstream_job(scene_root, tmp_path):
    r = recipe(experiment(scene_root))
    r.run_epoch(0)
    torch.save(r.task.export(r.raw_model), tmp_path / "pretrained.pt")
    for target, metric in (("classification", "top1_accuracy"), ("semseg", "miou"), ("depth", "delta1")):
        cfg = build_experiment(
            {
                "name": "d",
                "task": {
                    "name": "mae_downstream",
                    "data_path": str(scene_root),
                    "target": target,
                    "pretrained": str(tmp_path),
                },
                "train": {"epochs": 1, "batch_size": 16},
            }
        )
        job = recipe(cfg)
        pretrained = r.raw_model.encoder.blocks[0].attn.qkv.weight
        assert torch.equal(job.raw_model.encoder.blocks[0].attn.qkv.weight, pretrained)
        row = job.run_epoch(0)
        assert 0.0 <= row[f"eval_{metric}"] <= 1.0


def test_linear_probe_trains_the_head_only_and_finetune_decays_by_layer(scene_root, tmp_path):
    base = {"name": "mae_downstream", "data_path": str(scene_root), "target": "classification"}
    probe = recipe(build_experiment({"name": "p", "task": {**base, "mode": "linear_probe"}, "train": {"epochs": 1}}))
    trainable = {n for n, p in probe.raw_model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("head.") for n in trainable)
    tune = recipe(build_experiment({"name": "f", "task": {**base, "layer_decay": 0.5}, "train": {"epochs": 1}}))
    scales = sorted({g["lr_scale"] for g in tune.optimizer.param_groups})
    depth = tune.task.spec.depth
    assert scales == pytest.approx([0.5 ** (depth + 1 - layer) for layer in range(depth + 2)])
    assert layer_of("encoder.blocks.2.mlp.fc1.weight", depth) == 3 and layer_of("head.1.weight", depth) == depth + 1


def test_a_ray_checkpoint_of_the_pretraining_run_also_serves(scene_root, tmp_path):
    from attent.engine import checkpoint

    r = recipe(experiment(scene_root))
    r.run_epoch(0)
    saved = checkpoint.save({"model": checkpoint.trainable_state(r.raw_model)})
    cfg = build_experiment(
        {
            "name": "d",
            "task": {
                "name": "mae_downstream",
                "data_path": str(scene_root),
                "target": "depth",
                "pretrained": saved.name,
            },
            "train": {"epochs": 1},
        }
    )
    job = recipe(cfg)
    assert torch.equal(job.raw_model.encoder.embeds["rgb"].proj.weight, r.raw_model.encoder.embeds["rgb"].proj.weight)
    saved.cleanup()


def test_downstream_from_an_unknown_run_is_refused_before_ray(scene_root, tmp_path, monkeypatch, capsys):
    from attent.cli.main import main

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "pre.yaml"
    config.write_text(f"""
name: pre
task: {{name: multimae, data_path: {scene_root}}}
train: {{epochs: 1}}
mlflow: {{tracking_uri: "sqlite:///{tmp_path / "mlflow.db"}"}}
downstream:
  - {{name: depth, task: {{target: depth}}, train: {{epochs: 1}}}}
""")
    assert main(["downstream", str(config), "--run-id", "0123456789abcdef"]) == 2
    err = capsys.readouterr().err
    assert "no MLflow run '0123456789abcdef'" in err
    from mlflow import MlflowClient

    experiment = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_experiment_by_name("attent")
    assert experiment is None  # refused before any run (or Ray worker) was started


def test_a_downstream_job_is_named_after_its_weights_and_settings(scene_root):
    from attent.engine.driver import job_experiment

    cfg = build_experiment(
        {
            "name": "pre",
            "task": {"name": "multimae", "data_path": str(scene_root)},
            "train": {"epochs": 1},
            "downstream": [
                {"name": "depth", "task": {"target": "depth"}, "train": {"epochs": 1}},
                {"name": "depth2", "task": {"target": "depth"}, "train": {"epochs": 2}},
            ],
        }
    )
    same = job_experiment(cfg, cfg.downstream[0], "abcdef0123456789")
    assert same.name.startswith("pre-depth-abcdef01-") and same.task.pretrained == "runs:/abcdef0123456789/pretrained"
    assert job_experiment(cfg, cfg.downstream[0], "abcdef0123456789").name == same.name  # re-run: reused
    assert job_experiment(cfg, cfg.downstream[0], "ffffff0123456789").name != same.name  # other weights
    changed = cfg.downstream[1].model_copy(update={"name": "depth"})
    assert job_experiment(cfg, changed, "abcdef0123456789").name != same.name  # other settings


def test_validation_scenes_are_scored_beside_the_test_scenes(scene_root, tmp_path):
    r = recipe(experiment(scene_root, task={"val_limit": 10, "knn_neighbours": 3}))
    metrics = r.task.evaluate(r.raw_model.eval(), rank=0, world_size=1)
    losses = {f"loss_{m}" for m in ("rgb", "depth", "semseg")} | {"loss", "knn_accuracy"}
    assert set(metrics) == {f"{split}_{name}" for split in ("test", "val") for name in losses}
    assert {(d.context, d.num_samples) for d in r.task.describe_data()} == {
        ("train", 50),
        ("validation", 10),
        ("eval", 20),
    }
    torch.save(r.task.export(r.raw_model), tmp_path / "pretrained.pt")
    job = recipe(
        build_experiment(
            {
                "name": "d",
                "train": {"epochs": 1, "batch_size": 16},
                "task": {
                    "name": "mae_downstream",
                    "data_path": str(scene_root),
                    "val_limit": 10,
                    "target": "classification",
                    "pretrained": str(tmp_path),
                },
            }
        )
    )
    assert set(job.task.evaluate(job.raw_model.eval(), rank=0, world_size=1)) == {"top1_accuracy", "val_top1_accuracy"}


def test_each_seed_draws_its_own_scenes_unless_split_seed_fixes_them(scene_root):
    def scenes(seed: int, **task) -> list[str]:
        cfg = experiment(scene_root, task={"train_limit": 20, "val_limit": 10, **task})
        splits = build_task(cfg.task, seed=seed).splits
        return [str(p["rgb"]) for split in (splits.train, splits.val) for p in split.paths]

    assert scenes(1) == scenes(1) != scenes(2)
    assert scenes(1, split_seed=0) == scenes(2, split_seed=0) == scenes(0)


def test_knn_probe_of_the_rgb_encoder(scene_root):
    """The k-NN probe reads the encoder's RGB tokens only: features do not change when depth and
    semseg do, and a test set that is the training set is recognised by its 1-nearest neighbour."""
    r = recipe(experiment(scene_root, task={"knn_neighbours": 5}))
    task, model = r.task, r.raw_model.eval()
    metrics = task.evaluate(model, rank=0, world_size=1)
    assert 0.0 <= metrics["test_knn_accuracy"] <= 1.0
    train = task.splits.train.without_augmentation()
    features = task.rgb_features(model, train, 10)
    assert features.shape[0] == 10 and torch.allclose(features.norm(dim=1), torch.ones(10))
    # the training scenes as the test set, one neighbour: each finds itself
    task.splits = dataclasses.replace(task.splits, test=train)
    task.config = task.config.model_copy(update={"knn_neighbours": 1})
    assert task.knn_accuracy(model, task.splits.test) == 1.0
