"""The same subsets everywhere (issue 28's proof): with the same seed, data and selection config,
the plain-PyTorch wrapper (``attent.Selector``), ``AtteNTTrainer``, the Lightning callback and
the engine's own training recipe choose identical subsets at every re-selection (checksums), in
one process and on two gloo ranks.

How the four see the same per-sample losses without four identical training loops: learning rate
0, so the model never changes and every per-sample loss (scoring pass and training forward) is the
same function of the sample in all four. The workload is the engine's digits ViT task (no
augmentation, no dropout or drop-path); the integrations train the same weights (built once, the
state dict copied into each) with the task's own per-sample loss as the user's loss function, on
the task's training set, collate and batch sizes. Each integration then differs from the engine
only in what it is meant to: its loop, its sampler wiring, its scoring pass.

What is compared, per selection config: the checksum of each epoch's subset as each integration
reports it (the engine's ``subset_checksum`` metric, the Selector's and the callback's metrics,
AtteNTTrainer's logged row), the epoch and checksum of every re-selection (the Selector's
history), the distinct samples back-propagated, and the score table at the end (bit for bit: the
losses each Selector saw, on the right samples). On two ranks, each framework's ranks also make as
many forwards as each other, scoring and training: under a sharded model (FSDP) every forward is a
collective, and Ray Train's and accelerate's FSDP run on GPUs only, so this is where the invariant
is checked on the CPU (torch's own FSDP2 on gloo: tests/selection/test_selection_fsdp.py).

The engine's config refuses ``train.lr: 0`` (it must be > 0), so the test sets the recipe's
resolved optimiser spec to lr 0 after ``setup``: the recipe sets every step's learning rate from
it. Every run checks that its weights came out unchanged.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers.processes import free_port
from tests.helpers.ranks import start_method

L = pytest.importorskip("lightning")
transformers = pytest.importorskip("transformers")

from attent.selection.plan import build_plan  # noqa: E402

from tests.helpers.agreement import CONFIGS, EPOCHS, FRAMEWORKS, N, assert_all_agree, experiment, run_all  # noqa: E402


# --- in one process ----------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CONFIGS)
def test_the_four_choose_the_same_subsets_in_one_process(name, tmp_path):
    runs = run_all(name, tmp_path)
    assert_all_agree(runs, name)
    sizes = [len(s) for s in runs["engine"]["subsets"]]
    assert sizes == [round(ratio * N) for _, ratio in build_plan(experiment(name).selection, EPOCHS).ratios()]


# --- on two ranks ------------------------------------------------------------------------------------------
def _rank(rank: int, world: int, port: int, out_dir: str) -> None:
    from accelerate.state import AcceleratorState

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        NODE_RANK="0",
    )
    AcceleratorState._reset_state(reset_partial_state=True)  # a forked child: the parent's one-process state
    dist.init_process_group("gloo", rank=rank, world_size=world)  # the engine, Trainer and Lightning all join it
    try:
        results = {name: run_all(name, os.path.join(out_dir, f"hf-{name}-{rank}"), rank, world) for name in CONFIGS}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_the_four_choose_the_same_subsets_on_two_ranks(tmp_path):
    mp.start_processes(_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True, start_method=start_method())
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    for name in CONFIGS:
        assert_all_agree(r0[name], name, rank=0, world=2)
        assert_all_agree(r1[name], name, rank=1, world=2)
        for framework in FRAMEWORKS:  # the ranks agree (each framework checks it too, by collectives)
            assert r0[name][framework]["checksums"] == r1[name][framework]["checksums"]
            assert torch.equal(
                r0[name][framework]["table"].nan_to_num(-1.0), r1[name][framework]["table"].nan_to_num(-1.0)
            )
            # as many forwards on each rank, scoring and training (a sharded model's would hang otherwise)
            assert r0[name][framework]["forwards"] == r1[name][framework]["forwards"], (name, framework)
            assert r0[name][framework]["forwards"]["scoring"] > 0 or name == "llm", (name, framework)
    # some subset was odd-sized: the ranks' shards were padded, and still agreed
    assert any(len(s) % 2 for name in CONFIGS for s in r0[name]["engine"]["subsets"])
