"""Per-sample losses that are a Hugging Face model's own loss, split by sample.

A model computes its loss from its logits and ``labels`` in one of a few ways, and nothing
public says which: a causal LM (any head name: ``GPT2LMHeadModel`` as well as ``...ForCausalLM``)
predicts label t+1 from position t; a sequence-to-sequence model (T5, BART) and a token
classifier score label t at position t; a sequence classifier has one label per sample; a
regression head (``num_labels=1`` or ``problem_type="regression"``) takes the mean squared (or
absolute) error of its outputs, and a multi-label classifier the mean binary cross-entropy of its
logits, over the elements of float labels [B] or [B, C]. Some
divide the summed loss by the ``num_items_in_batch`` Trainer passes them (labelled tokens in the
accumulated batch), others take their micro-batch mean whatever they are passed. Trainer's
private guesses (``_loss_shifts_labels``, from the model's registered ``loss_type``) are wrong for
models whose type is not registered, GPT-2 among them.

So the split is not guessed: at the first forward the model computes its own loss on the batch
(labels passed, and a deliberately wrong ``num_items_in_batch`` where it takes one), and the
reduction whose total equals that loss, from the same logits, is the one used from then on:

    alignment      "next_token" (causal LM), "token" (seq2seq, token classification), "sequence"
    loss           "cross_entropy" (integer labels), "squared_error", "absolute_error",
                   "binary_cross_entropy" (float labels: a sample's terms are its elements)
    num_items      True: the model divides by the num_items_in_batch it is passed; False: its
                   micro-batch mean

A model whose loss matches no split (an extra loss term, a weighted loss, no loss at all) is
refused there, before the first optimiser step, in one line naming
the hook that takes over: ``compute_per_sample_loss(model, inputs)``, returning each sample's
loss [B] or (summed loss terms [B], their count [B]).

The objective ``AtteNTTrainer`` trains on (``huggingface``): each sample's loss is the model's own
loss split by sample, as above. S_i is sample i's summed loss terms (next-token cross-entropies of
its labelled tokens for a causal LM of any head name; same-position ones for seq2seq and token
classification; one cross-entropy for sequence classification) and n_i their count. The loss
back-propagated is sum_i w_i S_i / D, with w_i the selection's loss weight (1 unless the method
reweighs) and D what the model itself divides by: the ``num_items_in_batch`` Trainer passes it
where the model uses it, else the micro-batch's sum_i n_i; Trainer then scales it for
accumulation and ranks as it scales the model's own loss.
With every w_i = 1 that is the model's own loss as Trainer trains it. A sample's score for the
selection is its own mean S_i / n_i, so a long answer is not hard for being long. Other losses:
``compute_per_sample_loss=fn(model, inputs)`` gives each sample's loss (or S and n), and the batch
loss is their weighted micro-batch mean, which Trainer divides by the accumulation steps.
``method="full"`` reads no score and weighs nothing: without that hook it trains on Trainer's own
``compute_loss``, whatever the model's loss (no split asked for), and is the plain Trainer's run;
with it, on the hook's micro-batch mean, as a selecting run of the same hook does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from . import packed

IGNORE_INDEX = -100  # Trainer's label of tokens that carry no loss
ALIGNMENTS = ("next_token", "token", "sequence")
# The elementwise losses of float labels, as torch's MSELoss, L1Loss and BCEWithLogitsLoss compute them
ELEMENTWISE = {
    "squared_error": F.mse_loss,
    "absolute_error": F.l1_loss,
    "binary_cross_entropy": F.binary_cross_entropy_with_logits,
}
# transformers' problem_type, to break a tie between elementwise losses
PROBLEM_LOSS = {"regression": "squared_error", "multi_label_classification": "binary_cross_entropy"}
HOOK = (
    "pass compute_per_sample_loss=fn(model, inputs) returning each sample's loss [B] "
    "(or its summed loss terms [B] and their count [B])"
)

# compute_per_sample_loss(model, inputs) -> FloatTensor[B], or (sums [B], counts [B])
PerSampleLossHook = Callable[[torch.nn.Module, dict], torch.Tensor | tuple[torch.Tensor, torch.Tensor]]


def split_loss(
    logits: torch.Tensor, labels: torch.Tensor, alignment: str, loss: str = "cross_entropy"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, n), each [B]: the sum and the count of each sample's loss terms under ``alignment``
    (``loss``: a cross-entropy, or an elementwise loss of float labels), in float32 whatever the
    logits' dtype (as transformers' losses upcast)."""
    if loss != "cross_entropy":
        return elementwise_split(logits, labels, loss)
    if alignment == "sequence":
        if labels.ndim != 1 or logits.ndim != 2 or labels.is_floating_point():
            raise ValueError(
                f"one class label per sample needs labels [B] and logits [B, C], got labels "
                f"{labels.dtype} {tuple(labels.shape)} and logits {tuple(logits.shape)}"
            )
        return F.cross_entropy(logits.float(), labels, reduction="none"), torch.ones_like(labels)
    if labels.is_floating_point() or logits.ndim != labels.ndim + 1 or logits.shape[:2] != labels.shape:
        raise ValueError(
            f"token labels [B, T] need logits [B, T, V], got labels {labels.dtype} "
            f"{tuple(labels.shape)} and logits {tuple(logits.shape)}"
        )
    if alignment == "next_token":
        logits, labels = logits[:, :-1], labels[:, 1:]
    token_loss = F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    ).view_as(labels)
    return token_loss.sum(dim=1), (labels != IGNORE_INDEX).sum(dim=1)


def elementwise_split(logits: torch.Tensor, labels: torch.Tensor, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, n) [B] of an elementwise loss: a sample's terms are its label's elements, as the
    model's mean over all of them counts them (a regression head's outputs [B, 1] against labels
    [B], as transformers squeezes them)."""
    if not labels.is_floating_point() or labels.ndim not in (1, 2):
        raise ValueError(
            f"an elementwise loss needs float labels [B] or [B, C], got {labels.dtype} {tuple(labels.shape)}"
        )
    prediction = logits.float()
    if prediction.ndim == labels.ndim + 1 and prediction.shape[-1] == 1:
        prediction = prediction.squeeze(-1)
    if prediction.shape != labels.shape:
        raise ValueError(f"labels {tuple(labels.shape)} need outputs of their shape, got {tuple(logits.shape)}")
    terms = ELEMENTWISE[loss](prediction, labels.float(), reduction="none").reshape(len(labels), -1)
    return terms.sum(dim=1), torch.full((len(labels),), terms.shape[1], device=terms.device)


def candidate_splits(labels: torch.Tensor) -> list[tuple[str, str]]:
    """(alignment, loss) of the splits a model's loss may be, by its labels: cross-entropies of
    integer labels, elementwise losses of float ones."""
    if labels.is_floating_point():
        return [("sequence", loss) for loss in ELEMENTWISE]
    return (
        [("sequence", "cross_entropy")]
        if labels.ndim == 1
        else [("next_token", "cross_entropy"), ("token", "cross_entropy")]
    )


def hooked_split(
    owner: str, hook: PerSampleLossHook, model: torch.nn.Module, inputs: dict[str, Any], segments: tuple | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, n) [B] from ``compute_per_sample_loss``: one loss per row, or per sample of a packed
    row (``segments``: (segments, B) of ``packed.batch_segments``)."""
    labels = inputs.get("labels")
    rows = len(labels) if labels is not None else len(next(iter(inputs.values())))
    return as_sums_and_counts(hook(model, inputs), rows if segments is None else segments[1], owner)


def as_sums_and_counts(value: Any, rows: int, owner: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``compute_per_sample_loss`` result as (S, n): a loss per sample counts as one term."""
    sums, counts = value if isinstance(value, (tuple, list)) else (value, None)
    if not torch.is_tensor(sums) or sums.shape != (rows,):
        raise ValueError(
            f"{owner}: compute_per_sample_loss must return a loss per sample [{rows}] (or sums and "
            f"counts, each [{rows}]), got {getattr(sums, 'shape', type(sums).__name__)}"
        )
    if counts is None:
        counts = torch.ones(rows, dtype=torch.long, device=sums.device)
    return sums, counts


@dataclass(frozen=True)
class Reduction:
    """How a model reduces its loss (module docstring)."""

    alignment: str
    num_items: bool
    loss: str = "cross_entropy"


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside DDP (``.module``) and peft (``get_base_model()``) wrappers."""
    inner = getattr(model, "module", model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def likely_loss(model: torch.nn.Module) -> str:
    """The elementwise loss the model's ``problem_type`` names (a regression's by default), to
    break a tie between elementwise losses."""
    return PROBLEM_LOSS.get(getattr(getattr(unwrapped(model), "config", None), "problem_type", None), "squared_error")


def likely_alignment(model: torch.nn.Module, labels: torch.Tensor) -> str | None:
    """What the model's kind suggests, to break a tie between splits that give the same total
    (only where the first batch cannot tell them apart)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    )

    inner = unwrapped(model)
    name = type(inner).__name__
    if labels.ndim == 1 or labels.is_floating_point():
        return "sequence"
    if (
        getattr(getattr(inner, "config", None), "is_encoder_decoder", False)
        or name in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES.values()
    ):
        return "token"
    if name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        return "next_token"
    return None


def model_outputs(outputs: Any, with_labels: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the model's own loss or None, logits) from a ModelOutput, a dict or a tuple."""
    if isinstance(outputs, dict):  # ModelOutput is a dict
        return outputs.get("loss"), outputs["logits"]
    if with_labels and len(outputs) > 1 and outputs[0].ndim == 0:
        return outputs[0], outputs[1]
    return None, outputs[0]


def tolerance(model_loss: torch.Tensor, logits: torch.Tensor) -> float:
    """How far the model's own loss and its split's total may lie apart. Measured on the ten tested
    architectures: float32 logits (also under bf16 autocast, whose outputs accelerate returns in
    float32) at most 1.1e-7 relative; bfloat16 weights, whose logits arrive in bfloat16 and which
    T5, BART and BERT reduce in bfloat16, at most 1.2e-3 (the loss rounded to bfloat16)."""
    relative = 1e-4 if logits.dtype == torch.float32 else 1e-2
    return relative * max(1.0, abs(float(model_loss.detach())))


def decide_reduction(
    owner: str,
    model: torch.nn.Module,
    model_loss: torch.Tensor | None,
    logits: torch.Tensor,
    labels: torch.Tensor,
    probe: int | None,
) -> Reduction | None:
    """The reduction whose total is the model's own loss on this batch (``probe``: the
    num_items_in_batch the model was passed, None if none); None if this batch cannot tell the
    candidates apart (no labelled token, a non-finite loss). Refuses, in one line naming the hook, a model whose loss
    is no split of its logits."""
    name = type(unwrapped(model)).__name__
    if model_loss is None:
        raise ValueError(
            f"{owner}: {name} returns no loss when given labels, so AtteNT cannot check how its loss "
            f"splits by sample: {HOOK}"
        )
    if not torch.is_tensor(model_loss) or model_loss.numel() != 1:
        raise ValueError(
            f"{owner}: {name}'s loss is not one number ({tuple(getattr(model_loss, 'shape', ()))}): {HOOK}"
        )
    target = float(model_loss.detach())
    if not math.isfinite(target):
        return None  # a NaN or inf loss matches nothing: the next batch decides
    totals: dict[Reduction, float] = {}
    with torch.no_grad():
        for alignment, loss in candidate_splits(labels):
            try:
                sums, counts = split_loss(logits.detach(), labels, alignment, loss)
            except ValueError as error:
                raise ValueError(
                    f"{owner}: {name}'s labels split into no per-sample cross-entropy, squared or absolute "
                    f"error or binary cross-entropy ({error}): {HOOK}"
                ) from None
            if counts.sum() == 0:
                return None  # nothing labelled: every candidate is 0
            total = float(sums.sum())
            totals[Reduction(alignment, False, loss)] = total / float(counts.sum())
            if probe is not None:
                totals[Reduction(alignment, True, loss)] = total / probe
    tol = tolerance(model_loss, logits)
    matches = [reduction for reduction, value in totals.items() if abs(value - target) <= tol]
    if len(matches) > 1:
        likely = likely_alignment(model, labels), likely_loss(model)
        matches = [
            r for r in matches if r.alignment == likely[0] and r.loss in (likely[1], "cross_entropy")
        ] or matches[:1]
    if not matches:
        passed = f" (passed num_items_in_batch={probe})" if probe is not None else ""
        splits = ", ".join(f"{describe(r)} {value:.6g}" for r, value in totals.items())
        raise ValueError(
            f"{owner}: {name}'s own loss on the first batch is {target:.6g}{passed}, and no per-sample split of "
            f"its logits gives it ({splits}): its loss is no cross-entropy, squared or absolute error or "
            f"binary cross-entropy over its labels that AtteNT can split by sample; {HOOK}"
        )
    return matches[0]


def describe(reduction: Reduction) -> str:
    """E.g. "next-token mean", "squared-error / num_items"."""
    what = reduction.alignment if reduction.loss == "cross_entropy" else reduction.loss
    return f"{what.replace('_', '-')} {'/ num_items' if reduction.num_items else 'mean'}"


def check_split(
    owner: str, model: torch.nn.Module, model_loss: torch.Tensor, split_total: torch.Tensor, what: str
) -> None:
    """Refuses, in one line naming the hook, a split whose total is not ``what``'s own loss."""
    model_loss, split_total = model_loss.detach(), split_total.detach()
    if abs(float(split_total) - float(model_loss)) > tolerance(model_loss, split_total):
        raise ValueError(
            f"{owner}: {what}'s own loss on the first batch of {type(unwrapped(model)).__name__} is "
            f"{float(model_loss):.6g}, its per-sample split sums to {float(split_total):.6g}: {HOOK}"
        )


def loss_probe(labels: torch.Tensor) -> int:
    """A num_items_in_batch no split's own count can equal, so that the model's loss tells
    whether the model divides by what it is passed."""
    return 2 * labels.numel() + 1


def own_loss_split(
    owner: str,
    model: torch.nn.Module,
    inputs: dict[str, Any],
    reduction: Reduction | None,
    accepts_loss_kwargs: bool,
    segments: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Reduction | None]:
    """(S, n, reduction): each sample's summed loss terms and their count [B] from one forward of
    ``model``, split as the model's own loss splits; ``reduction`` None (not known yet) has the
    model compute its own loss on this batch and learns it (``decide_reduction``). ``segments``:
    (segments, B) of a padding-free row (``packed.batch_segments``, its labels masked at the
    boundaries), split per sample of the row: a causal LM's next-token loss only."""
    labels = inputs.get("labels")
    if labels is None:
        raise ValueError(
            f"{owner}: a batch without 'labels': per-sample losses need them "
            "(labels -100 where a token carries no loss)"
        )
    checking = reduction is None
    # The labels reach the model where it computes its own loss to be checked against, and where
    # it makes its decoder's inputs from them (seq2seq); otherwise they would only cost a second
    # cross-entropy.
    with_labels = checking or (
        getattr(getattr(unwrapped(model), "config", None), "is_encoder_decoder", False)
        and "decoder_input_ids" not in inputs
    )
    forward = dict(inputs) if with_labels else {key: value for key, value in inputs.items() if key != "labels"}
    probe = loss_probe(labels) if checking and accepts_loss_kwargs else None
    if probe is not None:  # a count no split has: the model's loss shows whether it divides by it
        forward["num_items_in_batch"] = probe
    model_loss, logits = model_outputs(model(**forward), with_labels)
    if checking:
        reduction = decide_reduction(owner, model, model_loss, logits, labels, probe)
    # undecided (nothing labelled in this batch, or its loss not finite): the likeliest, checked again next batch
    alignment = reduction.alignment if reduction else (likely_alignment(model, labels) or "next_token")
    loss = reduction.loss if reduction else (likely_loss(model) if labels.is_floating_point() else "cross_entropy")
    if segments is None:
        return (*split_loss(logits, labels, alignment, loss), reduction)
    if (alignment, loss) != ("next_token", "cross_entropy"):
        raise ValueError(
            f"{owner}: a padding-free row holds several samples, and {type(unwrapped(model)).__name__}'s loss is no "
            "next-token cross-entropy (a causal LM's) that AtteNT can split at their boundaries: use a padding collator"
        )
    return (*packed.packed_logit_sums(logits, labels, *segments), reduction)
