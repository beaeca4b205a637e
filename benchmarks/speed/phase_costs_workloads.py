"""The workloads of benchmarks/speed/phase_costs.py and what its arms share: the sizes, the selection every
fit runs, a ViT on sklearn's digits (the engine's vision task: its dataset, model and loss) and a
random-init Llama on random token rows (with a word-level tokenizer built here for TRL, no hub), the sums
one fit measures and a clock that synchronises a CUDA device at its ends."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

# Every epoch scores all samples, then re-selects half of them: each fit times two scoring passes,
# two re-selections and a half-sized training epoch per epoch.
SELECTION = {"preset": "vit", "ratio": {"kind": "fixed", "start": 0.5}, "interval": {"kind": "fixed", "start": 1}}
EPOCHS = 2
GRAD_CLIP = 1.0  # the engine's and Trainer's default; the plain loop and Lightning clip alike

# Per size: the ViT on digits (images upsampled to img_size) and the Llama on random token rows.
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "vit": dict(train_limit=48, img_size=8, model={"preset": "vit_tiny_cpu", "depth": 2}, batch=16),
        "lm": dict(samples=24, seq=32, vocab=128, hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, batch=8),
    },
    "cpu": {
        "vit": dict(train_limit=None, img_size=16, model={"preset": "vit_tiny_cpu"}, batch=64),
        "lm": dict(samples=64, seq=128, vocab=4096, hidden=256, layers=4, heads=4, kv_heads=4, ffn=688, batch=8),
    },
    "300m": {  # Llama of 1024 x 24 layers and 32k vocabulary: 349M parameters
        "vit": dict(
            train_limit=None, img_size=32, model={"preset": "vit_base_patch16_224", "patch_size": 4}, batch=128
        ),
        "lm": dict(samples=512, seq=512, vocab=32000, hidden=1024, layers=24, heads=16, kv_heads=8, ffn=2816, batch=8),
    },
}


@dataclass
class Phases:
    """What one fit measured, summed over its epochs."""

    train_s: float = 0.0
    trained: int = 0
    score_s: float = 0.0
    scored: int = 0
    scoring_batches: list[int] = field(default_factory=list)  # the largest batch of each scoring pass
    reported_scoring_batch: int = 0  # Selector.scoring.batch_size_for(train_batch_size) after the fit
    selection_s: float = 0.0
    reselections: int = 0
    pool: int = 0  # samples a re-selection chooses from
    load_s: float = 0.0  # the training loader iterated alone
    loaded: int = 0
    score_load_s: float = 0.0  # the scoring pass's loader iterated alone
    score_loaded: int = 0
    train_batch: int = 0


class Clock:
    """Seconds summed over ``with clock:`` blocks, a CUDA device synchronised at both ends."""

    def __init__(self, device: torch.device):
        self.seconds, self.cuda = 0.0, device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __enter__(self):
        self.sync()
        self._start = time.perf_counter()

    def __exit__(self, *exc):
        self.sync()
        self.seconds += time.perf_counter() - self._start


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


# --- workloads --------------------------------------------------------------------------------------------
class Workload:
    """A dataset, its collate, a model builder and the per-sample loss every arm trains it with."""

    name: str
    batch: int
    lr: float

    def per_sample_loss(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        raise NotImplementedError


class VitWorkload(Workload):
    """The engine's vision task on digits: the other arms take its dataset, model and loss."""

    name, lr = "vit", 1e-3

    def __init__(self, spec: dict[str, Any], device: torch.device):
        from attent.experiment.schema import build_experiment
        from attent.tasks.registry import build_task

        self.spec, self.device, self.batch = spec, device, spec["batch"]
        task = {
            "name": "vision",
            "dataset": "digits",
            "test_fraction": 0.05,  # 1,707 training images of sklearn's 1,797
            "img_size": spec["img_size"],
            "train_limit": spec["train_limit"],
            "test_limit": 16,
            "model": spec["model"],
        }
        train = {"batch_size": self.batch, "epochs": EPOCHS, "precision": "bf16" if device.type == "cuda" else "fp32"}
        self.config = build_experiment(
            {"name": "phase_costs", "seed": 0, "task": task, "selection": SELECTION, "train": train}
        )
        self.task = build_task(self.config.task, seed=0)
        self.dataset = self.task.train_dataset()
        self.collate = self.task.collate

    def build_model(self) -> torch.nn.Module:
        return self.task.build_model().to(self.device)

    def per_sample_loss(self, model, batch):
        with autocast(self.device):
            return self.task.per_sample_loss(model, batch)


def token_rows(spec: dict[str, Any], seed: int = 0) -> list[dict[str, list[int]]]:
    """Random token rows of ``seq`` tokens (ids from 2: 0 pads, 1 ends), the first quarter a prompt
    (labels -100), the rest its completion."""
    g = torch.Generator().manual_seed(seed)
    prompt = spec["seq"] // 4
    rows = torch.randint(2, spec["vocab"], (spec["samples"], spec["seq"]), generator=g).tolist()
    return [{"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]} for ids in rows]


def pad_collate(items: list[dict]) -> dict[str, torch.Tensor]:
    """Right-padded: pad token 0, attention mask 0, label -100."""
    width = max(len(item["input_ids"]) for item in items)

    def padded(key, fill):
        return torch.tensor([item[key] + [fill] * (width - len(item[key])) for item in items])

    mask = torch.tensor([[1] * len(item["input_ids"]) + [0] * (width - len(item["input_ids"])) for item in items])
    return {"input_ids": padded("input_ids", 0), "labels": padded("labels", -100), "attention_mask": mask}


class LmWorkload(Workload):
    """A random-init Llama of the size's shape on random token rows."""

    name, lr = "lm", 3e-4

    def __init__(self, spec: dict[str, Any], device: torch.device):
        self.spec, self.device, self.batch = spec, device, spec["batch"]
        self.dataset = token_rows(spec)
        self.collate = pad_collate

    def build_model(self) -> torch.nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        s = self.spec
        config = LlamaConfig(
            vocab_size=s["vocab"],
            hidden_size=s["hidden"],
            intermediate_size=s["ffn"],
            num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"],
            num_key_value_heads=s["kv_heads"],
            max_position_embeddings=s["seq"],
            pad_token_id=0,
            eos_token_id=1,
        )
        torch.manual_seed(0)
        with self.device:  # initialised where it trains: no CPU copy of a 349M model to build and move per fit
            return LlamaForCausalLM(config)

    def per_sample_loss(self, model, batch):
        """Each row's mean next-token cross-entropy over its labelled tokens."""
        device = next(model.parameters()).device
        ids, mask, labels = (batch[k].to(device) for k in ("input_ids", "attention_mask", "labels"))
        with autocast(self.device):
            logits = model(input_ids=ids, attention_mask=mask).logits
        terms = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels[:, 1:], reduction="none")
        return terms.sum(1) / (labels[:, 1:] != -100).sum(1).clamp(min=1)

    def sft_rows(self) -> list[dict[str, str]]:
        """The same rows as prompt-completion text for TRL, one word per token (``word_tokenizer``)."""
        rows = []
        for row in self.dataset:
            prompt = sum(1 for label in row["labels"] if label == -100)
            words = [f"t{i}" for i in row["input_ids"]]
            rows.append({"prompt": " ".join(words[:prompt]), "completion": " " + " ".join(words[prompt:-1])})
        return rows  # TRL ends each completion with EOS: as long as the token rows


def word_tokenizer(vocab: int):
    """A word-level tokenizer built here (no hub): ``<pad>`` 0, ``<eos>`` 1, ``t<i>`` i."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, vocab)}}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")


def not_run(integration: str, workload: str) -> str | None:
    """Why an integration has no row for a workload here (None: it runs)."""
    import importlib.util

    if integration == "engine" and workload == "lm":
        return "the engine's llm task loads a pretrained checkpoint (the hub or a converted SmolLM2): not random-init"
    if integration == "AtteNTSFTTrainer" and workload == "vit":
        return "TRL's SFTTrainer trains language models on text"
    for module, name in (("trl", "AtteNTSFTTrainer"), ("lightning", "Lightning")):
        if integration == name and importlib.util.find_spec(module) is None:
            return f"`{module}` is not installed"
    return None


def per_sample(phases: Phases) -> dict[str, float]:
    """A fit's costs per sample (selection: per re-selection and per sample of its pool)."""
    ratio = lambda a, b: a / b if b else math.nan  # noqa: E731
    train = ratio(phases.train_s, phases.trained)
    score = ratio(phases.score_s, phases.scored)
    selection = ratio(phases.selection_s, phases.reselections)
    score_load = ratio(phases.score_load_s, phases.score_loaded)
    return {
        "train_s_per_sample": train,
        "score_s_per_sample": score,
        "load_s_per_sample": ratio(phases.load_s, phases.loaded),
        "selection_s_per_reselection": selection,
        "selection_s_per_sample": ratio(selection, phases.pool),
        "score_load_s_per_sample": score_load,
        "score_over_train": ratio(score, train),
        # the scoring forward without its loading, against the training step (which excludes it)
        "forward_over_train": ratio(score - score_load, train),
    }
