"""The one check every integration makes of a user's train loader (attent.integrations.loaders):
it draws from the selection's sampler, found through a DataLoader's sampler or batch sampler and
the shards a framework wraps them in, and never through a copy or a sampler wrapping it."""

from __future__ import annotations

import copy
from types import SimpleNamespace

from attent.integrations.loaders import draws_from
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

DATA = range(12)


def test_a_loader_draws_from_its_sampler_or_its_batch_samplers():
    sampler = SequentialSampler(DATA)
    assert draws_from(DataLoader(DATA, sampler=sampler, batch_size=4), sampler)
    assert draws_from(DataLoader(DATA, batch_sampler=BatchSampler(sampler, 4, drop_last=False)), sampler)


def test_a_wrapped_loader_draws_from_it_down_to_the_depth_looked_at():
    """As accelerate's DataLoaderShard: its batch sampler (a shard) holds the loader's batch sampler."""
    sampler = SequentialSampler(DATA)
    shard = SimpleNamespace(batch_sampler=BatchSampler(sampler, 4, drop_last=False))
    wrapped = SimpleNamespace(batch_sampler=shard, sampler=None)
    assert draws_from(wrapped, sampler)
    assert not draws_from(wrapped, sampler, depth=2)  # the sampler is three attributes down


def test_a_copy_or_a_sampler_wrapping_it_is_refused():
    sampler = SequentialSampler(DATA)
    assert not draws_from(DataLoader(DATA, sampler=copy.copy(sampler)), sampler)
    assert not draws_from(DataLoader(DATA, shuffle=True), sampler)
    wrapper = DistributedSampler(sampler, num_replicas=2, rank=0)  # as Lightning's: the sampler is its dataset
    assert not draws_from(DataLoader(DATA, sampler=wrapper), sampler)
