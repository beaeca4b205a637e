"""The four ways to select that tests/integrations/test_integration_agreement.py compares (the engine's training
recipe, the plain-PyTorch ``attent.Selector``, ``AtteNTTrainer`` and the Lightning callback), each run on the
engine's digits ViT task at learning rate 0, so that every per-sample loss is the same function of the sample in
all four; what each chose (``run_all``) and that they agree (``assert_all_agree``). Needs lightning and
transformers (skipped without)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

L = pytest.importorskip("lightning")
transformers = pytest.importorskip("transformers")

import attent  # noqa: E402
from attent import contract  # noqa: E402
from attent.engine.recipe import TrainingRecipe, WorkerContext  # noqa: E402
from attent.experiment.schema import build_experiment  # noqa: E402
from attent.integrations.huggingface import AtteNTTrainer  # noqa: E402
from attent.integrations.lightning import AtteNTCallback  # noqa: E402
from attent.selection.plan import build_plan  # noqa: E402
from attent.selection.selector import Selector  # noqa: E402
from attent.selection.strategies import subset_checksum  # noqa: E402
from attent.tasks.registry import build_task  # noqa: E402

SEED, N, EPOCHS, BATCH, SCORE_BATCH = 3, 90, 6, 16, 32
CONFIGS = {
    "vit": {"preset": "vit"},  # scoring passes before each re-selection, Soft, growing ratio and interval
    "llm": {"preset": "llm"},  # epoch 1 on all data, then Hard top 70 % by the training forwards' losses
    # Hard, growing ratio, a re-selection every 2 epochs; one scoring pass (epoch 0: nothing scored
    # yet), then the training forwards' losses and the scores of samples not trained on since
    "hard": {
        "strategy": "hard",
        "ratio": {"kind": "incremental", "start": 0.3, "end": 0.9},
        "interval": {"kind": "fixed", "start": 2},
    },
}
FRAMEWORKS = ("engine", "plain", "huggingface", "lightning")


def experiment(name: str):
    """The engine's digits ViT run of selection config ``name``."""
    return build_experiment(
        {
            "name": f"agreement-{name}",
            "seed": SEED,
            "task": {
                "name": "vision",
                "dataset": "digits",
                "img_size": 8,
                "train_limit": N,
                "test_limit": 30,
                "model": {"preset": "vit_tiny_cpu", "patch_size": 2},
            },
            "train": {"epochs": EPOCHS, "batch_size": BATCH, "scoring_batch_size": SCORE_BATCH},
            "selection": CONFIGS[name],
        }
    )


def outcome(
    checksums: list[float],
    selector: Selector,
    backpropagated: int,
    model: torch.nn.Module,
    initial: dict[str, torch.Tensor],
    sampler,
    forwards: dict[str, int],
) -> dict:
    """What one run chose, in the form every framework's run is compared in."""
    return {
        "forwards": dict(forwards),
        "checksums": [float(c) for c in checksums],
        "shard": (sampler.rank, sampler.world_size),  # whose shard of each subset this rank trained
        "reselections": [(r.epoch, subset_checksum(r.indices)) for r in selector.history],
        "subsets": [r.indices.clone() for r in selector.history],
        "backpropagated": int(backpropagated),
        "table": selector.scores.clone(),
        "unchanged": all(torch.equal(value, initial[key]) for key, value in model.state_dict().items()),
    }


def count_forwards(model: torch.nn.Module) -> dict[str, int]:
    """The model's forwards as they run, without gradients (scoring) and with (training): under a
    sharded model each is a collective, so ranks that made different numbers would hang."""
    counts = {"scoring": 0, "training": 0}

    def hook(module, args, output):
        counts["training" if torch.is_grad_enabled() else "scoring"] += 1

    model.register_forward_hook(hook)
    return counts


def copy_of(task, initial: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = task.build_model()
    model.load_state_dict(initial)
    return model


# --- the four runs ---------------------------------------------------------------------------------------
def run_engine(cfg, initial, rank: int = 0, world: int = 1) -> dict:
    """The engine's recipe as a Ray Train worker runs it (``driver.train_run``), without Ray."""
    recipe = TrainingRecipe(cfg, WorkerContext(rank, world))

    def wrap(model):
        model.load_state_dict(initial)
        return DistributedDataParallel(model) if world > 1 else model

    recipe.setup(wrap_model=wrap)
    forwards = count_forwards(recipe.raw_model)
    recipe.optim = dataclasses.replace(recipe.optim, lr=0.0)  # every step's lr is optim.lr x the schedule
    checksums = [recipe.run_epoch(epoch)[contract.SUBSET_CHECKSUM] for epoch in range(EPOCHS)]
    return outcome(
        checksums,
        recipe.selector,
        recipe.counters.samples_backpropagated,
        recipe.raw_model,
        initial,
        recipe.loader.sampler,
        forwards,
    )


def run_plain(cfg, task, initial, world: int = 1) -> dict:
    """The README's three-line loop (under DDP where there are two ranks)."""
    model = copy_of(task, initial)
    forwards = count_forwards(model)
    trained = DistributedDataParallel(model) if world > 1 else model
    selector = attent.Selector(
        task.train_dataset(),
        selection=cfg.selection,
        epochs=EPOCHS,
        seed=cfg.seed,
        model=model,
        loss_fn=task.per_sample_loss,
        collate_fn=task.collate,
        score_batch_size=SCORE_BATCH,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    loader = selector.loader(BATCH)
    checksums = []
    for epoch in range(EPOCHS):
        selector.begin_epoch(epoch)
        for batch in loader:
            selector.update(task.per_sample_loss(trained, batch)).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        selector.end_epoch()
        checksums.append(selector.metrics()["subset_checksum"])
    return outcome(checksums, selector, selector.samples_backpropagated, model, initial, selector.sampler, forwards)


class Classifier(torch.nn.Module):
    """The task's ViT as Trainer calls a model: keyword inputs, a dict with the logits out."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, image, labels=None):
        return {"logits": self.net(image)}


def cross_entropy_per_sample(model, inputs) -> torch.Tensor:
    """The task's per-sample loss (the vision task's float32 cross-entropy; the digits task has no
    label smoothing) through the model Trainer trains, as AtteNTTrainer's compute_per_sample_loss:
    the Classifier returns no loss of its own for AtteNTTrainer to split by sample."""
    return torch.nn.functional.cross_entropy(
        model(image=inputs["image"])["logits"].float(), inputs["labels"], reduction="none"
    )


def run_huggingface(cfg, task, initial, output_dir) -> dict:
    """AtteNTTrainer on the task's items, with the task's per-sample loss. Ranks and world size
    come from the environment."""

    def collate(items):
        batch = task.collate(items)
        return {"image": batch["image"], "labels": batch["label"]}

    net = copy_of(task, initial)
    forwards = count_forwards(net)
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=SCORE_BATCH,
        num_train_epochs=EPOCHS,
        learning_rate=0.0,
        weight_decay=0.0,
        seed=cfg.seed,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
    )  # the task's collate reads each item's index
    trainer = AtteNTTrainer(
        model=Classifier(net),
        args=args,
        train_dataset=task.train_dataset(),
        data_collator=collate,
        selection=cfg.selection,
        seed=cfg.seed,
        compute_per_sample_loss=cross_entropy_per_sample,
    )
    trainer.train()
    checksums = [row["subset_checksum"] for row in trainer.state.log_history if "subset_checksum" in row]
    return outcome(
        checksums,
        trainer.selector,
        trainer.selector.samples_backpropagated,
        net,
        initial,
        trainer.selector.sampler,
        forwards,
    )


class DigitsModule(L.LightningModule):
    def __init__(self, net, loss_fn, selection: AtteNTCallback):
        super().__init__()
        self.net, self.loss_fn, self.selection = net, loss_fn, selection
        self.checksums = []

    def training_step(self, batch, batch_idx):
        return self.selection.update(self.loss_fn(self.net, batch)).mean()

    def train_dataloader(self):
        return self.selection.loader(BATCH)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.0)

    def on_train_epoch_end(self):  # after the callback's: its metrics are this epoch's
        self.checksums.append(self.selection.metrics()["subset_checksum"])


def run_lightning(cfg, task, initial, world: int = 1) -> dict:
    """The callback in a Lightning Trainer; on two ranks Lightning's DDP joins the process group
    the test started (LOCAL_RANK set: launched externally)."""
    net = copy_of(task, initial)
    forwards = count_forwards(net)
    selection = AtteNTCallback(
        task.train_dataset(),
        selection=cfg.selection,
        seed=cfg.seed,
        loss_fn=lambda module, batch: task.per_sample_loss(module.net, batch),
        collate_fn=task.collate,
        score_batch_size=SCORE_BATCH,
    )
    module = DigitsModule(net, task.per_sample_loss, selection)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_epochs=EPOCHS,
        reload_dataloaders_every_n_epochs=1,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[selection],
    )
    trainer.fit(module)
    return outcome(
        module.checksums,
        selection.selector,
        selection.selector.samples_backpropagated,
        net,
        initial,
        selection.sampler,
        forwards,
    )


def run_all(name: str, output_dir, rank: int = 0, world: int = 1) -> dict[str, dict]:
    cfg = experiment(name)
    task = build_task(cfg.task, seed=cfg.seed)
    initial = {k: v.clone() for k, v in task.build_model().state_dict().items()}  # built once, copied into each
    return {
        "engine": run_engine(cfg, initial, rank, world),
        "plain": run_plain(cfg, task, initial, world),
        "huggingface": run_huggingface(cfg, task, initial, output_dir),
        "lightning": run_lightning(cfg, task, initial, world),
    }


def assert_all_agree(runs: dict[str, dict], name: str, rank: int = 0, world: int = 1) -> None:
    engine = runs["engine"]
    plan = build_plan(experiment(name).selection, EPOCHS).ratios()
    assert [epoch for epoch, _ in engine["reselections"]] == [epoch for epoch, _ in plan]
    assert len(engine["checksums"]) == EPOCHS
    for framework in FRAMEWORKS:
        run = runs[framework]
        assert run["unchanged"], f"{framework}: the weights moved (learning rate 0 expected)"
        assert run["shard"] == (rank, world), framework
        assert run["checksums"] == engine["checksums"], framework
        assert run["reselections"] == engine["reselections"], framework
        for a, b in zip(run["subsets"], engine["subsets"], strict=True):
            assert torch.equal(a, b), framework
        assert run["backpropagated"] == engine["backpropagated"], framework
        assert run["forwards"]["training"] == engine["forwards"]["training"], framework
        # the same losses on the same samples, to the bit
        assert torch.equal(run["table"].nan_to_num(-1.0), engine["table"].nan_to_num(-1.0)), framework
    assert len(set(engine["checksums"])) > 1  # not vacuous: the subsets changed
