"""The selection's metric names, defined once for every framework: the engine's MLflow runs
(``attent.contract`` re-exports them, and ``analysis`` reads them there), ``Selector.metrics()``,
``AtteNTTrainer``'s logs and the Lightning callback's. Constants, and the names of each loss component's two."""

from __future__ import annotations

# Per epoch, as the engine logs them and the integrations report them:
TRAIN_LOSS = "train_loss"  # mean per-sample loss of the epoch's subset, all ranks
SELECTED_RATIO = "selected_ratio"  # share of the training set trained on
SAMPLES_BACKPROPAGATED = "samples_backpropagated"  # samples trained on, summed over epochs and ranks (padding excluded)
SAMPLES_FORWARDED = "samples_forwarded"  # training + scoring forwards, summed over epochs and ranks
SUBSET_CHECKSUM = "subset_checksum"  # strategies.subset_checksum of the epoch's subset
# From the epoch's re-selection (carried over while a pick holds):
SELECTION_HARDNESS = "selection_hardness"  # share of the pick in the hard top-k; uniform 0, hard 1
SELECTION_OVERLAP = "selection_overlap"  # share of the pick that was in the previous pick
SCORE_AGREEMENT = "selection_score_agreement"  # Spearman of training-forward vs scoring-pass losses

# The integrations' own (the engine logs samples_forwarded and num_train_samples instead):
EPOCH = "epoch"  # epochs begun so far (1 during the first)
SELECTED = "selected"  # the epoch's subset size
SAMPLES_SCORED = "samples_scored"  # this rank's scoring-pass samples of the epoch
SAMPLES_NONFINITE = "samples_nonfinite"  # the epoch's NaN or inf losses kept out of the scores (nonfinite="skip")


def component_loss_metric(component: str) -> str:
    """Per-epoch training loss of one loss component (a modality): ``train_loss_depth``."""
    return f"{TRAIN_LOSS}_{component}"


def component_weight_metric(component: str) -> str:
    """Weight of one loss component in the training loss (group baselines): ``loss_weight_depth``."""
    return f"loss_weight_{component}"
