"""AtteNTTrainer with transformers' ``DataCollatorWithFlattening`` under a selecting method: each batch is one
padding-free row, each sample's loss its own tokens' terms of it (``attent.integrations.packed``), one loss per
sample in the collator's order. The run picks the padded run's subsets epoch by epoch and scores its samples as it
does, from the training forwards (llm preset) and from the scoring passes (vit preset); a stream run picks the padded
stream run's batches. What would let a row's samples attend to each other is refused in one line.

The tiny Llama (sdpa attention, no dropout) and its token data are the Hugging Face tests' (``tests/helpers/hf_tiny``):
sample i's first token is 50 + i, so a test reads from a batch which samples it holds; the padded runs use
``DataCollatorForSeq2Seq`` with SmolLM2's tokenizer (pad token 2, inside the tiny vocabulary)."""

from __future__ import annotations

import pytest
import torch
from attent.integrations.huggingface import AtteNTTrainer
from attent.selection.config import SelectionConfig
from torch.utils.data import IterableDataset
from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening

from tests.helpers.hf_tiny import FIRST_TOKEN, losses_of, samples, tiny_llama, training_args

# The largest relative difference of a sample's score (at each epoch's start and at the end) and of a logged loss,
# flattened against padded: measured 3.6e-7 on this CPU (AMD EPYC, AVX-512; presets llm and vit, and the stream
# run's losses), 2.6e-7 under ATEN_CPU_CAPABILITY=avx2: float32 rounding, the row's other length reordering the
# reductions (as in tests/integrations/test_packed_losses.py). Some five times that:
RELATIVE = 2e-6
ITEMS = samples()


def sample_ids(inputs) -> list[int]:
    """The samples of a batch in its order: each padded row's first token, or each packed sample's (position 0)."""
    if "attention_mask" in inputs:
        return (inputs["input_ids"][:, 0] - FIRST_TOKEN).tolist()
    return (inputs["input_ids"][inputs["position_ids"] == 0] - FIRST_TOKEN).tolist()


class Recording(AtteNTTrainer):
    """Notes each epoch's subset and its scores as it starts, and each training batch's samples and shape."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.subsets, self.scores, self.batches, self.shapes = {}, {}, [], []

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.plans and self.selector.epoch not in self.subsets:
            epoch = self.selector.epoch
            self.subsets[epoch], self.scores[epoch] = self.selector.subset.tolist(), self.selector.scores.clone()
        self.batches.append(sample_ids(inputs))
        self.shapes.append((tuple(inputs["input_ids"].shape), "attention_mask" in inputs))
        return super().training_step(model, inputs, num_items_in_batch)


@pytest.fixture(scope="module")
def tokenizer():
    from attent.tasks.llm.model import resolve_checkpoint
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_checkpoint("smollm2-135m-instruct"))


def collator(kind: str, tokenizer):
    return DataCollatorWithFlattening() if kind == "flat" else DataCollatorForSeq2Seq(tokenizer, padding=True)


def trained(folder, collate, selection: SelectionConfig, train_dataset=None, hook=None, **overrides) -> Recording:
    trainer = Recording(
        model=tiny_llama(),
        args=training_args(folder, **overrides),
        train_dataset=ITEMS if train_dataset is None else train_dataset,
        data_collator=collate,
        selection=selection,
        compute_per_sample_loss=hook,
    )
    trainer.train()
    if trainer.plans:
        trainer.scores["end"] = trainer.selector.scores.clone()
    return trainer


def largest_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    assert torch.equal(got.isnan(), want.isnan())  # the never-scored alike
    got, want = got.nan_to_num(), want.nan_to_num()
    return float(((got - want).abs() / want.abs().clamp(min=1e-30)).max())


@pytest.mark.parametrize("preset", ["llm", "vit"])
def test_a_flattened_run_picks_the_padded_runs_subsets_and_scores_its_samples_alike(preset, tmp_path, tokenizer):
    """llm: scores from the training forwards (one packed row per batch); vit: from scoring passes, whose batches the
    flattening collator packs too."""
    runs = {
        kind: trained(tmp_path / kind, collator(kind, tokenizer), SelectionConfig(preset=preset))
        for kind in ("flat", "padded")
    }
    flat, padded = runs["flat"], runs["padded"]
    assert flat.subsets == padded.subsets and len(flat.subsets) == 3
    assert any(len(subset) < len(ITEMS) for subset in padded.subsets.values())  # something was left out
    assert flat.batches == padded.batches  # one loss per sample, in the collator's order
    assert all(shape[0] == 1 and not masked for shape, masked in flat.shapes)
    assert all(shape[0] > 1 and masked for shape, masked in padded.shapes[:-1])
    worst = max(largest_difference(flat.scores[key], padded.scores[key]) for key in padded.scores)
    assert worst <= RELATIVE, worst
    assert losses_of(flat) == pytest.approx(losses_of(padded), rel=RELATIVE)
    if preset == "vit":
        assert sum(row.get("samples_scored", 0) for row in flat.state.log_history) > 0


def packed_hook(model, inputs):
    """A compute_per_sample_loss of the row: the model's logits split by ``packed`` (labels already masked at the
    boundaries, use_cache=False)."""
    from attent.integrations import packed

    assert inputs["use_cache"] is False and "attention_mask" not in inputs
    segments, samples = packed.batch_segments(inputs)
    logits = model(**{key: value for key, value in inputs.items() if key != "labels"}).logits
    return packed.packed_logit_sums(logits, inputs["labels"], segments, samples)


def test_compute_per_sample_loss_gets_the_row_and_gives_each_samples_loss(tmp_path, tokenizer):
    selection = SelectionConfig(preset="llm")
    flat = trained(tmp_path / "flat", collator("flat", tokenizer), selection, hook=packed_hook)
    padded = trained(tmp_path / "padded", collator("padded", tokenizer), selection)
    assert flat.subsets == padded.subsets and flat.batches == padded.batches
    assert largest_difference(flat.scores["end"], padded.scores["end"]) <= RELATIVE


class Stream(IterableDataset):
    def __iter__(self):
        return iter(ITEMS)


def test_a_flattened_stream_run_picks_the_padded_stream_runs_batches(tmp_path, tokenizer):
    """Each pool scored per sample of its packed row, the picked batch trained as one row by Trainer's own loss."""
    selection = SelectionConfig(strategy="hard", ratio={"kind": "fixed", "start": 0.5})
    flat, padded = (
        trained(tmp_path / kind, collator(kind, tokenizer), selection, train_dataset=Stream(), max_steps=5)
        for kind in ("flat", "padded")
    )
    assert flat.batches == padded.batches and len(flat.batches) == 5
    assert all(shape[0] == 1 and not masked for shape, masked in flat.shapes)
    assert losses_of(flat) == pytest.approx(losses_of(padded), rel=RELATIVE)
    assert flat.stream_selector.samples_scored == padded.stream_selector.samples_scored == 5 * 8


def paged_llama():
    model = tiny_llama()
    model.config._attn_implementation = "paged|sdpa"
    return model


REFUSED = {
    "attention": "attn_implementation='paged\\|sdpa' of LlamaForCausalLM is none known to keep packed samples apart.*: "
    "use a padding collator \\(DataCollatorForSeq2Seq, DataCollatorWithPadding\\)$",
    "positions": "DataCollatorWithFlattening\\(return_position_ids=False\\).*set return_position_ids=True",
    "cache": "use_cache=True turns off transformers' masks.*set use_cache=False$",
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_keeps_a_flattened_rows_samples_together_is_refused_in_one_line(case, tmp_path):
    with pytest.raises(ValueError, match=f"^AtteNTTrainer: {REFUSED[case]}") as error:
        AtteNTTrainer(
            model=paged_llama() if case == "attention" else tiny_llama(),
            args=training_args(tmp_path, use_cache=case == "cache"),
            train_dataset=ITEMS,
            data_collator=DataCollatorWithFlattening(return_position_ids=case != "positions"),
            selection=SelectionConfig(preset="llm"),
        )
    assert "\n" not in str(error.value)
    # method full is Trainer's own run: nothing refused
    AtteNTTrainer(
        model=paged_llama(),
        args=training_args(tmp_path, use_cache=True),
        train_dataset=ITEMS,
        data_collator=DataCollatorWithFlattening(return_position_ids=False),
        selection=SelectionConfig(method="full"),
    )
