"""The task interface: everything the engine needs to know about one workload.

A task is built inside each Ray Train worker from its pydantic config section. The engine owns
the loop (sampling, optimisation, timing, checkpoints, MLflow); a task owns data, model,
per-sample loss and evaluation. Batches are dicts of tensors that always carry ``"index"``: the
position of each sample in ``train_dataset`` (the Selector keys its score table on it).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.data import Dataset

from attent.contract import DATASET_TRAIN, DatasetDescription

Batch = dict[str, Any]
ParamGroup = dict[str, Any]  # a torch.optim parameter group: {"params": [...], "weight_decay": ...}


@dataclass(frozen=True)
class OptimizerSpec:
    """A task's AdamW and learning-rate defaults; ``train:`` fields override any of them."""

    lr: float = 1e-3
    weight_decay: float = 0.0  # applied to the decayed group only
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    schedule: Literal["cosine", "linear", "constant"] = "cosine"  # over training progress
    warmup_ratio: float = 0.0  # share of training progress
    min_lr: float = 0.0  # the floor the schedule decays to
    global_batch_size: int | None = None  # reached by gradient accumulation; None: none


@dataclass(frozen=True)
class TorchModel:
    """A run's trained model as MLflow's PyTorch flavour logs it (``Task.model_to_log``): a module
    called as ``module(*inputs.values())``, and a few real inputs by name, from which the engine
    makes its input example and signature."""

    module: nn.Module
    inputs: dict[str, torch.Tensor]
    metadata: dict[str, Any] = field(default_factory=dict)  # kept in the model's MLmodel file


@dataclass(frozen=True)
class AdapterModel:
    """A LoRA adapter as MLflow's transformers flavour logs it (through peft): the adapter and the
    tokenizer are stored, the frozen base model is only referenced."""

    model: nn.Module  # the peft model
    tokenizer: Any
    base_model_path: str | None  # the base checkpoint's local folder; None: its hub name is recorded


@dataclass(frozen=True)
class Probe:
    """A task's model and batches of its configured shapes, without its data or weights: what
    ``attent plan`` counts on the meta device and times with ``--measure``. The losses are the
    task's own where the meta device can run them."""

    build_model: Callable[[], nn.Module]  # built under the caller's device (meta: no memory, no weights)
    batch: Callable[[int, torch.device], Batch]  # random model inputs of the configured shapes
    train_loss: Callable[[nn.Module, Batch], torch.Tensor]  # as ``per_sample_loss``
    score_loss: Callable[[nn.Module, Batch], torch.Tensor]  # as ``score`` (eval mode, no gradients)
    sample: str  # what one sample is, in words ("224 px, 3 modalities", "1,024 tokens")
    train_samples: int | None = None  # the training set's size where known without its data
    eval_samples: int = 0  # samples one evaluation reads
    eval_forwards: float = 1.0  # an evaluation sample's work in scoring forwards (generation: more)
    assumptions: tuple[str, ...] = ()  # shapes taken where neither the config nor the data says
    # what the FLOPs depend on, where less than the whole config: runs that share it count once
    key: str | None = None
    # a model of identical blocks: the model with n of its ``depth`` blocks, so that a count of
    # one and of two blocks gives the whole (its FLOPs and parameters are linear in n)
    build_with_blocks: Callable[[int], nn.Module] | None = None
    depth: int = 0
    workload: str = "other"  # its row of the utilisation table (attent.cost.rates.MFU): llm, mae, vit
    # a language model's: its training examples' tokenized lengths and where they come from (read
    # when asked; None where the data or its tokenizer is not here), and the probe at another
    # sequence length, so that FLOPs are counted at the width batches are padded to
    lengths: Callable[[], tuple[tuple[int, ...], str] | None] | None = None
    resized: Callable[[int], Probe] | None = None
    decoding: Decoding | None = None  # an evaluation's greedy generation


@dataclass(frozen=True)
class Decoding:
    """What one evaluation greedily decodes, and what each decoding step reads from memory
    (priced by ``attent.cost.decoding``)."""

    answers: int  # sequences decoded, over all ranks
    new_tokens: int  # steps a batch decodes at most (``max_new_tokens``: a batch stops at its longest answer)
    batch: int  # sequences decoded together on a rank
    bytes_per_parameter: int  # of the weights, read once a step (the model's dtype)
    kv_bytes_per_token: int  # K and V of one token in every layer, read once a step for each sequence


def decay_groups(
    model: nn.Module, weight_decay: float, parameters: list[tuple[str, nn.Parameter]] | None = None
) -> list[ParamGroup]:
    """Trainable parameters split into a decayed group and one without weight decay: biases,
    norm scales (every tensor of < 2 dims), embeddings, and the names the model's
    ``no_weight_decay()`` lists (timm: position embedding, class token)."""
    named = parameters if parameters is not None else [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    listed = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    embeddings = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    decay, no_decay = [], []
    for name, param in named:
        exempt = param.ndim < 2 or id(param) in embeddings or name in listed or name.split(".")[-1] in listed
        (no_decay if exempt else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


class Task(abc.ABC):
    """One workload (ViT classification, LLM LoRA fine-tuning, ...), built in each worker as
    ``TaskClass(config, seed=seed)`` from its validated config section."""

    name: str = "task"
    # Names of the per-sample loss components (e.g. modalities). Empty: ``per_sample_loss`` returns
    # [B]; else [B, C], summed into the score, weighted by the group baselines, logged apart.
    loss_components: tuple[str, ...] = ()

    # --- data -------------------------------------------------------------------------------
    @abc.abstractmethod
    def train_dataset(self) -> Dataset:
        """Map-style training set; item i is whatever ``collate`` accepts, and carries index i."""

    @abc.abstractmethod
    def collate(self, items: list[Any]) -> Batch:
        """Items -> batch dict with ``"index"`` (LongTensor[B]) plus model inputs."""

    def loader_collate(self, items: list[Any]) -> Batch:
        """Items -> the batch the engine's loaders (training and scoring) ship to the device,
        where ``prepare`` makes the model inputs of it. By default ``collate``'s batch. A task
        whose items are stored integers (uint8 images) collates them as they are here, a
        quarter of float32's bytes through the loader's queue and the host-to-device copy
        (``attent.tasks.batches.TensorItemsTask``)."""
        return self.collate(items)

    def prepare(self, batch: Batch) -> Batch:
        """A shipped batch (``loader_collate``), on its device -> the model inputs ``collate``
        gives (the same values: normalisation on the device). By default the batch as it is.
        Idempotent (a prepared batch passes unchanged): a task calls it at the top of
        ``per_sample_loss``, ``score`` and ``kernel_output``, so a loop that ships ``collate``'s
        batches works too."""
        return batch

    def scoring_dataset(self) -> Dataset:
        """The training set as scoring passes read it: same items and indices, and no random
        augmentation where training has some (scores must compare like with like)."""
        return self.train_dataset()

    def group_labels(self) -> torch.Tensor | None:
        """LongTensor[N] of group ids (class, modality) for group-weight baselines, or None."""
        return None

    def stream_item(self, row: dict[str, Any], index: int) -> Any:
        """A row of the training stream (``stream:``, read by Ray Data in one of the config's
        ``stream_formats``) as a training item, what ``train_dataset()[index]`` would be.

        Raises:
            NotImplementedError: a task that reads no stream (its config lists no format).
        """
        raise NotImplementedError(f"task {self.name} reads no stream")

    def describe_data(self) -> list[DatasetDescription]:
        """The datasets this run reads (``DatasetDescription``: name, source,
        train or eval, size, a content fingerprint), recorded once as the MLflow run's inputs.
        By default the training set, named after the task, its source the task's code; tasks
        that read files or hub datasets say which."""
        import inspect

        return [
            DatasetDescription(
                f"{self.name}-train", inspect.getfile(type(self)), DATASET_TRAIN, len(self.train_dataset())
            )
        ]

    # --- model ------------------------------------------------------------------------------
    @abc.abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model (the engine moves it to the device and wraps it for DDP)."""

    @classmethod
    def prepare_rehearsal(cls, config: Any, folder: Any) -> dict[str, Any]:
        """What a rehearsal makes on its driver before any worker starts, for a stand-in of
        ``config`` that its fields alone cannot give (a language model's weights, say).

        Args:
            config: the task's section, its ``rehearsal_fields`` applied.
            folder: a folder every node reads (under the run's storage) to write into.

        Returns:
            Further ``task:`` fields for the stand-in (none by default).

        Raises:
            OSError: what the file names cannot be reached from here (one line naming the fix).
        """
        return {}

    @classmethod
    def probe(cls, config: Any) -> Probe:
        """The model and batches of ``config``'s shapes, without reading data or weights
        (``Probe``); a task that cannot build them so says which figure to give instead."""
        raise NotImplementedError(
            f"attent plan cannot build task {cls.name!r}'s model without its data: give --flops-per-sample"
        )

    def trainable_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """Parameters the optimiser updates (LoRA tasks return the adapters only)."""
        return [p for p in model.parameters() if p.requires_grad]

    def optimizer_spec(self) -> OptimizerSpec:
        """The task's optimiser and schedule defaults (``train:`` fields override them)."""
        return OptimizerSpec()

    def parameter_groups(self, model: nn.Module, weight_decay: float) -> list[ParamGroup]:
        """The optimiser's parameter groups: by default no weight decay on biases, norms and
        embeddings (see ``decay_groups``)."""
        return decay_groups(model, weight_decay)

    # --- loss and evaluation ----------------------------------------------------------------
    @abc.abstractmethod
    def per_sample_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """FloatTensor[B] (or [B, C] with ``loss_components``): one loss per sample, unreduced,
        differentiable when grad is enabled. The training loss (the engine takes a weighted mean)
        and the AtteNT score seen in training forwards."""

    def score(self, model: nn.Module, batch: Batch, round_: int) -> torch.Tensor:
        """Per-sample losses of a scoring pass (model in eval mode, no gradients), shaped as
        ``per_sample_loss``. ``round_`` numbers the scoring pass (its epoch): a task that draws
        random masks seeds them by (sample index, round), so a sample's score does not depend
        on its batch and one round's scores compare like with like."""
        return self.per_sample_loss(model, batch)

    def score_of(self, losses: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The samples' scores from their per-sample losses (training's or a scoring pass's), which
        training still back-propagates. Default: the losses are the scores; a task overrides it
        to rank by another reduction of the same losses (the LLM task's ``score``)."""
        return losses

    def kernel_output(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """FloatTensor[B]: the scalar f(x) per sample whose parameter gradient builds the
        engine's empirical kernel (``antk:``), K_ij = <df(x_i)/dθ, df(x_j)/dθ>. Called under
        ``torch.func`` (vmap over samples, a batch of one each; eval mode; parameters swapped in
        by ``functional_call``), so it must be deterministic and free of random ops and
        data-dependent Python control flow (``.item()``, ``if tensor``, ``nonzero``). Default:
        the per-sample loss, summed over loss components; tasks that draw masks override it."""
        losses = self.per_sample_loss(model, batch)
        return losses if losses.ndim == 1 else losses.sum(dim=1)

    def export(self, model: nn.Module) -> dict[str, Any] | None:
        """What a downstream job loads from this run (e.g. the encoder's weights and shape),
        saved as the run's ``pretrained`` artifact at the end; None: nothing to hand over."""
        return None

    def model_to_log(self, model: nn.Module) -> TorchModel | AdapterModel | None:
        """The trained model as the run logs it in MLflow at the end (rank 0, from the unwrapped
        model); None: the run logs no model."""
        return None

    def load_weights(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Start ``model`` from saved weights (``train.init_weights``: a logged model of this task
        and shape, or a Ray checkpoint of such a run), named as the model's state dict names
        them. Frozen tensors the weights lack keep their built values (a checkpoint stores only
        what trains); a trainable one missing, or a tensor the model lacks, is refused."""
        missing, unexpected = model.load_state_dict(state, strict=False)
        frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        trainable_missing = [name for name in missing if name not in frozen]
        if trainable_missing or unexpected:
            raise ValueError(
                f"the initial weights do not fit this {self.name} model: missing "
                f"{trainable_missing[:4]}, unexpected {unexpected[:4]}; give weights of a run "
                "of the same task and model shape"
            )

    @abc.abstractmethod
    def evaluate(
        self, model: nn.Module, *, rank: int, world_size: int, progress: Callable[[str], None] | None = None
    ) -> dict[str, float]:
        """Downstream metrics, identical on every rank (shard the work and all-reduce, or
        compute on every rank). Called with the unwrapped model in eval mode."""


def evaluation_chunks(num_items: int, *, rank: int, world_size: int, batch_size: int) -> list[list[int]]:
    """This rank's share of an evaluation set (every world_size-th item), in chunks of item
    indices; evaluate each chunk and sum the totals over ranks (``sum_over_ranks``)."""
    shard = range(rank, num_items, world_size)
    return [list(shard[i : i + batch_size]) for i in range(0, len(shard), batch_size)]


def sum_over_ranks(totals: torch.Tensor, world_size: int) -> torch.Tensor:
    """All-reduce (sum) of per-rank totals; refuses a multi-rank call without a process group."""
    if world_size > 1:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                f"evaluate(world_size={world_size}) needs an initialised "
                "torch.distributed process group to sum the shards"
            )
        dist.all_reduce(totals)
    return totals


def seeded_init(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` under a local seed: the same seed gives the same initial weights whatever ran
    before, without touching the global generator."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def data_seed(split_seed: int | None, seed: int) -> int:
    """The seed that draws a run's data: ``split_seed`` where the config fixes the split (the
    same data for every run, comparable with earlier results), else the run's own seed, so that
    seeds resample the data as well as the initialisation and the order."""
    return seed if split_seed is None else split_seed


def stratified_order(labels: torch.Tensor, seed: int) -> torch.Tensor:
    """Every index once, in a seeded random order whose every prefix, and every suffix, holds
    each class within one of its share.

    Each class's samples, shuffled, get evenly spaced keys (rank + 0.5) / class_count in (0, 1);
    in key order the first (or last) n take about n * class_count / N of every class.
    """
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    shuffled = labels[perm]
    counts = torch.bincount(shuffled)
    by_class = torch.argsort(shuffled, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(perm)
    rank[by_class] = torch.arange(len(labels)) - starts[shuffled[by_class]]
    keys = (rank + 0.5) / counts[shuffled]
    return perm[torch.argsort(keys, stable=True)]


def stratified_subset(labels: torch.Tensor, n: int, seed: int, what: str = "n") -> torch.Tensor:
    """Sorted indices of n samples drawn at random, every class within one of its share (the
    start of ``stratified_order``)."""
    if not 0 < n <= len(labels):
        raise ValueError(
            f"{what}={n} must be between 1 and the {len(labels)} available images; "
            f"lower it, or set it to null to use them all"
        )
    return stratified_order(labels, seed)[:n].sort().values


def holdout_sizes(pool: int, val_limit: int, train_limit: int | None, unit: str) -> tuple[int, int]:
    """(training, validation) sizes of a pool that gives ``val_limit`` items to validation and
    ``train_limit`` others to training (None: all the others); refused in one line, with the
    numbers and the fix, when they do not fit."""
    if train_limit is None:
        if not 0 < val_limit < pool:
            raise ValueError(
                f"val_limit={val_limit} must leave some of the {pool} training {unit} "
                f"to train on; lower it below {pool}"
            )
        return pool - val_limit, val_limit
    if val_limit + train_limit > pool:
        rest = f", or set train_limit to null to train on the other {pool - val_limit}" if val_limit < pool else ""
        raise ValueError(
            f"val_limit={val_limit} + train_limit={train_limit} = {val_limit + train_limit} "
            f"exceed the {pool} training {unit} both are drawn from (disjoint); lower one "
            f"of them{rest}"
        )
    return train_limit, val_limit


def stratified_holdout(
    labels: torch.Tensor, val_limit: int, train_limit: int | None, seed: int, unit: str = "images"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(training, validation): sorted, disjoint, each class-stratified indices of a training
    pool, ``val_limit`` set aside for validation and ``train_limit`` others (None: all of them)
    to train on. Validation is the end of ``stratified_order``, training its start: the
    training samples are those ``stratified_subset(labels, train_limit, seed)`` gives without
    validation, so setting validation aside changes no training set that fits beside it."""
    train, val = holdout_sizes(len(labels), val_limit, train_limit, unit)
    order = stratified_order(labels, seed)
    return order[:train].sort().values, order[len(labels) - val :].sort().values
