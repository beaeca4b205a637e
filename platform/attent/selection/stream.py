"""AtteNT where no scoring pass over the training set fits: selection from a stream (an iterable
with no length, or a corpus too large to score between re-selections).

From each pool of ceil(B / r) samples drawn in the stream's order the current model scores every
sample (one forward without gradients, in eval mode) and the learner trains on B of them by Hard,
Soft or Random, r following the run's ratio schedule by training progress (batches trained / the
run's batches). Every pool is a re-selection, so the interval schedule has nothing to keep; the
warm-up share of the run (``warmup_epochs`` of ``epochs``) and the ``anneal`` share train on pools
of B, unscored. A pool of P samples costs P scoring forwards: 1 / r per trained sample.

``pool_size`` and ``pick`` decide; ``StreamSelector`` holds the position in the stream and the
generator, and under torch.distributed keeps ranks in step (each rank draws its own shard's pools,
of the same size, and the run stops on every rank when one rank's shard cannot fill a pool). Its
``pools()`` draws the pools, unscored, and ``choose(pool)`` scores the next one and picks from it:
iterating it does both, a loop that reads ahead (Lightning's, ``integrations.lightning_stream``)
draws a pool early and chooses from it at the step that trains it.

    pools = attent.StreamSelector(stream, selection=SelectionConfig(preset="llm"), batch_size=B,
                                  batches=max_steps, model=model, loss_fn=per_sample_loss, collate_fn=collate)
    for batch in pools:                       # B samples picked from each pool
        loss = per_sample_loss(model, batch).mean(); loss.backward(); pools.record_loss(loss)
        if pools.step_finite(): optimizer.step()   # selection.nonfinite: a NaN raises, or skips the step
        optimizer.zero_grad()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, islice
from typing import Any

import torch
from torch.utils.data import default_collate

from . import observations as obs
from .config import SelectionConfig, check_streamable
from .distributed import all_agree
from .methods import stream_seed
from .plan import pool_ratio
from .scoring_pass import PerSampleLoss, without_autograd
from .strategies import select, soft_logits

STREAM_STATE_FORMAT = 2  # 2: the passes ended (``passed``)


def pool_size(selection: SelectionConfig, batch_size: int, progress: float, epochs: float = 1.0) -> int:
    """The samples drawn for one training batch of ``batch_size`` at training ``progress``.

    Args:
        selection: the run's settings (its ratio schedule, warm-up and anneal shares).
        batch_size: B, the samples trained on.
        progress: batches trained / the run's batches, in [0, 1].
        epochs: the run's length in epochs, which ``warmup_epochs`` is a share of.

    Returns:
        B in the warm-up and anneal shares and under method full, else ceil(B / r(progress)).

    >>> pool_size(SelectionConfig(preset="llm"), 16, 0.5, epochs=3)
    23
    >>> pool_size(SelectionConfig(preset="llm"), 16, 0.2, epochs=3)  # the first of 3 epochs: warm-up
    16
    """
    return math.ceil(batch_size / pool_ratio(selection, progress, epochs))


def stream_pools(selection: SelectionConfig, batch_size: int, samples: int, epochs: int) -> list[list[int]]:
    """The pools of a run of ``epochs`` passes over a stream of ``samples`` items (a rank's shard):
    each pass's pool sizes, the pool at ``progress`` = items drawn / the run's items sized by
    ``pool_size``; a pass ends where its next pool would not fit (those items are not drawn).

    Args:
        selection: the run's settings.
        batch_size: B, the samples of each training batch.
        samples: the items of one pass.
        epochs: the passes.

    Returns:
        Per pass, the sizes of its pools in order: each pool trains one batch of B.

    >>> [len(p) for p in stream_pools(SelectionConfig(method="full"), 10, 95, epochs=2)]
    [9, 9]
    """
    run = samples * epochs
    passes = []
    for epoch in range(epochs):
        sizes, drawn = [], 0
        while True:
            size = pool_size(selection, batch_size, (epoch * samples + drawn) / run, epochs)
            if drawn + size > samples:
                break
            sizes.append(size)
            drawn += size
        passes.append(sizes)
    return passes


def pick(scores: torch.Tensor, batch_size: int, selection: SelectionConfig, generator: torch.Generator) -> torch.Tensor:
    """The B samples of a pool the learner trains on, by the selection's strategy.

    Args:
        scores: the pool's per-sample losses [P] (a NaN or inf one ranked below every other).
        batch_size: B <= P.
        selection: the run's settings (strategy, temperature, soft logits).
        generator: Soft's and Random's random stream.

    Returns:
        Indices into the pool, ascending (the stream's order kept).
    """
    if scores.numel() == batch_size:
        return torch.arange(batch_size)
    keys = scores.detach().float().cpu()
    finite = torch.isfinite(keys)
    if not finite.all():  # a NaN or inf score (nonfinite: skip) is drawn last: below every finite one
        keys = torch.where(finite, keys, keys[finite].min() - 1 if finite.any() else 0.0)
    keys = soft_logits(keys, selection.soft_logits) if selection.strategy == "soft" else keys
    return select(keys, batch_size, selection.strategy, temperature=selection.temperature, generator=generator)


class StreamSelector:
    """Training batches picked from pools of a stream (module docstring).

    Args:
        stream: this rank's items (its shard under torch.distributed), each a dataset item.
        selection: the settings (method attent or full).
        batch_size: B, the samples of each training batch.
        batches: the run's training batches (the progress clock: batches trained / ``batches``),
            one pass over the stream at most; or None with ``samples``.
        samples: the items of one pass over the stream, a stream of known length read ``epochs``
            times (the progress clock: items drawn / the run's, pools by ``stream_pools``); each
            ``iter()`` is one pass.
        epochs: the run's length in epochs, which ``warmup_epochs`` is a share of (with
            ``samples``: the passes).
        seed: of Soft's and Random's draws.
        model: scores each pool (needed where the run selects).
        loss_fn: ``loss_fn(model, batch)`` -> per-sample losses [P], the training loop's own.
        collate_fn: batches items (a pool's and a training batch's); default torch's.
        rank: this process's rank, for its own random stream (default: the process group's).

    Raises:
        ValueError: settings a stream cannot follow (``check_streamable``), a selecting run
            without a model and a loss function, or not one of ``batches`` and ``samples``.
    """

    def __init__(
        self,
        stream: Iterable,
        *,
        selection: SelectionConfig,
        batch_size: int,
        batches: int | None = None,
        samples: int | None = None,
        epochs: float = 1.0,
        seed: int = 0,
        model: torch.nn.Module | None = None,
        loss_fn: PerSampleLoss | None = None,
        collate_fn: Callable[[list], Any] | None = None,
        rank: int | None = None,
    ):
        check_streamable(selection)
        if selection.selects and (model is None or loss_fn is None):
            raise ValueError("a stream's pools are scored by the model: pass model= and loss_fn= to StreamSelector")
        if (batches is None) == (samples is None):
            raise ValueError("give a stream's run length as batches= (batches to train) or samples= (items a pass)")
        if rank is None:
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.stream, self.selection, self.batch_size = stream, selection, batch_size
        # a stream of known length: every pass's pools planned; else one pass, sized by batches trained
        self.passes = None if samples is None else stream_pools(selection, batch_size, samples, int(epochs))
        self._sizes = None if samples is None else [size for sizes in self.passes for size in sizes]
        # the run's pools up to each pass's end (with samples=; else the one pass's: batches)
        self._pass_ends = [batches] if samples is None else list(accumulate(map(len, self.passes)))
        self.batches = self._pass_ends[-1]
        self.epochs, self.model, self.loss_fn = epochs, model, loss_fn
        self.collate_fn = collate_fn or default_collate
        self._seed_key = (seed, selection.method, f"{selection.strategy}/{rank}")
        self._generator = torch.Generator().manual_seed(stream_seed(*self._seed_key))
        self.step = 0  # training batches yielded
        self.drawn = 0  # items taken from the stream in this pass
        self.passed = 0  # passes over the stream ended (with samples=)
        self.samples_scored = 0  # scoring forwards
        self.last_ratio = 1.0  # B / the last pool's size
        self.exhausted = False  # a rank's shard could not fill a pool
        self._finite: torch.Tensor | None = None  # the training losses recorded since the last step_finite

    def pass_pools(self) -> list[int]:
        """The pool sizes of the current pass (with ``samples=``; else []), those drawn included."""
        return self.passes[self.passed] if self.passes is not None and self.passed < len(self.passes) else []

    @property
    def pass_step(self) -> int:
        """The pools of the current pass drawn so far (with ``samples=``; else the run's)."""
        return self.step - (self._pass_ends[self.passed - 1] if self.passed else 0)

    def __iter__(self) -> Iterator[Any]:
        """The training batches of one pass, until the run's ``batches`` (with ``samples=``, the
        pass's planned pools) or the stream's end on any rank: ``collate_fn`` of the B items
        ``choose`` picks from each of ``pools()``."""
        for pool in self.pools():
            batch = self.collate_fn(pool)
            picked = self.choose(batch)  # a state saved after it goes on at the next pool
            yield batch if len(picked) == len(pool) else self.collate_fn([pool[i] for i in picked.tolist()])

    def pools(self) -> Iterator[list]:
        """The stream's pools, unscored, from the position of the batches picked so far.

        Pool k holds the next ``pool_size`` items at progress k / ``batches`` (with ``samples=``,
        the pass's planned sizes; a new pass draws its own Soft and Random draws): drawing pools ahead
        of ``choose`` (a loader that reads a batch ahead) neither scores nor moves the state, and
        a fresh call reads the stream again from the state's position.

        Returns:
            An iterator of lists of items; it ends after the run's ``batches`` pools (the pass's),
            or, on every rank, where one rank's shard cannot fill a pool (``exhausted`` then set;
            with ``samples=`` the pass ends there and the next ``pools()`` reads the next pass).

        Raises:
            ValueError: a resumed stream that holds fewer items than the state was taken after.
        """
        if self.passes is not None and hasattr(self.stream, "set_epoch"):  # one that reshuffles by pass
            self.stream.set_epoch(self.passed)
        items = iter(self.stream)
        skipped = sum(1 for _ in islice(items, self.drawn))  # resumed: the items drawn before
        if skipped < self.drawn:
            raise ValueError(f"the stream holds {skipped} items, the state was taken after {self.drawn}")
        if self.passes is not None and self.drawn == 0:  # each pass its own draws: a pass's start holds no state
            seed, method, strategy = self._seed_key
            self._generator.manual_seed(stream_seed(seed, method, f"{strategy}/pass{self.passed}"))
        end = self._pass_end()
        for index in range(self.step, end):
            size = self._size(index)
            pool = list(islice(items, size))
            if not all_agree(len(pool) == size):  # one rank's shard cannot fill a pool: all stop
                if self.passes is None:
                    self.exhausted = True
                else:  # a short pass: its pools left out, the next pass read afresh
                    self.step, self.passed, self.drawn = end, self.passed + 1, 0
                return
            yield pool

    def choose(self, pool: Any) -> torch.Tensor:
        """The B items of the next pool that the learner trains on, scored by the current model.

        The next pool is the one after the pools chosen from so far (the state's position): the
        pools must come in ``pools()``'s order, each once. Advances the state past it.

        Args:
            pool: the pool's items as ``collate_fn`` batched them (or that batch moved to the
                model's device); not read in the warm-up and anneal shares (pools of B).

        Returns:
            Indices into the pool, ascending (the stream's order kept): all of it in the warm-up
            and anneal shares and under method full, else the strategy's B (Random's unscored).

        Raises:
            ValueError: ``loss_fn`` gave not one loss per item, or a non-finite one under
                ``selection.nonfinite: raise``.
        """
        size = self.next_pool_size
        picked = torch.arange(size) if size == self.batch_size else self._pick(pool, size)
        self.last_ratio = self.batch_size / size
        self.drawn, self.step = self.drawn + size, self.step + 1
        if self.passes is not None and self.step == self._pass_end():  # the pass is over: the next reads again
            self.passed, self.drawn = self.passed + 1, 0
        return picked

    @property
    def next_pool_size(self) -> int:
        """The items of the pool ``choose`` expects next."""
        return self._size(self.step)

    def _size(self, index: int) -> int:
        if self._sizes is not None:
            return self._sizes[index]
        return pool_size(self.selection, self.batch_size, index / self.batches, self.epochs)

    def _pass_end(self) -> int:
        """The run's pools up to the current pass's end (with ``samples=``; else ``batches``)."""
        return self._pass_ends[min(self.passed, len(self._pass_ends) - 1)]

    def _pick(self, pool: Any, size: int) -> torch.Tensor:
        if self.selection.strategy == "random":  # uniform: no score read, none made
            return pick(torch.zeros(size), self.batch_size, self.selection, self._generator)
        was_training = self.model.training
        self.model.eval()
        try:
            with without_autograd(self.model):
                scores = self.loss_fn(self.model, pool)
        finally:
            self.model.train(was_training)
        if scores.shape[:1] != (size,):
            raise ValueError(
                f"loss_fn gave losses of shape {tuple(scores.shape)} for a pool of {size} items: it must give "
                "one loss per item (a collate_fn that packs items loses which item each loss is)"
            )
        self.samples_scored += size
        bad = (~torch.isfinite(scores.detach().float().reshape(size, -1).sum(1))).nonzero().flatten()
        if len(bad) and self.selection.nonfinite == "raise":
            raise ValueError(
                f"non-finite loss in the pool of batch {self.step + 1} for its items {bad[:8].tolist()} (positions "
                "in the pool): the model diverged or the data holds invalid values (selection.nonfinite: skip "
                "ranks such items last)"
            )
        return pick(scores, self.batch_size, self.selection, self._generator)

    def record_loss(self, loss: torch.Tensor) -> None:
        """Notes a training batch's loss for ``step_finite`` (on the device: nothing waits).

        Args:
            loss: the loss back-propagated for a batch this selector yielded (a micro-batch's,
                under gradient accumulation), of any shape.
        """
        finite = torch.isfinite(loss.detach()).all()
        self._finite = finite if self._finite is None else self._finite & finite

    def step_finite(self) -> bool:
        """Whether the losses recorded since the last call (``record_loss``: an optimiser step's)
        are finite on every rank, as ``Selector.step_finite`` rules: call it after the backward
        and before ``optimizer.step()`` (a collective under torch.distributed).

        Returns:
            True where the step may go on; False where ``selection.nonfinite`` is "skip" and a loss
            was NaN or inf: skip ``optimizer.step()``.

        Raises:
            ValueError: a NaN or inf loss under ``nonfinite: raise``, naming the step by its last
                training batch.
        """
        finite, self._finite = self._finite, None
        return obs.step_may_go_on(finite, self.selection.nonfinite, obs.stream_nonfinite_message, self.step)

    def state_dict(self) -> dict[str, Any]:
        """Where the run stands: a StreamSelector loaded from it, on the same stream, draws the
        same pools and picks as the uninterrupted run."""
        return {
            "format": STREAM_STATE_FORMAT,
            "step": self.step,
            "drawn": self.drawn,
            "passed": self.passed,
            "samples_scored": self.samples_scored,
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict``: iteration goes on after the items drawn before it.

        Raises:
            ValueError: a state of another format.
        """
        if not isinstance(state, dict) or state.get("format") != STREAM_STATE_FORMAT:
            raise ValueError(f"not a stream selection state of format {STREAM_STATE_FORMAT}: start the run afresh")
        self.step, self.drawn, self.samples_scored = state["step"], state["drawn"], state["samples_scored"]
        self.passed = state["passed"]
        self._generator.set_state(state["generator"])
