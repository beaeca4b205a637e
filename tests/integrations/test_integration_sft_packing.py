"""AtteNTSFTTrainer with ``packing=True`` and ``padding_free=True`` under a selecting method: each batch of picked
samples is one padding-free row, each sample's loss its own tokens' terms of it; the run picks the unpacked run's
subsets, epoch by epoch, and scores its samples as it does (so does a DataCollatorWithFlattening of one's own). What batch-level packing cannot follow is refused in one
line before training.

Learning rate 1e-2 (the tests' own): the tiny Llama has no dropout, so the packed and the unpacked runs differ by
float rounding only. (A model with dropout draws other dropout masks for a packed row's other shape: its losses, and
so its scores, then differ by the dropout, about 1e-2 for GPT-2's default 0.1.)"""

from __future__ import annotations

import pytest
import torch
from attent.selection.config import SelectionConfig
from transformers import LlamaConfig, LlamaForCausalLM

from tests.helpers.hf_tiny import TINY_LLAMA, losses_of, training_settings

# The largest relative difference of a sample's score (at every epoch's start and at the end) and of a logged loss,
# packed against unpacked: measured 1.9e-7 on this CPU (AMD EPYC, AVX-512; presets llm and vit, packing and
# padding_free), 1.8e-7 under ATEN_CPU_CAPABILITY=avx2: float32 rounding. Some ten times that:
SCORES_RELATIVE = 2e-6
SAMPLES = 12


@pytest.fixture(scope="module")
def tokenizer():
    from attent.tasks.llm.model import resolve_checkpoint
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_checkpoint("smollm2-135m-instruct"))


def items(n: int = SAMPLES) -> list[dict]:
    return [
        {"prompt": f"Question {i}: what is {i} plus {i}?", "completion": f" {i} plus {i} is {2 * i}{'!' * (i % 4)}."}
        for i in range(n)
    ]


def tiny_llama(vocab: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, **{**TINY_LLAMA, "max_position_embeddings": 128}))


def sft_trainer(
    folder, tokenizer, selection: SelectionConfig, model=None, trainer_kwargs=None, record=True, **overrides
):
    import datasets
    from attent.integrations.huggingface_trl import AtteNTSFTTrainer
    from trl import SFTConfig

    class Recording(AtteNTSFTTrainer):
        """Notes each epoch's subset and its scores as it starts (the last epoch's scores at the end), and the shape
        of each training batch."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.subsets, self.scores, self.batches = {}, {}, []

        def training_step(self, model, inputs, num_items_in_batch=None):
            epoch = self.selector.epoch
            if epoch not in self.subsets:
                self.subsets[epoch], self.scores[epoch] = self.selector.subset.tolist(), self.selector.scores.clone()
            self.batches.append((tuple(inputs["input_ids"].shape), "attention_mask" in inputs))
            return super().training_step(model, inputs, num_items_in_batch)

    config = SFTConfig(**training_settings(folder, num_train_epochs=3), bf16=False, max_length=64, **overrides)
    return (Recording if record else AtteNTSFTTrainer)(
        model=model or tiny_llama(len(tokenizer)),
        args=config,
        train_dataset=datasets.Dataset.from_list(items()),
        processing_class=tokenizer,
        selection=selection,
        **(trainer_kwargs or {}),
    )


def trained(folder, tokenizer, preset: str, **overrides):
    trainer = sft_trainer(folder, tokenizer, SelectionConfig(preset=preset), **overrides)
    trainer.train()
    trainer.scores["end"] = trainer.selector.scores.clone()
    return trainer


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory, tokenizer):
    return trained(tmp_path_factory.mktemp("unpacked"), tokenizer, "llm")


def assert_same_selection(packed, unpacked) -> None:
    """The same subsets epoch by epoch, the scores within the measured tolerance, every batch one padding-free row."""
    assert packed.subsets == unpacked.subsets and len(packed.subsets) == 3
    assert any(len(subset) < SAMPLES for subset in unpacked.subsets.values())  # something was left out
    assert packed.scores.keys() == unpacked.scores.keys()
    for epoch, want in unpacked.scores.items():
        got = packed.scores[epoch]
        assert torch.equal(got.isnan(), want.isnan()), epoch
        assert torch.allclose(got.nan_to_num(), want.nan_to_num(), rtol=SCORES_RELATIVE, atol=0), epoch
    assert all(shape[0] == 1 and not masked for shape, masked in packed.batches)
    assert all(masked for shape, masked in unpacked.batches)
    assert losses_of(packed) == pytest.approx(losses_of(unpacked), rel=SCORES_RELATIVE)


def test_packing_picks_the_unpacked_runs_subsets(tmp_path, tokenizer, unpacked):
    """packing=True: the picked samples of each batch packed into one row; evaluation as TRL packs it."""
    import datasets

    eval_set = datasets.Dataset.from_list(items(4))
    packed = trained(
        tmp_path, tokenizer, "llm", packing=True, eval_strategy="epoch", trainer_kwargs={"eval_dataset": eval_set}
    )
    assert_same_selection(packed, unpacked)
    assert packed.args.packing and not packed.args.padding_free and packed.args.eval_packing is None  # as given
    assert len(packed.train_dataset) == SAMPLES  # one sample a row
    assert len(packed.eval_dataset) < 4 and "seq_lengths" in packed.eval_dataset.column_names  # packed as TRL packs
    assert len([row for row in packed.state.log_history if "eval_loss" in row]) == 3


@pytest.mark.parametrize("multiple", [None, 16])
def test_padding_free_picks_the_unpacked_runs_subsets(multiple, tmp_path, tokenizer, unpacked):
    """pad_to_multiple_of pads the row with pad tokens at position 0, which TRL's cu_seq_lens counts as samples of
    one token each: they are no samples here."""
    packed = trained(tmp_path, tokenizer, "llm", padding_free=True, pad_to_multiple_of=multiple)
    assert_same_selection(packed, unpacked)
    assert all(shape[1] % (multiple or 1) == 0 for shape, _ in packed.batches)


def test_scoring_passes_score_packed_rows_as_unpacked_ones(tmp_path, tokenizer):
    """The vit preset's scoring passes collate their batches as training does: one padding-free row each."""
    packed = trained(tmp_path / "packed", tokenizer, "vit", padding_free=True)
    unpacked = trained(tmp_path / "unpacked", tokenizer, "vit")
    assert sum(row.get("samples_scored", 0) for row in packed.state.log_history) > 0
    assert_same_selection(packed, unpacked)


def test_a_flattening_collator_of_ones_own_is_split_by_sample(tmp_path, tokenizer, unpacked):
    """Without packing or padding_free, transformers' DataCollatorWithFlattening passed as the data_collator packs
    each batch into one row too (from the labels TRL builds, the prompt's -100), split as TRL's rows are."""
    from transformers import DataCollatorWithFlattening

    collator = {"data_collator": DataCollatorWithFlattening()}
    assert_same_selection(trained(tmp_path, tokenizer, "llm", trainer_kwargs=collator), unpacked)


def test_method_full_packs_the_dataset_as_trl_does(tmp_path, tokenizer):
    trainer = sft_trainer(tmp_path, tokenizer, SelectionConfig(method="full"), packing=True)
    assert not trainer.packs_batches
    assert len(trainer.train_dataset) < SAMPLES and "seq_lengths" in trainer.train_dataset.column_names


def own_collator(tokenizer):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id)


def slow_attention(vocab):
    model = tiny_llama(vocab)
    model.config._attn_implementation = "paged|sdpa"
    return model


@pytest.mark.parametrize(
    "case, knob, overrides, message",
    [
        (
            "wrapped",
            "packing",
            {"packing_strategy": "wrapped"},
            "packing_strategy='wrapped' cuts samples.*set packing_strategy='bfd'",
        ),
        (
            "collator",
            "padding_free",
            {},
            "padding_free=True packs each batch with TRL's padding-free collator.*drop data_collator",
        ),
        (
            "attention",
            "packing",
            {},
            "attn_implementation='paged\\|sdpa' of LlamaForCausalLM is none known to keep packed samples apart.*: set packing=False$",
        ),
    ],
)
def test_what_batch_packing_cannot_follow_is_refused_in_one_line(case, knob, overrides, message, tmp_path, tokenizer):
    kwargs = {"data_collator": own_collator(tokenizer)} if case == "collator" else {}
    model = slow_attention(len(tokenizer)) if case == "attention" else None
    with pytest.raises(ValueError, match=f"^AtteNTSFTTrainer: {message}") as error:
        sft_trainer(
            tmp_path,
            tokenizer,
            SelectionConfig(preset="llm"),
            model=model,
            trainer_kwargs=kwargs,
            record=False,
            **{knob: True},
            **overrides,
        )
    assert "\n" not in str(error.value)


def packed_hook(model, inputs):
    """A compute_per_sample_loss of padding-free rows: the model's logits split by ``packed``."""
    from attent.integrations import packed

    segments, samples = packed.batch_segments(inputs)
    logits = model(**{key: value for key, value in inputs.items() if key != "labels"}).logits
    return packed.packed_logit_sums(logits, inputs["labels"], segments, samples)


def test_compute_per_sample_loss_gets_the_packed_row_and_gives_each_samples_loss(tmp_path, tokenizer, unpacked):
    """The hook is passed the row (its labels -100 at each sample's first token, use_cache=False) and returns one
    loss per sample of it; from the full logits, the fused head's picks."""
    hooked = trained(
        tmp_path, tokenizer, "llm", padding_free=True, trainer_kwargs={"compute_per_sample_loss": packed_hook}
    )
    assert hooked.subsets == unpacked.subsets
    assert torch.allclose(hooked.scores["end"], unpacked.scores["end"], rtol=1e-5, atol=0)
