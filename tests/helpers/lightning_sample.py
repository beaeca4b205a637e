"""The Lightning integration tests' model (one parameter per sample, pulled towards the sample's target), the callback
that records what each epoch chose and trained on, and ``fit``; imported once lightning is known to be installed."""

from __future__ import annotations

import os

import lightning as L
import torch
from attent.integrations.lightning import AtteNTCallback
from attent.selection.config import SelectionConfig
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import TensorDataset

from tests.helpers.ranks import start_method

N, EPOCHS = 103, 6
CONFIGS = {
    "vit": dict(preset="vit"),  # scoring passes, soft, growing ratio and interval
    "llm": dict(preset="llm"),  # scores from the training forwards only, hard
}
TARGETS = torch.randn(N, generator=torch.Generator().manual_seed(11)) * 2
# Quiet and small: no logger, checkpoints, progress bar, summary or sanity check unless a test asks.
TRAINER = dict(
    accelerator="cpu",
    devices=1,
    reload_dataloaders_every_n_epochs=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)


def dataset() -> TensorDataset:
    return TensorDataset(torch.arange(N))


def per_sample_loss(module: SampleModule, batch) -> torch.Tensor:
    return module(batch[0])


class SampleModule(L.LightningModule):
    """One parameter per sample; its loss is the squared distance to the sample's target."""

    def __init__(self, selection: AtteNTCallback | None = None, batch_size: int = 8):
        super().__init__()
        self.value = torch.nn.Parameter(torch.zeros(N))
        self.register_buffer("target", TARGETS.clone())
        self.selection, self.batch_size = selection, batch_size

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        return (self.value[items] - self.target[items]) ** 2

    def training_step(self, batch, batch_idx):
        return self.selection.update(per_sample_loss(self, batch)).mean()

    def train_dataloader(self):
        return self.selection.loader(self.batch_size)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class Record(L.Callback):
    """What each epoch of a fit chose and trained on, on this rank (saved to ``path`` if given)."""

    def __init__(self, selection: AtteNTCallback, path: str | None = None):
        self.selection, self.path = selection, path
        self.subsets, self.checksums, self.hardness, self.trained = [], [], [], []

    def on_train_start(self, trainer, module):
        self.first_subset = self.selection.selector.subset.clone()  # also of an epoch resumed midway

    def on_train_epoch_start(self, trainer, module):
        self.subsets.append(self.selection.selector.subset.clone())
        metrics = self.selection.selector.metrics()  # the Selector's: of the epoch starting
        self.checksums.append(metrics["subset_checksum"])
        self.hardness.append(metrics["selection_hardness"])
        self.trained.append([])

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if not self.trained:  # an epoch resumed midway: Lightning skips its on_train_epoch_start
            self.trained.append([])
        self.trained[-1].append(batch[0].clone())

    def on_train_end(self, trainer, module):
        self.table = self.selection.selector.scores.clone()
        if self.path:
            torch.save(self.result(module), os.path.join(self.path, f"rank{trainer.global_rank}.pt"))

    def result(self, module: SampleModule) -> dict:
        return {
            "first_subset": self.first_subset,
            "subsets": self.subsets,
            "checksums": self.checksums,
            "hardness": self.hardness,
            "trained": [torch.cat(t) for t in self.trained],
            "table": self.table,
            "value": module.value.detach().clone(),
        }


def fit(
    config: SelectionConfig,
    epochs: int,
    seed: int,
    module_class=SampleModule,
    *,
    ckpt_path=None,
    callbacks=(),
    path=None,
    **trainer_kwargs,
) -> tuple[dict, L.Trainer]:
    selection = AtteNTCallback(dataset(), selection=config, seed=seed, loss_fn=per_sample_loss)
    module = module_class(selection)
    record = Record(selection, path)
    trainer = L.Trainer(**{**TRAINER, **trainer_kwargs}, max_epochs=epochs, callbacks=[selection, record, *callbacks])
    trainer.fit(module, ckpt_path=ckpt_path)
    return (record.result(module) if not path else {}), trainer


def ddp_strategy() -> DDPStrategy:
    """Lightning's DDP on gloo, its ranks forked where the tests fork theirs (``ranks``), else
    spawned: Lightning hands its global state (random generators, deterministic flags) to a
    spawned rank but not to a fork server's, whose ranks then trained otherwise (measured: the
    subsets' checksums moved in the 13th digit)."""
    return DDPStrategy(start_method="fork" if start_method() == "fork" else "spawn")
