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
Otherwise packing and padding-free batches put several samples in one row and are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import SFTTrainer

from .huggingface import AtteNTTrainerMixin
from .huggingface_loss import Reduction, check_split


class AtteNTSFTTrainer(AtteNTTrainerMixin, SFTTrainer):
    """``trl.SFTTrainer`` training on the samples AtteNT picks: ``selection=SelectionConfig(...)``
    (and optionally ``seed=``) besides SFTTrainer's own arguments."""

    def __init__(self, *args, selection, seed=None, **kwargs):
        config = kwargs.get("args", args[1] if len(args) > 1 else None)
        per_sample = selection.method != "full" or kwargs.get("compute_per_sample_loss") is not None
        # Refused before SFTTrainer packs or flattens the dataset, which may take long.
        if per_sample and (getattr(config, "packing", False) or getattr(config, "padding_free", False)):
            knob = "packing" if config.packing else "padding_free"
            raise ValueError(
                f"{type(self).__name__}: {knob}=True puts several samples in one row, losing which "
                f"sample each loss belongs to: set {knob}=False"
            )
        super().__init__(*args, selection=selection, seed=seed, **kwargs)

    def refuse_settings(self, training: bool = False) -> None:
        super().refuse_settings(training)
        if self.needs_per_sample_losses and self.aux_loss_enabled:
            raise ValueError(
                f"{self.trainer_name}: the MoE router's auxiliary loss is one per batch, not per "
                "sample: set router_aux_loss_coef=0.0 in the SFTConfig"
            )

    def per_sample_loss(self, model, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(S, n) [B] from TRL's fused forward: the completion tokens' negative log-likelihoods
        (weighed by their probability for ``loss_type="dft"``, as TRL does), summed per sample."""
        if self.compute_per_sample_loss is not None:
            return super().per_sample_loss(model, inputs)
        inputs = {**inputs, "use_cache": False}
        outputs = model(**inputs, fused_lm_head=True)
        token_loss = -outputs.log_probs  # zero where the label is -100
        sums, counts = token_loss.sum(dim=1), outputs.label_mask.sum(dim=1)
        if self.loss_reduction is None and counts.sum() > 0:  # the fused head's own loss: its terms' mean
            check_split(self.trainer_name, model, outputs.loss, sums.sum() / counts.sum(), "TRL's fused LM head")
            self.loss_reduction = Reduction("next_token", num_items=True)  # TRL divides by num_items_in_batch
        if self.args.loss_type == "dft":
            sums = (token_loss * outputs.log_probs.exp().detach()).sum(dim=1)
        if model.training:
            self._record_trl_metrics(outputs, inputs)
        return sums, counts

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
        self._total_train_tokens += gather(inputs["attention_mask"].sum()).sum().item() // self._tp_size
        metrics["num_tokens"] = [self._total_train_tokens]
