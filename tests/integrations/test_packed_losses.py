"""Per-sample losses of packed rows (``attent.integrations.packed``): the segments, the boundaries, and on tiny
random Llama, Qwen2 and GPT-2 (sdpa and eager attention, float32) each sample's loss from a packed row equals its
loss run alone, from the logits and from TRL's fused LM head.

transformers 5.24 keeps packed samples apart without flash attention for all three: their masks come from its
masking utilities, which read a new sample wherever a position is not the previous one plus 1, provided the batch
has no attention mask and no cache (``use_cache=False``; an all-ones mask or a cache turns the detection off, and
the samples then attend to the ones before them, as the last test shows)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attent.integrations import packed
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.helpers.hf_tiny import TINY_LLAMA

VOCAB = 128
# The largest relative difference of a sample's summed loss, packed against alone (4 samples a batch, from the
# logits and from TRL's fused head, every architecture and attention here): measured 1.7e-7 over 8 random batches
# on this CPU (AMD EPYC, AVX-512), the same under ATEN_CPU_CAPABILITY=avx2; about 1 ulp of float32, the packed
# row's other length reordering the reductions. Some six times that:
RELATIVE = 1e-6
ARCHITECTURES = ["llama", "qwen2", "gpt2"]
ATTENTION = ["sdpa", "eager"]


def tiny_model(name: str, attention: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "llama":
        config = LlamaConfig(vocab_size=VOCAB, **TINY_LLAMA)
        model = LlamaForCausalLM
    elif name == "qwen2":
        config = Qwen2Config(vocab_size=VOCAB, **TINY_LLAMA)
        model = Qwen2ForCausalLM
    else:
        config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0)
        config.eos_token_id = 0
        model = GPT2LMHeadModel
    config._attn_implementation = attention
    return model(config).eval()


def random_batch(seed: int, samples: int = 4) -> list[dict[str, torch.Tensor]]:
    """Samples of 3-12 random tokens, each with its prompt (its first 1-3 tokens) labelled -100."""
    g = torch.Generator().manual_seed(seed)
    batch = []
    for _ in range(samples):
        length = int(torch.randint(3, 13, (1,), generator=g))
        ids = torch.randint(1, VOCAB, (length,), generator=g)
        labels = ids.clone()
        labels[: int(torch.randint(1, 4, (1,), generator=g))] = -100
        batch.append({"input_ids": ids, "labels": labels})
    return batch


def packed_row(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The batch as TRL's padding-free collator flattens it (labels as the samples have them)."""
    return {
        "input_ids": torch.cat([item["input_ids"] for item in batch])[None],
        "labels": torch.cat([item["labels"] for item in batch])[None],
        "position_ids": torch.cat([torch.arange(len(item["input_ids"])) for item in batch])[None],
    }


def alone(model, item) -> tuple[float, int]:
    """(S, n) of one sample run alone, from its logits."""
    logits = model(input_ids=item["input_ids"][None], use_cache=False).logits[0, :-1]
    labels = item["labels"][1:]
    return float(F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")), int((labels != -100).sum())


def largest_difference(model, forward_sums, seeds=range(4)) -> float:
    """The largest relative difference of a sample's S, packed (``forward_sums(model, row)``) against alone; the
    counts must be equal."""
    worst = 0.0
    with torch.no_grad():
        for seed in seeds:
            batch = random_batch(seed)
            sums, counts = forward_sums(model, packed_row(batch))
            for i, item in enumerate(batch):
                want, count = alone(model, item)
                assert int(counts[i]) == count
                worst = max(worst, abs(float(sums[i]) - want) / abs(want))
    return worst


def from_logits(model, row):
    segments, samples = packed.segment_ids(row["position_ids"])
    logits = model(input_ids=row["input_ids"], position_ids=row["position_ids"], use_cache=False).logits
    return packed.packed_logit_sums(logits, row["labels"], segments, samples)


def from_fused_head(model, row):
    """TRL's fused LM head (-log_probs, label_mask) on the row, its labels masked at the boundaries first."""
    segments, samples = packed.segment_ids(row["position_ids"])
    labels = packed.mask_boundaries(row["labels"], segments)
    outputs = model(input_ids=row["input_ids"], position_ids=row["position_ids"], labels=labels, fused_lm_head=True)
    sums, counts = packed.packed_sums(-outputs.log_probs, outputs.label_mask, segments, samples)
    assert float(outputs.loss) == pytest.approx(float(sums.sum() / counts.sum()), rel=1e-6)  # check_split's test
    return sums, counts


# --- segments and boundaries --------------------------------------------------------------------------------
def test_segments_from_positions_and_from_cu_seq_lens_agree():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    segments, samples = packed.segment_ids(positions)
    assert segments.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2]] and samples == 3
    offsets = torch.tensor([0, 3, 5, 9], dtype=torch.int32)
    assert torch.equal(packed.segment_ids(positions, offsets)[0], segments)
    assert torch.equal(packed.segment_ids(cu_seq_lens=offsets)[0], segments)
    with pytest.raises(ValueError, match="disagree"):
        packed.segment_ids(positions, torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match="rise from 0"):
        packed.segment_ids(positions, torch.tensor([0, 3, 5]))
    with pytest.raises(ValueError, match="position_ids or cu_seq_lens"):
        packed.segment_ids()


def test_segments_of_several_rows_and_of_padded_rows():
    """TRL's dataset packing: several rows, each of several samples, numbered row by row; an unpacked batch is one
    sample per row; a position that does not follow on starts a sample as transformers reads it."""
    rows = torch.tensor([[0, 1, 0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 5, 6]])
    assert packed.segment_ids(rows)[0].tolist() == [[0, 0, 1, 1, 1], [2, 2, 2, 2, 2], [3, 3, 3, 4, 4]]
    assert packed.segment_ids(rows)[1] == 5
    # pad_to_multiple_of: TRL pads the row with pad tokens at position 0, each of which reads as a sample
    inputs = {
        "input_ids": torch.tensor([[7, 8, 9, 7, 9, 0, 0, 0]]),
        "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 0, 0]]),
    }
    inputs["cu_seq_lens_q"] = torch.tensor([0, 3, 5, 6, 7, 8], dtype=torch.int32)
    assert packed.batch_segments(inputs)[1] == 5
    segments, samples = packed.batch_segments(inputs, pad_token_id=0)
    assert segments.tolist() == [[0, 0, 0, 1, 1, -1, -1, -1]] and samples == 2
    assert packed.batch_segments({**inputs, "attention_mask": torch.ones(1, 8)}) is None  # padded: one per row


def test_no_loss_term_crosses_a_boundary_whatever_the_labels_say():
    """The term of a sample's last token predicts the next sample's first token: dropped, labelled or not."""
    segments, samples = packed.segment_ids(
        torch.tensor([[0, 1, 2, 0, 1, 0, 0]]), padding=torch.tensor([[0, 0, 0, 0, 0, 0, 1]]).bool()
    )
    assert samples == 3
    terms = torch.tensor([[1.0, 2.0, 4.0, 8.0, 16.0, 32.0]], requires_grad=True)
    sums, counts = packed.packed_sums(terms, torch.ones(1, 6, dtype=torch.bool), segments, samples)
    assert sums.tolist() == [3.0, 8.0, 0.0] and counts.tolist() == [2, 1, 0]
    sums.sum().backward()
    assert terms.grad.tolist() == [[1.0, 1.0, 0.0, 1.0, 0.0, 0.0]]
    labels = packed.mask_boundaries(torch.arange(7)[None], segments)
    assert labels.tolist() == [[-100, 1, 2, -100, 4, -100, -100]]
    with pytest.raises(ValueError, match=r"need \[1, 6\] terms"):
        packed.packed_sums(terms[:, :5], torch.ones(1, 5, dtype=torch.bool), segments, samples)


# --- tiny models: packed equals alone -------------------------------------------------------------------------
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_samples_loss_packed_is_its_loss_alone(name, attention):
    model = tiny_model(name, attention)
    assert packed.attention_problem(model) is None
    assert largest_difference(model, from_logits) <= RELATIVE


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_trls_fused_head_on_a_packed_row_gives_each_samples_loss_alone(name):
    from trl.trainer.utils import add_fused_lm_head

    model = tiny_model(name, "sdpa")
    add_fused_lm_head(model)
    assert largest_difference(model, from_fused_head, seeds=range(2)) <= RELATIVE


def test_without_packed_detection_the_samples_attend_across_and_the_losses_differ():
    """The check above can fail: an all-ones attention mask turns transformers' packed-row detection off."""

    def with_mask(model, row):
        segments, samples = packed.segment_ids(row["position_ids"])
        mask = torch.ones_like(row["input_ids"])
        logits = model(
            input_ids=row["input_ids"], position_ids=row["position_ids"], attention_mask=mask, use_cache=False
        ).logits
        return packed.packed_logit_sums(logits, row["labels"], segments, samples)

    assert largest_difference(tiny_model("llama", "sdpa"), with_mask, seeds=range(1)) > 100 * RELATIVE


def test_attention_that_does_not_keep_packed_samples_apart_is_named():
    class Recurrent(torch.nn.Module):  # a model whose module builds no masks with transformers' masking utilities
        config = type("Config", (), {"_attn_implementation": "sdpa"})()

    assert packed.attention_problem(Recurrent()).startswith(
        "Recurrent builds its attention masks outside transformers' masking utilities, so under "
        "attn_implementation='sdpa' each sample"
    )
    Recurrent.config._attn_implementation = "flash_attention_2"  # varlen kernels read position_ids themselves
    assert packed.attention_problem(Recurrent()) is None
    model = tiny_model("llama", "sdpa")
    model.config._attn_implementation = "paged|sdpa"
    assert "attn_implementation='paged|sdpa' of LlamaForCausalLM is none known" in packed.attention_problem(model)

    class Subclass(LlamaForCausalLM):  # in a module of its own: its base's builds the masks
        pass

    assert packed.attention_problem(Subclass(model.config.__class__(vocab_size=VOCAB, **TINY_LLAMA))) is None
