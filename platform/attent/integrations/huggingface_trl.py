"""AtteNT in TRL's ``SFTTrainer`` (the ``trl`` extra): the Hugging Face integration's
mixin on TRL's trainer.

    trainer = attent.AtteNTSFTTrainer(model=model, args=SFTConfig(...), train_dataset=prompt_completion_set,
                                      processing_class=tokenizer, selection=attent.SelectionConfig(preset="llm"))

The loss is TRL's own forward (its fused LM head: per-token log-probabilities of the next token,
no full logits, for any causal LM whatever its head is called), reduced per sample: with
prompt-completion data TRL's ``completion_only_loss`` (or, for conversations,
``assistant_only_loss``) labels the prompt -100, so a sample's score is the mean loss of its
completion (or assistant) tokens. At the first forward the split's total is checked against the
fused head's own loss of the batch. The batch loss is TRL's: the weighted sum over the
num_items_in_batch Trainer counts, as ``AtteNTTrainer``'s (its module docstring). With
``method="full"`` (and no ``compute_per_sample_loss``) no per-sample loss is computed: TRL's own
``compute_loss``, its metrics and its MoE auxiliary loss, packing and padding-free batches included.

Where per-sample losses are computed, ``packing=True`` and ``padding_free=True`` pack batches, not
the dataset: the dataset stays one sample per row (TRL's dataset packing would merge samples
before the sampler picks them), and each batch of the samples the selection picks is flattened
into one padding-free row by TRL's padding-free collator (positions restarting at 0 at each
sample, no attention mask, no padding); each sample's loss is its own tokens' terms of that row
(``packed``), equal to its unpacked loss within float rounding. Without either setting, a
``DataCollatorWithFlattening`` passed as the ``data_collator`` is split so too (as in ``AtteNTTrainer``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from trl import SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from ..selection.config import SelectionConfig
from . import packed
from .huggingface import AtteNTTrainerMixin
from .huggingface_loss import Reduction, as_sums_and_counts, check_split


class AtteNTSFTTrainer(AtteNTTrainerMixin, SFTTrainer):
    """``trl.SFTTrainer`` training on the samples AtteNT picks.

    Under a selecting method (or with ``compute_per_sample_loss``), ``packing=True`` and
    ``padding_free=True`` both mean batch-level packing: each batch of picked samples is one
    padding-free row, and ``per_device_train_batch_size`` counts samples, not packed rows. TRL's
    own dataset packing (rows of ``max_length`` holding several samples) is what
    ``method="full"`` still runs; there nothing is picked.

    Args:
        *args: SFTTrainer's (``model``, ``args``, ...).
        selection: the selection's settings, e.g. ``SelectionConfig(preset="llm")``.
        seed: of the selection's draws and shuffles; None: ``args.seed``, read as train() starts.
        **kwargs: SFTTrainer's, and ``AtteNTTrainer``'s ``compute_per_sample_loss``.

    Raises:
        ValueError: a packing the selection cannot follow (``packing_strategy="wrapped"``, a
            collator of one's own, a vision dataset, context parallelism, or a model whose
            attention does not keep packed samples apart), or another setting the selection
            cannot follow (``AtteNTTrainer``'s), in one line naming the fix.
    """

    def __init__(self, *args: Any, selection: SelectionConfig, seed: int | None = None, **kwargs: Any):
        config = kwargs.get("args", args[1] if len(args) > 1 else None)
        per_sample = selection.selects or kwargs.get("compute_per_sample_loss") is not None
        knob = packing_knob(config) if per_sample else None
        self.packs_batches = knob is not None  # per-sample losses from padding-free rows
        if knob is None:
            super().__init__(*args, selection=selection, seed=seed, **kwargs)
            return
        # Refused before SFTTrainer prepares the dataset, which may take long.
        self._refuse_packing(batch_packing_problem(config, knob, kwargs.get("data_collator")))
        with one_sample_per_row(config):  # TRL prepares the dataset unpacked, truncated to max_length
            super().__init__(*args, selection=selection, seed=seed, **kwargs)
        self._refuse_packing(self._packed_data_problem(knob))
        self.data_collator.padding_free = self.padding_free = True

    def _packed_data_problem(self, knob: str) -> str | None:
        """What in the prepared data or the model batch-level packing cannot follow, and the fix."""
        if self._is_vision_dataset or not isinstance(self.data_collator, DataCollatorForLanguageModeling):
            return f"TRL's padding-free collator packs no vision dataset: set {knob}=False"
        problem = packed.attention_problem(self.model)
        return problem and f"{problem}: set {knob}=False"

    def _refuse_packing(self, problem: str | None) -> None:
        if problem:
            raise ValueError(f"{type(self).__name__}: {problem}")

    def refuse_settings(self, training: bool = False) -> None:
        super().refuse_settings(training)
        if self.needs_per_sample_losses and self.aux_loss_enabled:
            raise ValueError(
                f"{self.trainer_name}: the MoE router's auxiliary loss is one per batch, not per "
                "sample: set router_aux_loss_coef=0.0 in the SFTConfig"
            )

    def per_sample_loss(self, model, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(S, n) [B] from TRL's fused forward: the completion tokens' negative log-likelihoods
        (weighed by their probability for ``loss_type="dft"``, as TRL does), summed per sample;
        of a padding-free row, per sample of the row (``packed``), B the batch's samples."""
        segments = self._segments(inputs)
        if segments is None and self.compute_per_sample_loss is not None:
            return super().per_sample_loss(model, inputs)
        inputs = {**inputs, "use_cache": False}  # a cache would turn off transformers' packed-row masks
        if segments is not None:  # no label is scored across a boundary, whatever the collator says
            inputs["labels"] = packed.mask_boundaries(inputs["labels"], segments[0])
            if self.compute_per_sample_loss is not None:  # the hook's loss of each of the row's samples
                hooked = self.compute_per_sample_loss(model, inputs)
                return as_sums_and_counts(hooked, segments[1], self.trainer_name)
        outputs = model(**inputs, fused_lm_head=True)
        token_loss = -outputs.log_probs  # zero where the label is -100

        def split(terms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if segments is None:
                return terms.sum(dim=1), outputs.label_mask.sum(dim=1)
            return packed.packed_sums(terms, outputs.label_mask, *segments)

        sums, counts = split(token_loss)
        if self.loss_reduction is None and counts.sum() > 0:  # the fused head's own loss: its terms' mean
            check_split(self.trainer_name, model, outputs.loss, sums.sum() / counts.sum(), "TRL's fused LM head")
            self.loss_reduction = Reduction("next_token", num_items=True)  # TRL divides by num_items_in_batch
        if self.args.loss_type == "dft":
            sums = split(token_loss * outputs.log_probs.exp().detach())[0]
        if model.training:
            self._record_trl_metrics(outputs, inputs)
        return sums, counts

    def _segments(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, int] | None:
        """(segments, B) of a padding-free batch (``packed.batch_segments``); None if it is padded
        (without batch-level packing, the mixin's: a ``DataCollatorWithFlattening`` batch's)."""
        if not self.packs_batches:
            return super()._segments(inputs)
        pad = self.data_collator.pad_token_id if self.args.pad_to_multiple_of else None
        return packed.batch_segments(inputs, pad_token_id=pad)

    def _record_trl_metrics(self, outputs, inputs: dict[str, Any]) -> None:
        """The training metrics SFTTrainer.compute_loss records (entropy, token accuracy, tokens
        seen), which this trainer's own compute_loss replaces."""
        gather = self.accelerator.gather_for_metrics
        valid = gather(outputs.label_mask.sum()).sum()
        entropy = gather(outputs.entropy.detach().sum()).sum()
        correct = gather(outputs.is_top1.sum()).sum()
        metrics = self._metrics["train"]
        metrics["entropy"].append((entropy / valid).item() if valid > 0 else 0.0)
        metrics["mean_token_accuracy"].append((correct / valid).item() if valid > 0 else 0.0)
        if inputs.get("attention_mask") is not None:
            tokens = inputs["attention_mask"].sum()
        else:  # padding-free: the row's tokens, as SFTTrainer counts them
            tokens = torch.tensor(inputs["position_ids"].size(1), device=inputs["position_ids"].device)
        self._total_train_tokens += gather(tokens).sum().item() // self._tp_size
        metrics["num_tokens"] = [self._total_train_tokens]


def packing_knob(config) -> str | None:
    """The setting that packs ("packing" or "padding_free"), None if neither does."""
    if getattr(config, "packing", False):
        return "packing"
    return "padding_free" if getattr(config, "padding_free", False) else None


def batch_packing_problem(config, knob: str, data_collator) -> str | None:
    """What in the SFTConfig batch-level packing cannot follow, and the fix; None if nothing."""
    if knob == "packing" and getattr(config, "packing_strategy", None) == "wrapped":
        return (
            "packing_strategy='wrapped' cuts samples into chunks that are samples no more, and AtteNT packs "
            "each batch of picked samples into one row instead: set packing_strategy='bfd'"
        )
    if data_collator is not None:
        return (
            f"{knob}=True packs each batch with TRL's padding-free collator, not with a collator of one's "
            f"own: drop data_collator or set {knob}=False"
        )
    parallelism = getattr(config, "parallelism_config", None)
    if getattr(parallelism, "cp_enabled", False):
        return (
            "context parallelism drops the attention mask that keeps packed samples apart: "
            f"set {knob}=False or disable context parallelism"
        )
    return None


@contextmanager
def one_sample_per_row(config):
    """``config`` as SFTTrainer is to read it while it prepares the data: no dataset packing (the
    training set stays one sample per row, truncated to max_length) and a padded collator (made
    padding-free afterwards); evaluation sets packed as the settings ask. Restored afterwards."""
    saved = config.packing, config.padding_free, config.eval_packing
    config.eval_packing = config.packing if config.eval_packing is None else config.eval_packing
    config.packing = config.padding_free = False
    try:
        yield config
    finally:
        config.packing, config.padding_free, config.eval_packing = saved
