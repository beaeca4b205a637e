"""The Lightning callback refuses, in one line naming the fix, each Trainer setting, loader and checkpoint it cannot use."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

L = pytest.importorskip("lightning")

from attent.integrations.lightning import AtteNTCallback  # noqa: E402
from attent.selection.config import SelectionConfig  # noqa: E402

from tests.helpers.lightning_sample import CONFIGS, TRAINER, SampleModule, dataset, ddp_strategy, fit  # noqa: E402


# --- (d) each setting the callback needs, refused in one line ---------------------------------------------
def refusal(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_trainer_that_does_not_reload_the_train_loader_is_refused():
    with pytest.raises(ValueError, match=r"Trainer\(reload_dataloaders_every_n_epochs=1\)") as error:
        fit(SelectionConfig(**CONFIGS["llm"]), 2, 0, reload_dataloaders_every_n_epochs=0)
    refusal(error)


def test_a_trainer_without_max_epochs_is_refused():
    with pytest.raises(ValueError, match=r"Trainer\(max_epochs=E\)") as error:
        fit(SelectionConfig(**CONFIGS["llm"]), None, 0, max_steps=20)
    refusal(error)


@pytest.mark.timeout(120)
def test_ddp_with_lightnings_distributed_sampler_is_refused():
    """Refused at the callback's ``setup``, which Lightning calls on each rank before any loader is
    built; called here on a two-device DDP Trainer that launches no process (the two-rank test
    above fits one with the setting the refusal names)."""
    selection = AtteNTCallback(dataset(), selection=SelectionConfig(**CONFIGS["llm"]), seed=0)
    trainer = L.Trainer(**{**TRAINER, "devices": 2}, strategy=ddp_strategy(), max_epochs=2, callbacks=[selection])
    assert trainer.world_size == 2
    with pytest.raises(ValueError, match=r"needs Trainer\(use_distributed_sampler=False\) under DDP: its sampler"):
        selection.setup(trainer, SampleModule(selection), "fit")
    quiet = L.Trainer(
        **{**TRAINER, "devices": 2},
        strategy=ddp_strategy(),
        max_epochs=2,
        use_distributed_sampler=False,
        callbacks=[selection],
    )
    selection.setup(quiet, SampleModule(selection), "fit")  # the setting it names is enough


class OwnLoaderModule(SampleModule):
    def train_dataloader(self):
        return DataLoader(dataset(), batch_size=8, shuffle=True)


def test_a_train_loader_that_does_not_draw_from_the_callbacks_sampler_is_refused():
    with pytest.raises(ValueError, match=r"does not draw from callback.sampler: build it with sampler=") as error:
        fit(SelectionConfig(**CONFIGS["llm"]), 2, 0, OwnLoaderModule)
    refusal(error)


def test_a_scoring_preset_without_loss_fn_is_refused():
    selection = AtteNTCallback(dataset(), selection=SelectionConfig(preset="vit"), seed=0)
    trainer = L.Trainer(**TRAINER, max_epochs=2, callbacks=[selection])
    with pytest.raises(ValueError, match=r"runs scoring passes: pass AtteNTCallback\(loss_fn=\.\.\.\)") as error:
        trainer.fit(SampleModule(selection))
    refusal(error)


def test_update_before_the_trainer_set_the_callback_up_is_refused():
    selection = AtteNTCallback(dataset(), selection=SelectionConfig(preset="llm"), seed=0)
    with pytest.raises(RuntimeError, match=r"pass it in Trainer\(callbacks=\[\.\.\.\]\)") as error:
        selection.update(torch.ones(4))
    refusal(error)


def test_resuming_from_a_checkpoint_without_the_callbacks_state_is_refused(tmp_path):
    config = SelectionConfig(**CONFIGS["llm"])
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(tmp_path, "{epoch}", save_top_k=-1)
    fit(config, 2, 0, callbacks=[checkpoints], enable_checkpointing=True, default_root_dir=tmp_path)
    checkpoint = torch.load(tmp_path / "epoch=0.ckpt", weights_only=False)
    assert any("AtteNTCallback" in key for key in checkpoint["callbacks"])
    checkpoint["callbacks"] = {k: v for k, v in checkpoint["callbacks"].items() if "AtteNTCallback" not in k}
    torch.save(checkpoint, tmp_path / "without.ckpt")
    with pytest.raises(RuntimeError, match=r"chose the subset of epoch 0 but the Trainer starts epoch 1") as error:
        fit(config, 2, 0, ckpt_path=tmp_path / "without.ckpt", default_root_dir=tmp_path)
    refusal(error)
