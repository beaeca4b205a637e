"""The Hugging Face integration tests' tiny Llama (``TINY_LLAMA``: its config but the vocabulary), its synthetic
token data (sample i's first token is 50 + i), and an AtteNTTrainer that records, per epoch, the subset and the
samples its training steps got."""

from __future__ import annotations

import torch
from attent.integrations.huggingface import AtteNTTrainer
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from tests.helpers.paths import SHARED

N, FIRST_TOKEN, VOCAB = 40, 50, 256
GSM8K = SHARED / "datasets" / "gsm8k" / "train.jsonl"
# The tiny random Llama's config but its vocabulary (2 layers, 32 wide, grouped-query attention), built as
# ``LlamaConfig(vocab_size=..., **TINY_LLAMA)`` here and by the architecture and custom-loss tests.
TINY_LLAMA = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


# --- tiny data and model ---------------------------------------------------------------------------------
def samples(n: int = N, seed: int = 0) -> list[dict]:
    """Sample i: token 50 + i, then a prompt and a response of 2-6 random tokens each; labels
    -100 on the prompt."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        prompt, response = (int(x) for x in torch.randint(2, 7, (2,), generator=g))
        ids = [FIRST_TOKEN + i] + torch.randint(1, FIRST_TOKEN, (prompt - 1 + response,), generator=g).tolist()
        items.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return items


def collate(items: list[dict]) -> dict[str, torch.Tensor]:
    """Right-padded: pad token 0, attention mask 0, label -100."""
    width = max(len(item["input_ids"]) for item in items)

    def padded(rows, fill):
        return torch.tensor([row + [fill] * (width - len(row)) for row in rows])

    return {
        "input_ids": padded([item["input_ids"] for item in items], 0),
        "labels": padded([item["labels"] for item in items], -100),
        "attention_mask": padded([[1] * len(item["input_ids"]) for item in items], 0),
    }


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, **TINY_LLAMA))


def training_settings(output_dir, **overrides) -> dict:
    """The tests' Trainer settings (TrainingArguments' keywords; TRL's SFTConfig takes them too)."""
    base = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_train_epochs=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    return {**base, **overrides}


def training_args(output_dir, **overrides) -> TrainingArguments:
    return TrainingArguments(**training_settings(output_dir, **overrides))


class RecordingTrainer(AtteNTTrainer):
    """AtteNTTrainer that notes, per epoch, the subset and the samples its training steps got
    (read from the batches' first tokens, i.e. after the loader and accelerate)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trained: dict[int, list[int]] = {}
        self.subsets: dict[int, list[int]] = {}

    def training_step(self, model, inputs, num_items_in_batch=None):
        epoch = self.selector.epoch
        self.trained.setdefault(epoch, []).extend((inputs["input_ids"][:, 0] - FIRST_TOKEN).tolist())
        self.subsets[epoch] = self.selector.subset.tolist()
        return super().training_step(model, inputs, num_items_in_batch)


def losses_of(trainer: Trainer, after: int = 0) -> list[float]:
    """The logged training loss of each step after step ``after`` (a resumed run's history holds
    the checkpoint's rows too)."""
    return [row["loss"] for row in trainer.state.log_history if "loss" in row and row["step"] > after]


def flat_weights(model) -> torch.Tensor:
    """All of ``model``'s parameters as one flat tensor, to compare two trainings' results."""
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def selection_rows(trainer: Trainer, after: int = 0) -> list[dict]:
    return [row for row in trainer.state.log_history if "subset_checksum" in row and row["step"] > after]


CONFIGS = {
    "vit": dict(preset="vit"),  # scoring passes, soft, growing ratio and interval
    "llm": dict(preset="llm"),  # scores from the training forwards only, hard
    "random": dict(strategy="random", ratio={"kind": "cosine"}),
}
