"""The Selector inside an epoch: a state taken there resumes into the same epoch (under the progress
reading and the released code's cycles alike), nothing in ``update`` waits on the device, and the
counters count what was trained. The loop and its synthetic data are tests/helpers/selector_loop.py's."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from attent.selection.config import SelectionConfig
from attent.selection.records import STATE_FORMAT
from attent.selection.schedules import budget
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader

from tests.helpers.selector_loop import CONFIGS, EPOCHS, N, Selector, TableModel, dataset, loss_fn, run_selector


@pytest.mark.parametrize("name", ["vit", "llm", "cycles-soft", "cycles-hard", "cycles-random"])
def test_a_loop_resumed_inside_an_epoch_goes_on_as_the_uninterrupted_one(name):
    """A state taken after a few batches of an epoch (as a step checkpoint takes it) and loaded
    into a new Selector: begin_epoch of that epoch neither scores nor re-selects again, the pass
    goes on after the batches recorded, and every later subset, the table and the counters are
    the uninterrupted run's. Under interval kind cycles (defect: a resumed run re-selected at the
    epoch it resumed in) as under the progress reading."""
    config, epochs, stop = SelectionConfig(**CONFIGS[name]), 6, (1, 2)  # epoch 1, after two batches
    model = TableModel()
    whole = Selector(dataset(), selection=config, epochs=epochs, seed=2, model=model, loss_fn=loss_fn)
    uninterrupted = run_selector(whole, model, range(epochs))

    model = TableModel()
    first = Selector(dataset(), selection=config, epochs=epochs, seed=2, model=model, loss_fn=loss_fn)
    run_selector(first, model, range(stop[0]))
    model.epoch = stop[0]
    first.begin_epoch(stop[0])
    loader = DataLoader(first.dataset, batch_size=8, sampler=first.sampler)
    for batch in itertools.islice(loader, stop[1]):
        first.update(loss_fn(model, batch)).mean().backward()
    state = first.state_dict()
    reselections = len(first.history)

    resumed = Selector(dataset(), selection=config, epochs=epochs, seed=2, model=model, loss_fn=loss_fn)
    resumed.load_state_dict(state)
    resumed.begin_epoch(stop[0])
    assert len(resumed.history) == reselections  # no second pick at the resumed epoch
    loader = DataLoader(resumed.dataset, batch_size=8, sampler=resumed.sampler)
    for batch in itertools.islice(loader, stop[1], None):  # the batches after the checkpoint's
        resumed.update(loss_fn(model, batch)).mean().backward()
    resumed.end_epoch()
    rest = run_selector(resumed, model, range(stop[0] + 1, epochs))
    assert rest["checksums"] == uninterrupted["checksums"][stop[0] + 1 :]
    assert torch.equal(rest["table"].nan_to_num(-1), uninterrupted["table"].nan_to_num(-1))
    for key in ("samples_backpropagated", "samples_forwarded", "train_loss"):
        assert rest["metrics"][-1][key] == uninterrupted["metrics"][-1][key]


def test_an_unknown_state_format_is_refused_in_one_line():
    selector = Selector(dataset(), selection=SelectionConfig(preset="llm"), epochs=EPOCHS)
    state = selector.state_dict()
    assert state["format"] == STATE_FORMAT == 3  # the flat layout
    with pytest.raises(ValueError, match=f"format 1, this attent reads format {STATE_FORMAT}") as err:
        selector.load_state_dict({key: value for key, value in state.items() if key != "format"})
    assert "\n" not in str(err.value)


# --- what update() does on the device, and what is counted -------------------------------------------
HOST_SYNCS = {"item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"}


class HostSyncs(TorchFunctionMode):
    """Records the tensor calls that make the host wait for the device (on a GPU: a stream sync)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_SYNCS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["vit", "llm", "random", "components"])
def test_update_never_waits_on_the_device(name):
    """No .item(), .cpu(), .tolist(), float() or int() of a tensor inside update(): the losses stay
    on their device until the epoch's merge (on 9171ffd: .cpu() where each batch's losses were recorded,
    int(indices.min()), float() sums in the Selector, at every batch). The merge, at end_epoch, reads them once."""
    config = SelectionConfig(**CONFIGS.get(name, CONFIGS["vit"]))
    model = TableModel()
    components = ("rgb", "depth") if name == "components" else ()

    def losses_of(model, batch):
        losses = loss_fn(model, batch)
        return torch.stack([losses, 2 * losses], dim=1) if components else losses

    selector = Selector(
        dataset(), selection=config, epochs=EPOCHS, model=model, loss_fn=losses_of, components=components
    )
    loader = selector.loader(batch_size=8)
    for epoch in range(3):
        model.epoch = epoch
        selector.begin_epoch(epoch)
        for batch in loader:
            losses = losses_of(model, batch)
            with HostSyncs() as syncs:
                weighed = selector.update(losses)
            assert syncs.calls == [], syncs.calls
            weighed.mean().backward()
        selector.end_epoch()
    assert not torch.isnan(selector.scores).all()


def test_counters_count_what_was_trained():
    """A loop that leaves an epoch early (a step limit, a break) trains part of the subset:
    samples_backpropagated counts those samples (on 9171ffd: the whole subset at begin_epoch), and
    padding that equalises ranks counts once."""
    config = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5})
    model = TableModel()
    selector = Selector(dataset(), selection=config, epochs=3, model=model, loss_fn=loss_fn)
    loader = selector.loader(batch_size=8)
    subset = selector.begin_epoch(0)
    for batch in itertools.islice(loader, 3):
        selector.update(loss_fn(model, batch)).mean().backward()
    selector.end_epoch()
    assert selector.metrics()["samples_backpropagated"] == 24 < subset.numel()
    selector.begin_epoch(1)
    for batch in loader:
        selector.update(loss_fn(model, batch)).mean().backward()
    selector.end_epoch()
    assert selector.metrics()["samples_backpropagated"] == 24 + budget(N, 0.5)
    # rank 1 of 2 on a subset of 52: its shard of 26 is all real; of 51 (N=103, ratio 0.5): 25 real + 1 padding
    half = Selector(dataset(), selection=config, epochs=3, rank=1, world_size=2, model=model, loss_fn=loss_fn)
    assert half.sampler.real_count() == math.ceil((N - 1) / 2)
