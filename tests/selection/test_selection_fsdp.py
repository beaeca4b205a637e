"""Selection under a sharded model (torch's FSDP2, ``fully_shard``, on two gloo ranks on the CPU):
every forward all-gathers the parameters, so a scoring pass whose ranks made different numbers of
forwards would hang. The Selector's passes and epochs give every rank the same number of forwards
(its shards padded to one length, 37 samples over 2 ranks), and the run picks what the same run
under DDP picks, epoch by epoch, the model's weights equal at the end."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attent.selection.config import SelectionConfig
from attent.selection.selector import Selector
from torch.nn.parallel import DistributedDataParallel

from tests.helpers.ranks import start_method

N, EPOCHS, BATCH = 37, 6, 4
DATA = torch.utils.data.TensorDataset(torch.arange(N), torch.randn(N, 3, generator=torch.Generator().manual_seed(5)))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


class Counted:
    """The per-sample loss, counting this rank's forwards (scoring and training)."""

    def __init__(self):
        self.scoring = self.training = 0

    def __call__(self, net: torch.nn.Module, batch) -> torch.Tensor:
        index, x = batch
        if not torch.is_grad_enabled():
            self.scoring += 1
        else:
            self.training += 1
        return (net(x).squeeze(1) - torch.sin(index.float())) ** 2


def _rank(rank: int, world: int, store_path: str, out_dir: str, sharding: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        net = model()
        if sharding == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for layer in net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer)
            wrapped = fully_shard(net)
        else:
            wrapped = DistributedDataParallel(net)
        loss_fn = Counted()
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.05)
        selector = Selector(DATA, selection=SelectionConfig(preset="vit"), epochs=EPOCHS, seed=1,
                            model=wrapped, loss_fn=loss_fn, score_batch_size=5)  # fmt: skip
        loader = selector.loader(batch_size=BATCH)
        subsets, passes = [], []
        for epoch in range(EPOCHS):
            before = loss_fn.scoring
            subsets.append(selector.begin_epoch(epoch).tolist())
            passes.append(loss_fn.scoring - before)
            for batch in loader:
                selector.update(loss_fn(wrapped, batch)).mean().backward()
                if selector.step_finite():
                    optimizer.step()
                optimizer.zero_grad()
            selector.end_epoch()
        with torch.no_grad():
            final = wrapped(DATA.tensors[1]).squeeze(1)
        out = {"subsets": subsets, "passes": passes, "training": loss_fn.training, "final": final}
        torch.save(out, os.path.join(out_dir, f"{sharding}{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run(tmp_path, sharding: str) -> list[dict]:
    folder = tmp_path / sharding
    folder.mkdir()
    mp.start_processes(_rank, args=(2, str(folder / "store"), str(folder), sharding), nprocs=2, join=True,
                       start_method=start_method())  # fmt: skip
    return [torch.load(folder / f"{sharding}{rank}.pt") for rank in range(2)]


@pytest.mark.timeout(180)
def test_fsdp_ranks_make_equal_forwards_and_pick_what_ddp_picks(tmp_path):
    fsdp, ddp = run(tmp_path, "fsdp"), run(tmp_path, "ddp")
    assert fsdp[0]["passes"] == fsdp[1]["passes"] and sum(fsdp[0]["passes"]) > 0  # equal scoring forwards
    assert fsdp[0]["training"] == fsdp[1]["training"]  # and training forwards
    assert fsdp[0]["subsets"] == fsdp[1]["subsets"] == ddp[0]["subsets"]  # the same picks as under DDP
    assert len({tuple(s) for s in ddp[0]["subsets"]}) > 2  # picks that changed over the run
    torch.testing.assert_close(fsdp[0]["final"], ddp[0]["final"])  # and the same training
