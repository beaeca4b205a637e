"""The plain-PyTorch loop the Selector tests drive (``run_selector``: begin the epoch, train on what update returns,
end the epoch) on synthetic items: sample i holds the number i, and its loss is a fixed table's entry i
(``TableModel``), so a wrong index in update() would show in the selector's score table; and the selection configs
they run it under (``CONFIGS``)."""

from __future__ import annotations

import attent
import torch
from torch.utils.data import DataLoader, TensorDataset

Selector = attent.Selector  # the public name, as a user reaches it
N, EPOCHS = 103, 6
CONFIGS = {
    "vit": dict(preset="vit"),  # scoring passes, soft, growing ratio and interval
    "llm": dict(preset="llm"),  # scores from the training forwards only, hard
    "random": dict(strategy="random", ratio={"kind": "cosine"}),
}
# the released code's reading: a warm-up epoch, two cycles opening with 1 and 2 subset epochs
CYCLES = {"kind": "cycles", "cycles": 2, "start": 1, "end": 2}
for _strategy in ("soft", "hard", "random"):
    CONFIGS[f"cycles-{_strategy}"] = dict(
        strategy=_strategy, ratio={"kind": "incremental"}, interval=CYCLES, rescore=_strategy != "random"
    )


def losses_at(epoch: int) -> torch.Tensor:
    """The per-sample losses of epoch ``epoch`` (training and scoring alike)."""
    return torch.rand(N, generator=torch.Generator().manual_seed(700 + epoch)) * 3.0 + 0.1


class TableModel(torch.nn.Module):
    """A 'model' whose per-sample loss is the table's entry for the sample it is given, times a
    parameter (so the loss has a graph)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.epoch = 0
        self.calls = []  # (grad enabled, training) of each call

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        self.calls.append((torch.is_grad_enabled(), self.training))
        return losses_at(self.epoch)[items] * self.scale


def loss_fn(model: TableModel, batch) -> torch.Tensor:
    return model(batch[0])


def dataset() -> TensorDataset:
    return TensorDataset(torch.arange(N))


def run_selector(selector: Selector, model: TableModel, epochs: range, batch_size: int = 8) -> dict:
    """The plain loop: begin the epoch, train on what update returns, end the epoch; what each
    epoch chose and trained on."""
    loader = DataLoader(selector.dataset, batch_size=batch_size, sampler=selector.sampler)
    out = {"subsets": [], "checksums": [], "trained": [], "metrics": []}
    for epoch in epochs:
        model.epoch = epoch
        out["subsets"].append(selector.begin_epoch(epoch).clone())
        trained = []
        for batch in loader:
            loss = selector.update(loss_fn(model, batch)).mean()
            loss.backward()
            trained.append(batch[0])
        selector.end_epoch()
        out["trained"].append(torch.cat(trained) if trained else torch.empty(0, dtype=torch.long))
        out["metrics"].append(selector.metrics())
        out["checksums"].append(out["metrics"][-1]["subset_checksum"])
    out["table"] = selector.scores.clone()
    return out
