"""The Lightning callback (attent.AtteNTCallback; issue 28, items 3, 5 and 6), with real Lightning
and real torch: it chooses what the plain-PyTorch Selector chooses, in one process and on two
DDP ranks; a run resumed from a Lightning checkpoint draws the uninterrupted run's subsets;
``full`` is a plain Lightning run; each setting it needs is refused in one line; planned_steps is
the number of optimiser steps taken; the example runs.

The model of most tests holds one parameter per sample, pulled towards the sample's target, so a
sample's loss falls each time it is trained on: what the Selector scores and picks depends on what
was trained, and a loss recorded against the wrong sample, lost or counted twice would change
the later subsets."""

from __future__ import annotations

import csv
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

L = pytest.importorskip("lightning")

import attent  # noqa: E402
from attent import contract  # noqa: E402
from attent.integrations.lightning import AtteNTCallback  # noqa: E402
from attent.selection.config import SelectionConfig  # noqa: E402

from tests.helpers.lightning_sample import (  # noqa: E402
    CONFIGS,
    EPOCHS,
    TRAINER,
    N,
    Record,
    SampleModule,
    dataset,
    ddp_strategy,
    fit,
    per_sample_loss,
)
from tests.helpers.ranks import start_method  # noqa: E402


def run_plain(config: SelectionConfig, epochs: int, seed: int, batch_size: int = 8, ddp: bool = False) -> dict:
    """The README's three-line loop with the Selector, on the same module and optimiser."""
    module = SampleModule()
    model = DistributedDataParallel(module) if ddp else module
    selector = attent.Selector(
        dataset(), selection=config, epochs=epochs, seed=seed, model=module, loss_fn=per_sample_loss
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    out = {"subsets": [], "checksums": [], "trained": []}
    for epoch in range(epochs):
        out["subsets"].append(selector.begin_epoch(epoch).clone())
        out["checksums"].append(selector.metrics()["subset_checksum"])
        trained = []
        for batch in selector.loader(batch_size):
            loss = selector.update(model(batch[0])).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            trained.append(batch[0])
        selector.end_epoch()
        out["trained"].append(torch.cat(trained))
    return {**out, "table": selector.scores.clone(), "value": module.value.detach().clone()}


def assert_same_run(got: dict, want: dict) -> None:
    assert got["checksums"] == want["checksums"]
    for a, b in zip(got["subsets"], want["subsets"], strict=True):
        assert torch.equal(a, b)
    # the scores landed on the right samples, and training was the same
    assert torch.equal(got["table"].nan_to_num(-1), want["table"].nan_to_num(-1))
    assert torch.equal(got["value"], want["value"])


# --- (a) the callback chooses what the Selector chooses ------------------------------------------------
class WorkersModule(SampleModule):
    """A loader with a worker process: Lightning then draws from the sampler when it loads the
    loader, before on_train_epoch_start."""

    def train_dataloader(self):
        return self.selection.loader(self.batch_size, num_workers=1)


@pytest.mark.parametrize("name,module_class", [("vit", SampleModule), ("llm", SampleModule), ("vit", WorkersModule)])
def test_the_callback_chooses_what_the_plain_selector_chooses(name, module_class, tmp_path):
    config = SelectionConfig(**CONFIGS[name])
    got, _ = fit(config, EPOCHS, 4, module_class, default_root_dir=tmp_path)
    want = run_plain(config, EPOCHS, seed=4)
    assert_same_run(got, want)
    for subset, trained in zip(got["subsets"], got["trained"]):
        assert sorted(trained.tolist()) == subset.tolist()  # each epoch trained on its subset, once
    assert len({tuple(s.tolist()) for s in got["subsets"]}) > 2  # not vacuous


class OwnLoaderModule(SampleModule):
    """A train loader the module builds itself around the callback's sampler."""

    def train_dataloader(self):
        return DataLoader(dataset(), batch_size=self.batch_size, sampler=self.selection.sampler)


def test_a_first_epoch_that_scores_sizes_its_pass_from_the_modules_own_loader():
    # no warm-up: the pass of epoch 0 runs at on_fit_start, before Lightning asks for the loader
    config = SelectionConfig(preset="vit", warmup_epochs=0)
    scoring_batches = []

    def recorded_loss(module, batch):
        scoring_batches.append(batch[0].numel())
        return per_sample_loss(module, batch)

    selection = AtteNTCallback(dataset(), selection=config, seed=0, loss_fn=recorded_loss)
    module = OwnLoaderModule(selection, batch_size=5)
    L.Trainer(**TRAINER, max_epochs=2, callbacks=[selection]).fit(module)
    assert scoring_batches[:2] == [10, 10]  # twice the training batch on CPU, not the fallback 256
    assert sum(scoring_batches) >= N


def _plain_rank(rank: int, world: int, store_path: str, out_dir: str, config: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        run = run_plain(SelectionConfig(**config), 4, seed=5, batch_size=6, ddp=True)
        torch.save(run, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_two_ddp_ranks_agree_split_the_subset_and_match_the_plain_selector(tmp_path):
    """Lightning's DDP (two gloo ranks) against the Selector in a torch DDP loop on two ranks."""
    config = CONFIGS["vit"]
    (tmp_path / "lightning").mkdir()
    (tmp_path / "plain").mkdir()
    selection = AtteNTCallback(dataset(), selection=SelectionConfig(**config), seed=5, loss_fn=per_sample_loss)
    trainer = L.Trainer(
        **{**TRAINER, "devices": 2},
        strategy=ddp_strategy(),
        max_epochs=4,
        use_distributed_sampler=False,
        callbacks=[selection, Record(selection, str(tmp_path / "lightning"))],
    )
    trainer.fit(SampleModule(selection, batch_size=6))
    mp.start_processes(
        _plain_rank,
        args=(2, str(tmp_path / "store"), str(tmp_path / "plain"), config),
        nprocs=2,
        join=True,
        start_method=start_method(),
    )

    r0, r1 = (torch.load(tmp_path / "lightning" / f"rank{r}.pt") for r in range(2))
    for rank, got in enumerate((r0, r1)):
        assert_same_run(got, torch.load(tmp_path / "plain" / f"rank{rank}.pt"))
    assert r0["checksums"] == r1["checksums"]
    for a, b, t0, t1 in zip(r0["subsets"], r1["subsets"], r0["trained"], r1["trained"], strict=True):
        assert torch.equal(a, b)
        assert len(t0) == len(t1) == math.ceil(len(a) / 2)  # equal shards (padded)
        assert set(t0.tolist()) | set(t1.tolist()) == set(a.tolist())  # covering the subset
        assert len(set(t0.tolist()) & set(t1.tolist())) == 2 * len(t0) - len(a)  # disjoint but the padding
    assert len({len(s) for s in r0["subsets"]}) > 1  # the subsets changed size: the loader was re-measured


def test_selection_metrics_reach_the_trainers_logger(tmp_path):
    """Under the engine's names (attent.contract), unprefixed: the same columns as an engine run's."""
    config = SelectionConfig(**CONFIGS["vit"])
    got, trainer = fit(config, 4, seed=1, logger=L.pytorch.loggers.CSVLogger(tmp_path), default_root_dir=tmp_path)
    with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as f:
        rows = [row for row in csv.DictReader(f) if row.get(contract.SELECTED_RATIO)]
    sizes = [len(s) for s in got["subsets"]]
    # Lightning logs float32: the tolerance is one float32 rounding (relative 2**-24 = 6e-8)
    assert [float(r[contract.SELECTED_RATIO]) for r in rows] == pytest.approx([s / N for s in sizes], rel=1e-7)
    assert [int(float(r[contract.SAMPLES_BACKPROPAGATED])) for r in rows] == [sum(sizes[: e + 1]) for e in range(4)]
    assert [float(r[contract.SUBSET_CHECKSUM]) for r in rows] == pytest.approx(got["checksums"], rel=1e-7)
    assert [float(r[contract.SELECTION_HARDNESS]) for r in rows] == pytest.approx(got["hardness"], rel=1e-7)
    assert not any(math.isnan(h) for h in got["hardness"])
    assert {contract.SELECTION_OVERLAP, "selected"} <= set(rows[0]) and not any(
        k.startswith("attent/") for k in rows[0]
    )


# --- (b) resume from a Lightning checkpoint -------------------------------------------------------------
class ValidatedModule(SampleModule):
    """With a validation loop: checkpoints are then saved after validation, before the callbacks'
    on_train_epoch_end."""

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", per_sample_loss(self, batch).mean())

    def val_dataloader(self):
        return DataLoader(dataset(), batch_size=32)


@pytest.mark.parametrize("saved_at", ["train_epoch_end", "validation_end"])
def test_a_run_resumed_from_a_checkpoint_draws_the_same_subsets(saved_at, tmp_path):
    config, epochs, stop = SelectionConfig(**CONFIGS["vit"]), 5, 1
    module_class = SampleModule if saved_at == "train_epoch_end" else ValidatedModule
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        tmp_path, "{epoch}", save_top_k=-1, save_on_train_epoch_end=saved_at == "train_epoch_end"
    )
    uninterrupted, _ = fit(
        config, epochs, 2, module_class, callbacks=[checkpoints], enable_checkpointing=True, default_root_dir=tmp_path
    )
    assert (tmp_path / f"epoch={stop}.ckpt").exists()
    resumed, _ = fit(
        config, epochs, 2, module_class, ckpt_path=tmp_path / f"epoch={stop}.ckpt", default_root_dir=tmp_path
    )
    assert len(resumed["subsets"]) == epochs - stop - 1
    tail = {key: uninterrupted[key][stop + 1 :] for key in ("subsets", "checksums")}
    assert_same_run(resumed, {**uninterrupted, **tail})
    assert len({tuple(s.tolist()) for s in tail["subsets"]}) > 1  # not vacuous


def test_a_run_resumed_from_inside_an_epoch_trains_that_epochs_subset(tmp_path):
    """Lightning restarts the epoch's (unresumable) loader and trains its remaining batch count;
    the subset is the uninterrupted run's, the scores of the batches before the checkpoint are lost."""
    config, epochs = SelectionConfig(**CONFIGS["vit"]), 5
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(tmp_path, "{epoch}-{step}", save_top_k=-1, every_n_train_steps=5)
    uninterrupted, trainer = fit(
        config, epochs, 2, callbacks=[checkpoints], enable_checkpointing=True, default_root_dir=tmp_path
    )
    batches = [math.ceil(len(s) / 8) for s in uninterrupted["subsets"]]
    epoch = next(e for e in range(epochs) if 15 < sum(batches[: e + 1]))  # the epoch that step 15 falls in
    assert 15 > sum(batches[:epoch])  # inside it, not at its end
    resumed, resumed_trainer = fit(
        config, epochs, 2, ckpt_path=tmp_path / f"epoch={epoch}-step=15.ckpt", default_root_dir=tmp_path
    )
    assert torch.equal(resumed["first_subset"], uninterrupted["subsets"][epoch])
    assert len(resumed["trained"][0]) == 8 * (sum(batches[: epoch + 1]) - 15)
    assert resumed_trainer.global_step == trainer.global_step


# --- (c) full data is a plain Lightning run -------------------------------------------------------------
class DigitsModule(L.LightningModule):
    """A tiny timm ViT on the digits: plain (mean cross-entropy, the order Lightning's own
    DistributedSampler gives) or through the callback (per-sample cross-entropy to update())."""

    def __init__(self, train_set, selection: AtteNTCallback | None):
        super().__init__()
        from attent.tasks.vit import build_vit, vit_config

        torch.manual_seed(0)
        self.net = build_vit(vit_config("vit_tiny_cpu", img_size=8, in_chans=1, num_classes=10))
        self.train_set, self.selection = train_set, selection

    def training_step(self, batch, batch_idx):
        logits = self.net(batch["image"])
        if self.selection is None:
            return F.cross_entropy(logits, batch["label"])
        return self.selection.update(F.cross_entropy(logits, batch["label"], reduction="none")).mean()

    def train_dataloader(self):
        if self.selection is None:
            # what Lightning puts under DDP; with seed 0 its order is the callback's (seed * 1_000_003 + epoch)
            sampler = DistributedSampler(self.train_set, num_replicas=1, rank=0, shuffle=True, seed=0)
            return DataLoader(self.train_set, batch_size=32, sampler=sampler)
        return self.selection.loader(32)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


class StepLosses(L.Callback):
    """The loss of each training step, as Lightning back-propagated it."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def test_full_reproduces_a_plain_lightning_run():
    from attent.tasks.vision.data import load_digits

    train_set = Subset(load_digits(seed=0).train, range(160))
    losses, weights = {}, {}
    for kind in ("plain", "full"):
        selection = AtteNTCallback(train_set, selection=SelectionConfig(method="full")) if kind == "full" else None
        steps, module = StepLosses(), DigitsModule(train_set, selection)
        trainer = L.Trainer(**TRAINER, max_epochs=3, callbacks=[steps, *([selection] if selection else [])])
        trainer.fit(module)
        losses[kind] = torch.tensor(steps.losses, dtype=torch.float64)
        weights[kind] = [p.detach().clone() for p in module.parameters()]
    assert len(losses["full"]) == len(losses["plain"]) == 15
    # Measured: at most 2.4e-7, one float32 ulp at these losses (1.1-2.3): cross_entropy's own mean
    # and the mean of its per-sample losses sum in another order (about half of the batches differ
    # by an ulp), while their gradients are equal (the weights below are); so 1e-6, four ulps.
    assert (losses["full"] - losses["plain"]).abs().max() <= 1e-6
    assert all(torch.equal(a, b) for a, b in zip(weights["full"], weights["plain"], strict=True))
    assert losses["full"][-1] < losses["full"][0]


# --- (e) planned_steps is the number of optimiser steps taken -------------------------------------------
class ScheduledModule(SampleModule):
    """Sizes a OneCycle schedule by planned_steps: OneCycleLR raises if stepped past its total."""

    drop_last = False

    def train_dataloader(self):
        return self.selection.loader(self.batch_size, drop_last=self.drop_last)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.5)
        self.planned = self.selection.planned_steps(self.batch_size, drop_last=self.drop_last)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=self.planned)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


@pytest.mark.parametrize(
    "name,batch_size,drop_last,accumulation", [("vit", 8, False, 1), ("vit", 7, True, 3), ("llm", 16, False, 2)]
)
def test_planned_steps_is_the_number_of_steps_taken(name, batch_size, drop_last, accumulation):
    selection = AtteNTCallback(dataset(), selection=SelectionConfig(**CONFIGS[name]), seed=0, loss_fn=per_sample_loss)
    module = ScheduledModule(selection, batch_size)
    module.drop_last = drop_last
    trainer = L.Trainer(**TRAINER, max_epochs=EPOCHS, accumulate_grad_batches=accumulation, callbacks=[selection])
    trainer.fit(module)
    assert trainer.global_step == module.planned > 0
    # a step-based schedule sized by Lightning's own estimate would be wrong: it knows the first epoch only
    assert trainer.estimated_stepping_batches != module.planned


# --- the one import -------------------------------------------------------------------------------------
def test_the_callback_is_a_public_name():
    assert attent.AtteNTCallback is AtteNTCallback
    assert "AtteNTCallback" in dir(attent)
    assert issubclass(AtteNTCallback, L.pytorch.Callback)


# --- (f) the example ------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("devices", [1, 2])  # 2: Lightning's "ddp", which starts the script again per rank
def test_lightning_example_runs_and_follows_the_ratio_schedule(devices):
    from tests.helpers.examples import assert_example_follows_the_vit_preset

    assert_example_follows_the_vit_preset(
        "lightning_vit.py", "--batch-size", str(32 // devices), "--devices", str(devices)
    )
