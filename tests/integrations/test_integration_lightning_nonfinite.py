"""The Lightning callback under a NaN loss (``selection.nonfinite``): checked at the Lightning
hook before the optimiser step that would use it; ``raise`` stops the fit there naming the sample
and the step, ``skip`` skips that step (the parameters untouched) and the fit goes on."""

from __future__ import annotations

import math

import pytest
import torch

L = pytest.importorskip("lightning")

from attent.integrations.lightning import AtteNTCallback  # noqa: E402
from attent.selection.config import SelectionConfig  # noqa: E402

from tests.helpers.lightning_sample import TRAINER, SampleModule, dataset, per_sample_loss  # noqa: E402


class NaNAtStepModule(SampleModule):
    """The loss of the first sample of the third optimiser step's batch is multiplied by NaN: its gradient is NaN
    too, so SGD taking that step would leave its parameter NaN."""

    poisoned: int | None = None

    def training_step(self, batch, batch_idx):
        losses = per_sample_loss(self, batch)
        if self.trainer.global_step == 2:
            self.poisoned = int(batch[0][0])
            losses = losses * torch.tensor([math.nan] + [1.0] * (len(losses) - 1))
        return self.selection.update(losses).mean()


class Values(L.Callback):
    """The parameters before training and after each batch's optimiser step (taken or skipped)."""

    def __init__(self, selection: AtteNTCallback):
        self.selection, self.values, self.nonfinite = selection, [], []

    def on_train_start(self, trainer, module):
        self.values.append(module.value.detach().clone())

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.values.append(module.value.detach().clone())

    def on_train_epoch_end(self, trainer, module):  # after the AtteNTCallback's: its metrics are this epoch's
        self.nonfinite.append(self.selection.metrics()["samples_nonfinite"])


def fit_with_a_nan(nonfinite: str) -> tuple[NaNAtStepModule, Values, L.Trainer, AtteNTCallback]:
    selection = AtteNTCallback(
        dataset(), selection=SelectionConfig(preset="llm", nonfinite=nonfinite), seed=0, loss_fn=per_sample_loss
    )
    module, values = NaNAtStepModule(selection), Values(selection)
    trainer = L.Trainer(**TRAINER, max_epochs=2, callbacks=[selection, values])
    return module, values, trainer, selection


def test_a_nan_loss_stops_the_fit_before_its_optimiser_step():
    module, values, trainer, _ = fit_with_a_nan("raise")
    with pytest.raises(ValueError, match=r"non-finite loss at optimiser step 3 of epoch 1 for samples \[(\d+)\]") as e:
        trainer.fit(module)
    assert f"samples [{module.poisoned}]" in str(e.value)
    assert trainer.global_step == 2 and len(values.values) == 3  # two steps taken, the third stopped
    assert torch.equal(module.value.detach(), values.values[2])  # the parameters of the step before
    assert torch.isfinite(module.value).all() and not torch.equal(values.values[2], values.values[0])


def test_under_skip_a_nan_losss_step_is_skipped_and_the_fit_goes_on():
    module, values, trainer, selection = fit_with_a_nan("skip")
    trainer.fit(module)
    v = values.values
    assert torch.equal(v[3], v[2])  # the third step skipped: SGD would have made the sample's parameter NaN
    assert not torch.equal(v[2], v[1]) and not torch.equal(v[4], v[3])  # the steps around it taken
    assert torch.isfinite(module.value).all()
    assert trainer.global_step == selection.planned_steps(8) == len(v) - 1  # the fit went to its end
    assert values.nonfinite == [1, 0]
