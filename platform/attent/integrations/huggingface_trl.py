"""AtteNT in TRL's ``SFTTrainer`` (``pip install attent[hf]``): the Hugging Face integration's
mixin on TRL's trainer.

    trainer = attent.AtteNTSFTTrainer(model=model, args=SFTConfig(...), train_dataset=prompt_completion_set,
                                      processing_class=tokenizer, selection=attent.SelectionConfig(preset="llm"))

The loss is TRL's own forward (its fused LM head: per-token log-probabilities, no full logits),
reduced per sample: with prompt-completion data TRL's ``completion_only_loss`` (or, for
conversations, ``assistant_only_loss``) labels the prompt -100, so a sample's score is the mean
loss of its completion tokens. The reduction is the same as ``AtteNTTrainer``'s (its module
docstring): with ``method="full"``, TRL's own loss. Packing and padding-free batches put several
samples in one row and are refused.
"""
from __future__ import annotations

from typing import Any

import torch
from trl import SFTTrainer

from .huggingface import AtteNTTrainerMixin


class AtteNTSFTTrainer(AtteNTTrainerMixin, SFTTrainer):
    """``trl.SFTTrainer`` training on the samples AtteNT picks: ``selection=SelectionConfig(...)``
    (and optionally ``seed=``) besides SFTTrainer's own arguments."""

    def __init__(self, *args, selection, seed=None, **kwargs):
        config = kwargs.get("args", args[1] if len(args) > 1 else None)
        # Refused before SFTTrainer packs or flattens the dataset, which may take long.
        if getattr(config, "packing", False) or getattr(config, "padding_free", False):
            knob = "packing" if config.packing else "padding_free"
            raise ValueError(f"{type(self).__name__}: {knob}=True puts several samples in one row, losing which "
                             f"sample each loss belongs to: set {knob}=False")
        super().__init__(*args, selection=selection, seed=seed, **kwargs)

    def refuse_settings(self) -> None:
        super().refuse_settings()
        if self.aux_loss_enabled:
            raise ValueError(f"{self.trainer_name}: the MoE router's auxiliary loss is one per batch, not per "
                             "sample: set router_aux_loss_coef=0.0 in the SFTConfig")

    def per_sample_loss(self, model, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(S, n) [B] from TRL's fused forward: the completion tokens' negative log-likelihoods
        (weighed by their probability for ``loss_type="dft"``, as TRL does), summed per sample."""
        inputs = {**inputs, "use_cache": False}
        outputs = model(**inputs, fused_lm_head=True)
        token_loss = -outputs.log_probs  # zero where the label is -100
        if self.args.loss_type == "dft":
            token_loss = token_loss * outputs.log_probs.exp().detach()
        if model.training:
            self._record_trl_metrics(outputs, inputs)
        return token_loss.sum(dim=1), outputs.label_mask.sum(dim=1)

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
