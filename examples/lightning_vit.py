"""AtteNT in Lightning: a tiny timm ViT on sklearn's 8x8 digits, trained by a Lightning Trainer
with AtteNTCallback and the ``vit`` preset (a scoring pass, then 20% -> 80% of the data chosen by
Soft top-k at growing intervals), a OneCycle LR schedule sized by the planned subsets, and the
selection's metrics every epoch.

    PYTHONPATH=platform python examples/lightning_vit.py --epochs 8      # one CPU process
    PYTHONPATH=platform python examples/lightning_vit.py --devices 2     # two DDP processes (gloo)

Needs `pip install 'attent[lightning]' timm scikit-learn` (the ViT is timm's, the digits scikit-learn's; from a
clone, `pip install '.[lightning]' timm scikit-learn`).

(On a busy machine set OMP_NUM_THREADS=1.) Each epoch prints one JSON line (the test suite reads
them); under DDP rank 0 prints, and train_loss is the mean over both ranks.
"""

from __future__ import annotations

import argparse
import json
import logging
import warnings

import attent
import lightning as L
import torch
import torch.nn.functional as F
from attent.tasks.vision.data import load_digits
from attent.tasks.vit import build_vit, vit_config
from torch.utils.data import DataLoader, Subset


def per_sample_loss(module: L.LightningModule, batch: dict) -> torch.Tensor:
    """Cross-entropy of each sample, [B]: what AtteNT scores and the Trainer trains on."""
    return F.cross_entropy(module(batch["image"]), batch["label"], reduction="none")


class ViTClassifier(L.LightningModule):
    def __init__(self, selection: attent.AtteNTCallback, test_set, batch_size: int, lr: float):
        super().__init__()
        self.vit = build_vit(vit_config("vit_tiny_cpu", img_size=8, in_chans=1, num_classes=10))
        self.selection, self.test_set, self.batch_size, self.lr = selection, test_set, batch_size, lr

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.vit(images)

    # The two AtteNT lines: draw from the callback's sampler, train on the loss update() returns.
    def train_dataloader(self) -> DataLoader:
        return self.selection.loader(batch_size=self.batch_size)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self.selection.update(per_sample_loss(self, batch)).mean()  # scores recorded, loss weights applied

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.05)
        # Sized by the planned subsets: trainer.estimated_stepping_batches knows only the first epoch's.
        self.planned_steps = self.selection.planned_steps(self.batch_size)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.lr, total_steps=self.planned_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=512)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        correct = (self(batch["image"]).argmax(1) == batch["label"]).float().mean()
        self.log("test_accuracy", correct, batch_size=len(batch["label"]), sync_dist=True)

    def on_train_epoch_end(self) -> None:
        # After AtteNTCallback's own hook: metrics() is this epoch's selection, under the engine's
        # metric names (selected_ratio, selection_hardness, subset_checksum, train_loss, ...).
        if self.trainer.is_global_zero:
            row = {
                **self.selection.metrics(),
                "steps": self.trainer.global_step,
                "planned_steps": self.planned_steps,
                "test_accuracy": float(self.trainer.callback_metrics["test_accuracy"]),
            }
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)  # per process
    parser.add_argument("--lr", type=float, default=3e-3)  # OneCycle's peak
    parser.add_argument("--limit", type=int, default=0)  # training samples used (0: all 1,437)
    parser.add_argument("--preset", default="vit", choices=["vit", "llm"])
    parser.add_argument("--devices", type=int, default=1)  # CPU processes; 2 or more run DDP
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no "GPU available" banners
    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # the digits are in memory
    L.seed_everything(args.seed, verbose=False)
    splits = load_digits(seed=args.seed)
    train_set = Subset(splits.train, range(args.limit)) if args.limit else splits.train

    selection = attent.AtteNTCallback(
        train_set, selection=attent.SelectionConfig(preset=args.preset), seed=args.seed, loss_fn=per_sample_loss
    )  # loss_fn: for the scoring pass
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        callbacks=[selection],
        reload_dataloaders_every_n_epochs=1,  # each epoch's subset has its own size: Lightning re-reads it
        use_distributed_sampler=False,  # under DDP the callback's sampler shards the subset itself
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )  # quiet: the JSON lines are the log
    trainer.fit(ViTClassifier(selection, splits.test, args.batch_size, args.lr))


if __name__ == "__main__":
    main()
