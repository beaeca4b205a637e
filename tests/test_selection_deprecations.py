"""One spelling per concept (issue 46), and the old spellings that keep working for one release.

Kept: ``selection=`` for the selection config, ``epochs=`` for the run's length and ``seed=``
keyword-only, the dataset the one positional argument (``Selector``, ``AtteNTCallback``;
``AtteNTTrainer`` had them already), ``strategy="random"`` for Random, the metric names of
``attent.selection.metric_names`` (re-exported by ``attent.contract``). Each old spelling works,
warns with a ``FutureWarning`` naming the new one, at the caller's line, and chooses the subsets
the new spelling chooses. (Metric names changed outright: ``hardness`` is ``selection_hardness``.)"""

from __future__ import annotations

import warnings

import attent
import pytest
import torch
from attent import contract
from attent.selection import metric_names
from attent.selection.config import SelectionConfig
from attent.selection.schedules import epochs_before_annealing, training_progress
from attent.selection.strategies import subset_checksum
from attent.selection.teacher import Teacher
from torch.utils.data import TensorDataset

N, EPOCHS, SEED = 60, 5, 3
# Hard by the training forwards' losses after an epoch on all data: the scores steer every subset
LLM = SelectionConfig(preset="llm")
LOSSES = torch.rand(N, generator=torch.Generator().manual_seed(5)) * 3 + 0.1


def dataset() -> TensorDataset:
    return TensorDataset(torch.arange(N))


def loss_of(batch) -> torch.Tensor:
    return LOSSES[batch[0]].clone().requires_grad_()


def run(selector) -> list[torch.Tensor]:
    """Every epoch's subset of a plain loop, which checks that metrics() reports it."""
    subsets = []
    for epoch in range(EPOCHS):
        subsets.append(selector.begin_epoch(epoch).clone())
        for batch in selector.loader(batch_size=8):
            selector.update(loss_of(batch)).backward()
        assert selector.metrics()[contract.SUBSET_CHECKSUM] == subset_checksum(subsets[-1])
    return subsets


def same_subsets(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def new_spelling(**kwargs):
    """Calls on today's spellings raise no FutureWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        return attent.Selector(dataset(), selection=LLM, epochs=EPOCHS, seed=SEED, **kwargs)


# --- the selection config, epochs and seed: keywords ----------------------------------------------------
OLD_SELECTOR_CALLS = {
    "positional config, epochs, seed": lambda: attent.Selector(dataset(), LLM, EPOCHS, SEED),
    "positional config and epochs": lambda: attent.Selector(dataset(), LLM, EPOCHS, seed=SEED),
    "config=": lambda: attent.Selector(dataset(), config=LLM, epochs=EPOCHS, seed=SEED),
}


@pytest.mark.parametrize("call", OLD_SELECTOR_CALLS, ids=list(OLD_SELECTOR_CALLS))
def test_old_selector_spellings_warn_and_choose_the_same_subsets(call):
    with pytest.warns(FutureWarning, match="selection=") as caught:
        old = OLD_SELECTOR_CALLS[call]()
    assert all(w.filename == __file__ for w in caught), "the warning points at the caller's line"
    assert (old.selection, old.epochs, old.seed) == (LLM, EPOCHS, SEED)
    assert same_subsets(run(old), run(new_spelling()))


def test_the_new_selector_signature_is_keyword_only():
    with pytest.raises(TypeError, match="both config= and selection="):
        attent.Selector(dataset(), config=LLM, selection=LLM, epochs=EPOCHS)
    with pytest.raises(TypeError, match="multiple values for argument 'epochs'"):
        attent.Selector(dataset(), LLM, EPOCHS, epochs=EPOCHS)
    with pytest.raises(TypeError, match="positional arguments too many"):
        attent.Selector(dataset(), LLM, EPOCHS, SEED, None)
    with pytest.raises(TypeError):
        attent.Selector(dataset(), selection=LLM)  # epochs: required


def test_selector_config_attribute_still_reads_and_metrics_take_the_engines_names():
    selector = new_spelling()
    run(selector)
    with pytest.warns(FutureWarning, match="Selector.selection"):
        assert selector.config is selector.selection
    metrics = selector.metrics()
    assert set(metrics) == {
        metric_names.EPOCH,
        contract.SELECTED_RATIO,
        metric_names.SELECTED,
        contract.SELECTION_HARDNESS,
        contract.SELECTION_OVERLAP,
        contract.SAMPLES_BACKPROPAGATED,
        contract.SAMPLES_FORWARDED,
        contract.SCORE_AGREEMENT,
        metric_names.SAMPLES_SCORED,
        contract.TRAIN_LOSS,
        contract.SUBSET_CHECKSUM,
    }
    assert metrics[contract.SELECTION_HARDNESS] == 1.0  # hard top-k
    assert type(metrics) is dict  # torch.save / torch.load(weights_only=True) and json take it as it is


def test_the_contract_reexports_the_selection_metric_names():
    """One definition: the engine and analysis read attent.contract, the integrations selection/."""
    for name in (
        "TRAIN_LOSS",
        "SELECTED_RATIO",
        "SAMPLES_BACKPROPAGATED",
        "SUBSET_CHECKSUM",
        "SELECTION_HARDNESS",
        "SELECTION_OVERLAP",
        "SCORE_AGREEMENT",
    ):
        assert getattr(contract, name) is getattr(metric_names, name)


# --- total_epochs -> epochs -----------------------------------------------------------------------------
def test_total_epochs_still_works_with_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        new = Teacher(N, LLM, epochs=EPOCHS, seed=SEED)
    with pytest.warns(FutureWarning, match=r"Teacher\(epochs=\.\.\.\)"):
        old = Teacher(N, LLM, total_epochs=EPOCHS, seed=SEED)
    for teacher in (old, new):
        for epoch in range(EPOCHS):
            teacher.begin_epoch(epoch)
            teacher.observe(teacher.subset, LOSSES[teacher.subset])
            teacher.end_epoch()
    assert same_subsets([r.indices for r in old.history], [r.indices for r in new.history])
    with pytest.warns(FutureWarning, match="Teacher.epochs"):
        assert old.total_epochs == EPOCHS
    with pytest.warns(FutureWarning, match=r"planned_ratios\(epochs="):
        assert LLM.planned_ratios(total_epochs=EPOCHS) == LLM.planned_ratios(EPOCHS)
    with pytest.warns(FutureWarning, match=r"label\(epochs="):
        assert LLM.label(total_epochs=EPOCHS) == LLM.label(EPOCHS)
    with pytest.warns(FutureWarning):
        assert training_progress(2, total_epochs=4) == training_progress(2, 4) == 0.5
    with pytest.warns(FutureWarning):
        assert epochs_before_annealing(total_epochs=8, final=0.25) == epochs_before_annealing(8, 0.25) == 6


# --- Random: strategy="random" --------------------------------------------------------------------------
def test_the_random_method_is_an_alias_of_the_random_strategy():
    kept = SelectionConfig(strategy="random", ratio={"kind": "cosine"})
    with pytest.warns(FutureWarning, match="strategy='random'") as caught:
        old = SelectionConfig(method="random", ratio={"kind": "cosine"})
    assert all(w.filename == __file__ for w in caught)
    assert old == kept and (old.method, old.strategy) == ("attent", "random")
    assert old.label(EPOCHS) == kept.label(EPOCHS) == "Random · cosine(0.2→0.8, reached 0.74) · fixed(1)"
    with pytest.warns(FutureWarning):  # the strategy was forced to random, and still is
        assert SelectionConfig(method="random", strategy="hard") == SelectionConfig(strategy="random")
    with pytest.warns(FutureWarning):  # a preset's other fields stay, its strategy gives way
        assert SelectionConfig(preset="vit", method="random") == SelectionConfig(preset="vit", strategy="random")
    subsets = []
    for cfg in (old, kept):
        teacher = Teacher(N, cfg, EPOCHS, seed=SEED)
        subsets.append([teacher.begin_epoch(epoch).clone() for epoch in range(EPOCHS)])
    assert same_subsets(*subsets) and not teacher.needs_scoring(0)
    with pytest.raises(ValueError):
        SelectionConfig(method="randomly")


# --- the Lightning callback ---------------------------------------------------------------------------
def fit(callback) -> list[torch.Tensor]:
    """The callback in a Lightning fit: every epoch's subset."""
    L = pytest.importorskip("lightning")

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(()))

        def training_step(self, batch, batch_idx):
            return callback.update(loss_of(batch) * self.scale)

        def train_dataloader(self):
            return callback.loader(batch_size=8)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=EPOCHS,
        reload_dataloaders_every_n_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[callback],
    )
    trainer.fit(Module())
    return [r.indices for r in callback.selector.teacher.history]


@pytest.mark.timeout(120)
def test_old_callback_spellings_warn_and_choose_the_same_subsets():
    pytest.importorskip("lightning")
    from attent.integrations.lightning import AtteNTCallback

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        new = AtteNTCallback(dataset(), selection=LLM, seed=SEED)
    with pytest.warns(FutureWarning, match="selection=, seed="):
        positional = AtteNTCallback(dataset(), LLM, SEED)
    with pytest.warns(FutureWarning, match=r"AtteNTCallback\(selection=\.\.\.\)"):
        keyword = AtteNTCallback(dataset(), config=LLM, seed=SEED)
    with pytest.warns(FutureWarning, match="AtteNTCallback.selection"):
        assert keyword.config is LLM
    expected = fit(new)
    assert len(expected) == EPOCHS - 1  # epoch 0 on all data, then a re-selection every epoch
    assert same_subsets(fit(positional), expected) and same_subsets(fit(keyword), expected)
    with pytest.raises(TypeError, match="positional arguments too many"):
        AtteNTCallback(dataset(), LLM, SEED, None)
