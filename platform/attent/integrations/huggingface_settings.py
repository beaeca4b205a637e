"""The Trainer settings that would break AtteNT's selection, each found with the fix a user makes
(``AtteNTTrainerMixin.refuse_settings`` refuses them in one line)."""

from __future__ import annotations

import torch.distributed as dist
from transformers import DataCollatorWithFlattening

from ..selection.run_length import rank_batches
from . import huggingface_stream, loaders, packed

PADDING_COLLATORS = "use a padding collator (DataCollatorForSeq2Seq, DataCollatorWithPadding)"


def dataset_problem(dataset, training: bool) -> str | None:
    """What in a trainer's train_dataset the selection cannot read, and how to fix it; None if
    nothing (``setting_problem``'s first checks; ``training``: as there). An IterableDataset is
    read as a stream (``huggingface_stream``)."""
    if dataset is None and training:
        return "training requires a train_dataset: pass one to the trainer or set trainer.train_dataset"
    if type(dataset).__module__.startswith("ray.data"):
        return (
            "a Ray Data iterable (get_dataset_shard(...).iter_torch_batches()) arrives split and streamed, "
            "and AtteNT picks samples by their index: pass the whole map-style dataset on every worker "
            "(AtteNTTrainer shards each epoch's subset itself)"
        )
    return None


def setting_problem(trainer, training: bool = False) -> str | None:
    """What in ``trainer``'s data, collator or TrainingArguments the selection cannot work with,
    and how to fix it; None if nothing (asked only of a selecting method: ``method="full"`` is
    Trainer's own run). A trainer may be built without a training set (to
    evaluate, or given one later): ``training`` (when train() starts) requires one. What only a
    per-sample loss needs is refused only where one is computed (not for ``method="full"``
    without ``compute_per_sample_loss``, which trains on Trainer's own loss)."""
    # a stream's pools are scored by per-sample losses too, and trained on Trainer's own loss
    args, per_sample = trainer.args, trainer.selects or trainer.compute_per_sample_loss is not None
    stream = huggingface_stream.is_stream(trainer.train_dataset)
    problem = dataset_problem(trainer.train_dataset, training) or huggingface_stream.stream_problem(trainer)
    if problem:
        return problem
    if trainer.selection.method == "infobatch":
        problem = (
            "InfoBatch's subset sizes depend on the losses, so Trainer's step-based LR schedule "
            "cannot be sized for them: use attent.Selector in your own loop with an epoch-based schedule"
        )
    elif args.max_steps <= 0 and args.num_train_epochs <= 0:
        problem = f"num_train_epochs={args.num_train_epochs} trains nothing: set num_train_epochs or max_steps above 0"
    elif not stream and args.train_sampling_strategy in ("group_by_length", "batch_rebalance"):
        problem = (
            f"train_sampling_strategy={args.train_sampling_strategy!r} would replace AtteNT's sampler: "
            "use 'random' or 'sequential'"
        )
    elif per_sample and trainer.compute_loss_func is not None:
        problem = (
            "compute_loss_func returns one loss per batch and AtteNT needs one per sample: drop it, and "
            "pass compute_per_sample_loss=fn(model, inputs) returning each sample's loss [B] instead"
        )
    elif per_sample and args.label_smoothing_factor:
        problem = "label smoothing is not built into AtteNT's per-sample loss: set label_smoothing_factor=0"
    elif dist.is_available() and dist.is_initialized() and dist.get_world_size() != args.world_size:
        problem = (
            f"torch.distributed holds {dist.get_world_size()} processes but the TrainingArguments see "
            f"{args.world_size}: each process would train alone on all of every subset (accelerate "
            "runs CPU processes as one job only with use_cpu=True, e.g. under Ray Train without GPUs): "
            "set use_cpu=True, or give each process a GPU"
        )
    elif args.n_gpu > 1:
        problem = (
            "nn.DataParallel (several GPUs in one process) is not supported: launch one process per "
            "GPU with torchrun or accelerate launch"
        )
    elif per_sample and (flattening := flattening_problem(trainer)):
        problem = flattening
    elif not args.dataloader_in_order and args.dataloader_num_workers > 0:
        problem = (
            "dataloader_in_order=False lets batches overtake each other, and AtteNT knows a batch's "
            "samples from the sampler's order: keep dataloader_in_order=True"
        )
    return problem


def flattening_problem(trainer) -> str | None:
    """What keeps ``DataCollatorWithFlattening``'s rows from splitting into each sample's loss
    (``packed``: the samples told apart by their positions, kept apart by the attention), and the
    fix; None if nothing, or for another collator."""
    collator, model = trainer.data_collator, trainer.model
    if not isinstance(collator, DataCollatorWithFlattening):
        return None
    if not collator.return_position_ids:
        return (
            "DataCollatorWithFlattening(return_position_ids=False) numbers the row's positions as one sequence, "
            f"not each sample's from its start: set return_position_ids=True or {PADDING_COLLATORS}"
        )
    problem = packed.attention_problem(model)
    if problem:
        return f"{problem}: {PADDING_COLLATORS}"
    if trainer.args.use_cache and not packed.varlen_attention(model):
        return (
            "use_cache=True turns off transformers' masks that keep a packed row's samples apart, so each "
            "would attend to the ones before it in Trainer's own forwards: set use_cache=False"
        )
    return None


def loader_problem(trainer, loader) -> str | None:
    """What is wrong with the train loader a subclass's ``get_train_dataloader`` returned, and how
    to fix it; None if it draws this run's batches from the Selector's sampler alone."""
    fix = (
        "build it with sampler=self._get_train_sampler() and this trainer's batch size, or return "
        "super().get_train_dataloader()"
    )
    if trainer.selector is None or not draws_from(loader, trainer.selector.sampler):
        return f"returns a loader that does not draw from the selection's sampler: {fix}"
    samples, batch = len(trainer.selector.sampler), trainer._train_batch_size  # the sampler's pass as it stands
    wanted = rank_batches(samples, batch, drop_last=trainer.args.dataloader_drop_last)
    if len(loader) != wanted:
        return f"returns a loader of {len(loader)} batches where the sampler's {samples} samples make {wanted}: {fix}"
    processes = getattr(getattr(loader, "batch_sampler", None), "num_processes", 1)
    if processes > 1:
        return (
            f"shards the selection's sampler again over {processes} processes (accelerator.prepare): return "
            "super().get_train_dataloader(), whose loader each process draws from alone"
        )
    return None


def draws_from(loader, sampler, depth: int = 4) -> bool:
    """Whether ``loader`` (a DataLoader, or accelerate's wrapper of one) draws from ``sampler``."""
    return loaders.draws_from(loader, sampler, depth)
