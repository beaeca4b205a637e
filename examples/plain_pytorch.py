"""AtteNT in a plain PyTorch loop: a tiny timm ViT on sklearn's 8x8 digits, the ``vit`` preset
(a scoring pass, then 20% -> 80% of the data chosen by Soft top-k at growing intervals), a
OneCycle LR schedule sized by the planned subsets, and the selection's metrics every epoch.

    PYTHONPATH=platform python examples/plain_pytorch.py --epochs 8   # ~15 s on one CPU thread

Needs `pip install attent timm scikit-learn` (the ViT is timm's, the digits scikit-learn's; attent
itself needs neither; from a clone, `pip install . timm scikit-learn`).

(On a busy machine set OMP_NUM_THREADS=1: oversubscribed threads made it 6x slower here.)

Each epoch prints one JSON line (the test suite reads them).
"""

from __future__ import annotations

import argparse
import json
import time

import attent
import torch
import torch.nn.functional as F
from attent.tasks.vision.data import load_digits
from attent.tasks.vit import build_vit, vit_config
from torch.utils.data import Subset


def per_sample_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """Cross-entropy of each sample, [B]: what AtteNT scores and the loop trains on."""
    return F.cross_entropy(model(batch["image"]), batch["label"], reduction="none")


@torch.no_grad()
def accuracy(model: torch.nn.Module, dataset) -> float:
    model.eval()
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=len(dataset))))
    correct = (model(batch["image"]).argmax(1) == batch["label"]).float().mean().item()
    model.train()
    return correct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)  # OneCycle's peak
    parser.add_argument("--limit", type=int, default=0)  # training samples used (0: all 1,437)
    parser.add_argument("--preset", default="vit", choices=["vit", "llm"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    splits = load_digits(seed=args.seed)
    train_set = Subset(splits.train, range(args.limit)) if args.limit else splits.train
    model = build_vit(vit_config("vit_tiny_cpu", img_size=8, in_chans=1, num_classes=10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)

    # Wrap the dataset, draw from its sampler, train on the losses update() returns, end each epoch.
    selector = attent.Selector(
        train_set,
        selection=attent.SelectionConfig(preset=args.preset),
        epochs=args.epochs,
        seed=args.seed,
        model=model,
        loss_fn=per_sample_loss,
    )
    loader = selector.loader(batch_size=args.batch_size)
    # Sized by the planned subsets, not len(loader) * epochs: the epochs shrink.
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=selector.planned_steps(args.batch_size)
    )
    steps = 0
    for epoch in range(args.epochs):
        start = time.perf_counter()
        selector.begin_epoch(epoch)  # the scoring pass and re-selection, when due
        for batch in loader:
            loss = selector.update(per_sample_loss(model, batch)).mean()
            loss.backward()
            if selector.step_finite():  # a NaN or inf loss: stopped here, or (nonfinite: skip) no step
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            steps += 1
        selector.end_epoch()  # the epoch's scores merged (across ranks under DDP)
        row = {
            **selector.metrics(),
            "steps": steps,
            "planned_steps": scheduler.total_steps,
            "test_accuracy": accuracy(model, splits.test),
            "seconds": round(time.perf_counter() - start, 2),
        }
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    main()
