"""The authors' released code's reading of "interval" (issue 48): ``interval.kind: cycles``.

One warm-up epoch on all data, then K cycles; each opens with S_c subset epochs at the cycle's ratio
(re-drawn at each with ``redraw``) and trains the rest of the cycle on all data, no scoring pass.
The plan is a pure function of E; the Selector follows it, two ranks agree, no epoch is lost."""

from __future__ import annotations

import math
import os

import attent
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attent.experiment.files import load_experiment
from attent.selection.config import SelectionConfig
from attent.selection.plan import build_plan, cycle_plan
from attent.selection.sampler import shard_indices
from attent.selection.schedules import CycleSchedule, RatioSchedule, budget
from attent.selection.selector import Selector
from pydantic import ValidationError
from torch.utils.data import TensorDataset

from tests.helpers.paths import REPO
from tests.helpers.ranks import start_method

E, N = 21, 101
# the example: 4 cycles, subset epochs 1 -> 4, ratio 0.2 -> 0.8 (one step per cycle)
RATIO = {"kind": "incremental", "start": 0.2, "end": 0.8}
CYCLES = {"kind": "cycles", "cycles": 4, "start": 1, "end": 4}
SOFT = dict(
    strategy="soft",
    soft_logits="raw",
    rescore=True,
    ratio={"kind": "incremental", "start": 0.2, "end": 0.8},
    interval=CYCLES,
)
HARD = {**SOFT, "strategy": "hard"}
# epoch -> (ratio, re-selects) of the E = 21 plan; every other epoch trains on all data
SUBSET_EPOCHS = {1: 0.2, 6: 0.4, 7: 0.4, 11: 0.6, 12: 0.6, 13: 0.6, 16: 0.8, 17: 0.8, 18: 0.8, 19: 0.8}
CYCLE_STARTS = (1, 6, 11, 16)


def losses_at(epoch: int) -> torch.Tensor:
    return torch.rand(N, generator=torch.Generator().manual_seed(900 + epoch)) * 3.0 + 0.1


# --- the plan -------------------------------------------------------------------------------------
def test_the_plan_at_e21_trains_17_sample_epochs_of_21():
    cfg = SelectionConfig(**SOFT)
    assert cfg.warmup_epochs == 1 and cfg.interval.redraw is True  # the code's defaults for Soft
    plan = build_plan(cfg, E)
    assert [p.epoch for p in plan] == list(range(E))
    assert {p.epoch: p.ratio for p in plan if not p.all_data} == pytest.approx(SUBSET_EPOCHS)
    assert [p.epoch for p in plan if p.all_data] == [0, 2, 3, 4, 5, 8, 9, 10, 14, 15, 20]
    assert [p.cycle for p in plan] == [None] + [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5
    # re-drawn at every subset epoch (Soft, as the code)
    assert build_plan(cfg, E).ratios() == [(e, pytest.approx(r)) for e, r in SUBSET_EPOCHS.items()]
    # 1 + (0.2 + 4) + (0.8 + 3) + (1.8 + 2) + (3.2 + 1) = 17
    assert build_plan(cfg, E).mean_ratio() * E == pytest.approx(17.0)
    assert 1 - build_plan(cfg, E).mean_ratio() == pytest.approx(4 / 21)  # the ideal sample saving
    assert build_plan(cfg, E).ratio_reached() == 1.0


def test_hard_and_random_keep_the_cycles_pick_unless_told_to_redraw():
    hard = SelectionConfig(**HARD)
    assert hard.interval.redraw is False
    assert build_plan(hard, E).ratios() == [(e, pytest.approx(SUBSET_EPOCHS[e])) for e in CYCLE_STARTS]
    # the same epochs on subsets, so the same budget
    assert build_plan(hard, E).mean_ratio() == pytest.approx(build_plan(SelectionConfig(**SOFT), E).mean_ratio())
    told = SelectionConfig(**{**HARD, "interval": {**CYCLES, "redraw": True}})
    assert [e for e, _ in build_plan(told, E).ratios()] == list(SUBSET_EPOCHS)
    assert (
        build_plan(SelectionConfig(**{**SOFT, "interval": {**CYCLES, "redraw": False}}), E).ratios()
        == build_plan(hard, E).ratios()
    )


def test_the_ratio_steps_once_per_cycle_from_start_to_end():
    """r_c = r0 + (r1 - r0) c / (K - 1): the last cycle reaches r1 (the progress schedules
    approach it); cosine reads the same place among the cycles."""
    cosine = SelectionConfig(**{**HARD, "ratio": {"kind": "cosine"}})
    assert [r for _, r in build_plan(cosine, E).ratios()] == pytest.approx([0.2, 0.35, 0.65, 0.8])
    fixed = SelectionConfig(**{**HARD, "ratio": {"kind": "fixed", "start": 0.5}})
    assert [r for _, r in build_plan(fixed, E).ratios()] == [0.5] * 4
    one = cycle_plan(10, 1, CycleSchedule(1, 2, 3), RatioSchedule("incremental", 0.2, 0.8))
    assert [(p.epoch, p.ratio) for p in one if p.selects] == [(1, pytest.approx(0.8))]  # K = 1: the ends
    assert sum(not p.all_data for p in one) == 3


@pytest.mark.parametrize("cycles,start,end", [(1, 1, 1), (3, 1, 2), (4, 1, 4), (10, 5, 10), (7, 2, 1)])
@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_no_epoch_is_lost_to_rounding_at_any_e(cycles, start, end, warmup):
    """Cycles of E - W epochs split K ways differ by at most one epoch, and cover every epoch
    (the released code's (E - 1) // K drops the remainder)."""
    schedule = CycleSchedule(cycles, start, end)
    ratio = RatioSchedule("incremental", 0.2, 0.8)
    shortest = warmup + cycles * max(start, end)
    for epochs in range(shortest, shortest + 3 * cycles + 40):
        plan = cycle_plan(epochs, warmup, schedule, ratio)
        assert [p.epoch for p in plan] == list(range(epochs))
        lengths = [sum(p.cycle == c for p in plan) for c in range(cycles)]
        assert sum(lengths) == epochs - warmup and max(lengths) - min(lengths) <= 1
        assert [sum(p.cycle == c and not p.all_data for p in plan) for c in range(cycles)] == [
            schedule.subset_epochs(c) for c in range(cycles)
        ]
        assert all(p.all_data for p in plan[:warmup])


def test_the_released_codes_settings_at_e800():
    """E = 800, 10 cycles: the code's floor division trains 1 + 10 x 79 = 791 epochs (9 lost);
    here 9 cycles of 80 and one of 79. Ideal saving 25 sample-epochs (3.1 %) with a fixed 5
    subset epochs, 32.5 (4.1 %) with 5 -> 10 (5, 5, 6, 6, 7, 7, 8, 8, 9, 10, as the code floors)."""
    schedule = CycleSchedule(10, 5, 10)
    bounds = schedule.bounds(800, 1)
    assert sorted(b - a for a, b in zip(bounds, bounds[1:])) == [79] + [80] * 9
    assert 1 + 10 * ((800 - 1) // 10) == 791
    assert [schedule.subset_epochs(c) for c in range(10)] == [5, 5, 6, 6, 7, 7, 8, 8, 9, 10]
    ratio = {"kind": "incremental", "start": 0.2, "end": 0.8}
    fixed = SelectionConfig(strategy="hard", ratio=ratio, interval={"kind": "cycles", "cycles": 10, "start": 5})
    incremental = SelectionConfig(
        strategy="hard", ratio=ratio, interval={"kind": "cycles", "cycles": 10, "start": 5, "end": 10}
    )
    assert (1 - build_plan(fixed, 800).mean_ratio()) * 800 == pytest.approx(25.0)
    assert (1 - build_plan(incremental, 800).mean_ratio()) * 800 == pytest.approx(32.5 + 1 / 30)


@pytest.mark.parametrize(
    "epochs,interval,warmup,message",
    [
        (21, {**CYCLES, "end": 6}, None, r"cycle 4 of 4 has 5 epochs .* cannot hold 6 subset epochs"),
        (4, CYCLES, None, r"4 cycles need at least 4 epochs after the 1 warm-up epoch\(s\); the run has 3"),
        (3, {**CYCLES, "cycles": 1}, 3, r"3 warm-up epoch\(s\) leave no epoch for the cycles"),
    ],
)
def test_an_impossible_plan_is_refused_in_one_line(epochs, interval, warmup, message):
    cfg = SelectionConfig(
        strategy="hard",
        ratio={"kind": "incremental"},
        interval=interval,
        **({} if warmup is None else {"warmup_epochs": warmup}),
    )
    for plan in (
        lambda: build_plan(cfg, epochs),
        lambda: Selector(range(N), selection=cfg, epochs=epochs),
        lambda: build_plan(cfg, epochs).mean_ratio(),
    ):
        with pytest.raises(ValueError, match=message) as err:
            plan()
        assert "\n" not in str(err.value)
    # full data on the same section plans nothing and refuses nothing
    assert build_plan(SelectionConfig(method="full", interval=interval), epochs).mean_ratio() == 1.0


def test_config_refusals_and_leftovers():
    with pytest.raises(ValidationError, match="interval kind cycles needs interval.cycles"):
        SelectionConfig(interval={"kind": "cycles", "start": 1}, ratio=RATIO)
    with pytest.raises(ValidationError, match="anneal does not combine with interval kind cycles"):
        SelectionConfig(interval=CYCLES, anneal=0.125, ratio=RATIO)
    with pytest.raises(ValidationError):
        SelectionConfig(interval={**CYCLES, "cycles": 0}, ratio=RATIO)
    # an override of the kind drops the cycles' own settings; the other kinds' params (and so run
    # identities) are what they were before cycles existed
    leftover = SelectionConfig(interval={**CYCLES, "kind": "fixed", "redraw": True}, ratio=RATIO).interval
    assert (leftover.cycles, leftover.redraw) == (None, None)
    assert leftover.model_dump() == {"kind": "fixed", "start": 1, "end": 1}
    assert SelectionConfig(preset="vit").model_dump(mode="json")["interval"] == {
        "kind": "incremental",
        "start": 1,
        "end": 4,
    }
    assert SelectionConfig(**SOFT).model_dump()["interval"] == {**CYCLES, "redraw": True}
    # the progress reading keeps its warm-up default
    assert SelectionConfig(method="full").warmup_epochs == 0 and SelectionConfig(preset="vit").warmup_epochs == 0
    assert SelectionConfig(preset="llm", interval=CYCLES).warmup_epochs == 1


def test_a_presets_interval_does_not_leak_into_cycles():
    """The vit preset's interval is incremental 1 -> 4: its end must not make a fixed number of
    subset epochs grow; the rest of the preset (Soft, rescoring, ratio) applies."""
    cfg = SelectionConfig(preset="vit", interval={"kind": "cycles", "cycles": 10, "start": 5})
    assert (cfg.interval.start, cfg.interval.end, cfg.warmup_epochs) == (5, 5, 1)
    assert (cfg.strategy, cfg.rescore, cfg.ratio.kind, cfg.interval.redraw) == ("soft", True, "incremental", True)


def test_labels_show_the_cycles_reading():
    soft, hard = SelectionConfig(**SOFT), SelectionConfig(**HARD)
    assert (
        build_plan(soft, E).label == "Soft · incremental(0.2→0.8) per cycle · cycles(4 × 1→4 subset epochs, re-drawn)"
    )
    assert build_plan(hard, E).label == "Hard · incremental(0.2→0.8) per cycle · cycles(4 × 1→4 subset epochs)"
    fixed = SelectionConfig(
        strategy="random", interval={"kind": "cycles", "cycles": 4, "start": 1}, ratio={"kind": "fixed", "start": 0.5}
    )
    assert build_plan(fixed, E).label == "Random · fixed(0.5) · cycles(4 × 1 subset epoch)"
    progress = SelectionConfig(**{**HARD, "interval": {"kind": "incremental", "start": 1, "end": 4}})
    assert build_plan(progress, 1000).label == "Hard · incremental(0.2→0.8) · incremental(1→4)"
    assert soft.interval_schedule.describe() == "cycles(4 × 1→4 subset epochs, re-drawn)"  # the MLflow tag


def test_the_yaml_syntax():
    cfg = load_experiment(
        REPO / "experiments" / "digits_vit.yaml",
        ["train.epochs=21", "selection.interval={kind: cycles, cycles: 4, start: 1, end: 4}"],
    )
    assert (
        build_plan(cfg.selection, 21).label
        == "Soft · incremental(0.2→0.8) per cycle · cycles(4 × 1→4 subset epochs, re-drawn)"
    )
    assert build_plan(cfg.selection, 21).mean_ratio() * 21 == pytest.approx(17.0)


# --- the Selector follows the plan ---------------------------------------------------------------
def new_selector(cfg: SelectionConfig, seed: int) -> Selector:
    return Selector(range(N), selection=cfg, epochs=E, seed=seed)


def drive(selector: Selector, epochs: range) -> dict:
    """The engine's loop on one rank: scoring passes and training on its own shard."""
    out = {"subsets": [], "scored_at": [], "tables": []}
    rank, world = selector.rank, selector.world_size
    for epoch in epochs:

        def score_fn(indices, epoch=epoch):
            out["scored_at"].append(epoch)
            losses = losses_at(epoch) + 0.5  # a scoring pass sees other losses than training
            for idx in shard_indices(indices, rank, world, shuffle=False).split(8):
                yield idx, losses[idx]

        out["subsets"].append(selector.begin_epoch(epoch, score_fn).clone())
        losses = losses_at(epoch)
        for idx in torch.tensor(list(selector.sampler), dtype=torch.long).split(5):  # this rank's shard
            selector.update(losses[idx])
        selector.end_epoch()
        out["tables"].append(selector.scores.clone())
    out["history"] = [(r.epoch, r.ratio, r.selected) for r in selector.history]
    return out


@pytest.mark.parametrize("name", ["soft", "hard"])
def test_the_selector_selects_trains_and_scores_as_planned(name):
    cfg = SelectionConfig(**(SOFT if name == "soft" else HARD))
    run = drive(new_selector(cfg, seed=2), range(E))
    picks = dict(build_plan(cfg, E).ratios())
    # scoring passes exactly before the planned picks: none in warm-up or a cycle's full epochs
    assert run["scored_at"] == list(picks)
    for epoch, subset in enumerate(run["subsets"]):
        if epoch in SUBSET_EPOCHS:
            assert subset.numel() == budget(N, SUBSET_EPOCHS[epoch]), epoch
        else:
            assert torch.equal(subset, torch.arange(N)), epoch
    # a kept pick is the same subset; a re-drawn one (Soft) a fresh draw
    kept = [
        run["subsets"][e - 1].tolist() == run["subsets"][e].tolist() for e in SUBSET_EPOCHS if e not in CYCLE_STARTS
    ]
    assert all(kept) if name == "hard" else not any(kept)
    # the history: every pick at its planned ratio, and each return to all data (ratio 1)
    returns = [(e, 1.0, N) for e in (2, 8, 14, 20)]
    want = sorted([(e, r, budget(N, r)) for e, r in picks.items()] + returns)
    assert run["history"] == [(e, pytest.approx(r), k) for e, r, k in want]
    assert sum(s.numel() for s in run["subsets"]) == sum(build_plan(cfg, E).subset_sizes(N))


def test_a_resumed_selector_follows_the_same_cycles(tmp_path):
    cfg = SelectionConfig(**SOFT)
    straight = drive(new_selector(cfg, seed=7), range(E))
    first = new_selector(cfg, seed=7)
    head = drive(first, range(12))  # stops inside cycle 3's subset epochs
    torch.save(first.state_dict(), tmp_path / "selector.pt")
    resumed = new_selector(cfg, seed=99)
    resumed.load_state_dict(torch.load(tmp_path / "selector.pt"))
    tail = drive(resumed, range(12, E))
    for a, b in zip(head["subsets"] + tail["subsets"], straight["subsets"]):
        assert torch.equal(a, b)


# --- the Selector in a plain PyTorch loop --------------------------------------------------------
class TableModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.epoch = 0

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        return losses_at(self.epoch)[items] * self.scale


def loss_fn(model: TableModel, batch) -> torch.Tensor:
    return model(batch[0])


def run_selector(cfg: SelectionConfig, epochs: int = E) -> tuple[list, list, attent.Selector]:
    model = TableModel()
    selector = attent.Selector(
        TensorDataset(torch.arange(N)), selection=cfg, epochs=epochs, seed=3, model=model, loss_fn=loss_fn
    )
    loader = selector.loader(batch_size=16)
    sizes, scored = [], []
    for epoch in range(epochs):
        model.epoch = epoch
        sizes.append(selector.begin_epoch(epoch).numel())
        for batch in loader:
            selector.update(loss_fn(model, batch)).mean().backward()
        selector.end_epoch()
        scored.append(selector.metrics()["samples_scored"])
    return sizes, scored, selector


def test_the_selector_follows_the_plan_and_sizes_its_steps():
    cfg = SelectionConfig(**SOFT)
    sizes, scored, selector = run_selector(cfg)
    assert sizes == build_plan(cfg, E).subset_sizes(N)
    assert [e for e, s in enumerate(sizes) if s == N] == [0, 2, 3, 4, 5, 8, 9, 10, 14, 15, 20]
    assert [e for e, s in enumerate(scored) if s] == list(SUBSET_EPOCHS)  # a pass per pick, all samples
    assert set(scored) == {0, N}
    assert selector.samples_backpropagated == sum(sizes)
    assert selector.planned_steps(16) == sum(math.ceil(s / 16) for s in sizes)


# --- the engine's recipe and the three integrations ----------------------------------------------
@pytest.mark.timeout(120)
def test_the_engine_and_the_integrations_follow_the_cycles_plan(monkeypatch, tmp_path):
    """The engine's recipe, the Selector, AtteNTTrainer (whose LR schedule is sized by the
    planned steps) and the Lightning callback, as tests/integrations/test_integration_agreement.py runs them (digits
    ViT, learning rate 0): over 6 epochs, the warm-up, a cycle of 2 epochs (1 subset epoch at 0.2)
    and one of 3 (2 re-drawn subset epochs at 0.8); the same subsets, scores and samples."""
    agreement = pytest.importorskip("tests.helpers.agreement")  # needs lightning and transformers
    monkeypatch.setitem(
        agreement.CONFIGS,
        "cycles",
        {
            **SOFT,
            "ratio": {"kind": "incremental", "start": 0.2, "end": 0.8},
            "interval": {"kind": "cycles", "cycles": 2, "start": 1, "end": 2},
        },
    )
    n, epochs = agreement.N, agreement.EPOCHS
    selection = agreement.experiment("cycles").selection
    assert [(p.epoch, round(p.ratio, 6), p.selects) for p in build_plan(selection, epochs)] == [
        (0, 1.0, False),
        (1, 0.2, True),
        (2, 1.0, False),
        (3, 0.8, True),
        (4, 0.8, True),
        (5, 1.0, False),
    ]
    runs = agreement.run_all("cycles", tmp_path)
    engine = runs["engine"]
    # picks at 1, 3, 4; back to all data at 2 and 5
    assert [(e, len(s)) for (e, _), s in zip(engine["reselections"], engine["subsets"])] == [
        (1, budget(n, 0.2)),
        (2, n),
        (3, budget(n, 0.8)),
        (4, budget(n, 0.8)),
        (5, n),
    ]
    assert engine["backpropagated"] == sum(build_plan(selection, epochs).subset_sizes(n))
    for framework in agreement.FRAMEWORKS:
        run = runs[framework]
        assert run["unchanged"], framework
        assert run["checksums"] == engine["checksums"], framework
        assert run["reselections"] == engine["reselections"], framework
        for a, b in zip(run["subsets"], engine["subsets"], strict=True):
            assert torch.equal(a, b), framework
        assert run["backpropagated"] == engine["backpropagated"], framework
        assert torch.equal(run["table"].nan_to_num(-1.0), engine["table"].nan_to_num(-1.0)), framework


# --- two ranks ------------------------------------------------------------------------------------
def _worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        runs = {
            name: drive(new_selector(SelectionConfig(**cfg), seed=5), range(E))  # rank and world: the group's
            for name, cfg in (("soft", SOFT), ("hard", HARD))
        }
        torch.save(runs, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_ranks_agree_on_the_cycles_subsets(tmp_path):
    mp.start_processes(
        _worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True, start_method=start_method()
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for name, cfg in (("soft", SOFT), ("hard", HARD)):
        single = drive(new_selector(SelectionConfig(**cfg), seed=5), range(E))
        a, b = ranks[0][name], ranks[1][name]
        assert a["scored_at"] == b["scored_at"] == single["scored_at"]  # each rank scored its shard only
        for x, y, z in zip(a["subsets"], b["subsets"], single["subsets"]):
            assert torch.equal(x, y) and torch.equal(x, z)
        for x, y, z in zip(a["tables"], b["tables"], single["tables"]):
            assert torch.equal(x, y) and torch.equal(x, z)
        assert a["history"] == b["history"] == single["history"]
        assert len({tuple(s.tolist()) for s in a["subsets"]}) > 2  # not vacuous
