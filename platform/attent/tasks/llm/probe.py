"""What `attent plan` counts of an LLM run: the base model's architecture with the run's adapters, on
token sequences of the configured length, and the sizes of its training set and evaluations."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from attent.tasks.llm.config import LLMTaskConfig
from attent.tasks.llm.data import IGNORE_INDEX, SOURCES, draw_problems
from attent.tasks.llm.loss import causal_lm, final_hidden_states, response_token_loss
from attent.tasks.llm.model import DTYPES, add_lora, checkpoint_activations, model_config
from attent.tasks.llm.sources import local_file
from attent.tasks.task import Batch, Decoding, Probe


def llm_probe(task_class, config: LLMTaskConfig, length: int | None = None) -> Probe:
    """The base model's architecture (``model_config``: no weights, no network) with the run's
    LoRA adapters and gradient checkpointing, on sequences of ``length`` random tokens (by
    default ``max_length``, an upper bound: ``resized`` gives the width batches are padded to,
    from ``lengths``), half prompt and half response. On the meta device the LM head's loss is
    counted over every position, a bound (the task's loss projects only the response tokens,
    whose positions the meta device cannot select); elsewhere the losses are the task's own."""
    from transformers import AutoModelForCausalLM

    task = task_class.__new__(task_class)  # its losses without its tokenizer or data
    task.config, task.seed = config, 0
    architecture = model_config(config.model)
    length, vocab = length or config.max_length, architecture.vocab_size

    def build(blocks: int | None = None) -> nn.Module:
        shape = architecture if blocks is None else with_blocks(architecture, blocks)
        model = AutoModelForCausalLM.from_config(shape, dtype=DTYPES[config.dtype])
        if config.gradient_checkpointing:
            checkpoint_activations(model)
        return add_lora(model, config.lora_r, config.lora_dropout)

    def batch(n: int, device: torch.device) -> Batch:
        ids = torch.randint(0, vocab, (n, length), device=device)
        labels = ids.clone()
        labels[:, : length // 2] = IGNORE_INDEX
        return {"index": torch.arange(n), "input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}

    def loss(model: nn.Module, b: Batch) -> torch.Tensor:
        if not b["input_ids"].is_meta:
            return task.per_sample_loss(model, b)
        # a causal mask of 4 dims, which Hugging Face takes as it is: from a 2-dim one (or none)
        # it reads values to decide whether it needs one, which the meta device has not
        n, t = b["input_ids"].shape
        causal = torch.ones(t, t, dtype=torch.bool, device=b["input_ids"].device).tril().expand(n, 1, t, t)
        hidden = final_hidden_states(model, b["input_ids"], causal)
        logits = causal_lm(model).get_output_embeddings()(hidden).float()
        return response_token_loss(logits, b["labels"])

    samples, assumed = llm_train_samples(config)
    evaluation = llm_evaluation(config)
    return Probe(
        build_model=build,
        batch=batch,
        train_loss=loss,
        score_loss=loss,
        sample=f"{length:,} tokens",
        train_samples=samples,
        eval_samples=evaluation[0],
        eval_forwards=evaluation[1],
        assumptions=assumed + evaluation[2],
        build_with_blocks=build,
        depth=architecture.num_hidden_layers,
        key=config.model_dump_json(include={"model", "dtype", "lora_r", "gradient_checkpointing", "loss_chunk_tokens"})
        + f"|{length}",
        workload="llm",
        lengths=lambda: llm_lengths(task_class, config),
        resized=lambda n: llm_probe(task_class, config, n),
        decoding=llm_decoding(config, architecture),
    )


def llm_lengths(task_class, config: LLMTaskConfig, draws: int = 2000) -> tuple[tuple[int, ...], str] | None:
    """The training examples' tokenized lengths as the loader gets them (the task's own template,
    tokenizer and truncation), ``draws`` of them at random, and where they come from; None where
    the data or the tokenizer is not here (the hub is never asked)."""
    try:
        dataset = _local_train_dataset(task_class, config)
    except (OSError, ValueError, ImportError):  # a tokenizer not here, offline
        return None
    if dataset is None or not len(dataset):
        return None
    count = len(dataset)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(0))[:draws].tolist()
    values = tuple(len(dataset[i]["input_ids"]) for i in order)
    return values, f"measured: {len(values):,} of its {count:,} examples tokenized"


def _local_train_dataset(task_class, config: LLMTaskConfig):
    """The task's training set where its file is on this machine (a named set's mirror under
    the data dir, or a dataset file), None otherwise: the hub is never asked."""
    if config.dataset in SOURCES:
        if local_file(config.resolved_data_dir(), SOURCES[config.dataset].local_stem) is None:
            return None
    elif not Path(config.dataset).expanduser().is_file():
        return None
    return task_class(config, seed=0).train_dataset()


def llm_decoding(config: LLMTaskConfig, architecture) -> Decoding | None:
    """What one evaluation's greedy generation decodes and reads (None without one)."""
    answers = llm_evaluation(config)[3]
    if not answers:
        return None
    width = DTYPES[config.dtype].itemsize
    heads = architecture.num_attention_heads
    kv_heads = getattr(architecture, "num_key_value_heads", None) or heads
    head_dim = getattr(architecture, "head_dim", None) or architecture.hidden_size // heads
    return Decoding(
        answers=answers,
        new_tokens=config.eval.max_new_tokens,
        batch=config.eval.eval_batch_size,
        bytes_per_parameter=width,
        kv_bytes_per_token=2 * architecture.num_hidden_layers * kv_heads * head_dim * width,
    )


def llm_evaluation(config: LLMTaskConfig) -> tuple[int, float, tuple[str, ...], int]:
    """(samples, forwards per sample, assumptions, answers generated) of one evaluation: each
    generated answer's prompt a forward of half a sample (the probe's prompt share; its decoded
    tokens are priced apart, ``llm_decoding``), gsm8k_loss one forward per solution."""
    from attent.tasks.llm.evaluation.suites import CHAMP, GSM8K, MATH, MBPP, HumanEval

    cfg, sizes = config.eval, {suite.name: suite.size for suite in (GSM8K, MATH, CHAMP, HumanEval, MBPP)}
    generated, forwarded, assumed = 0, 0, ()
    for name in cfg.suites:
        if name == "gsm8k_loss":
            forwarded += cfg.response_loss_limit or GSM8K.size
        elif name == "mt_bench":
            generated += 2 * 80  # two turns of its 80 questions
            assumed = ("MT-Bench's judge model is not priced",)
        else:
            generated += min(cfg.eval_limit or sizes[name], sizes[name])
    samples = generated + forwarded
    return samples, (generated * 0.5 + forwarded) / max(samples, 1), assumed, generated


def llm_train_samples(config: LLMTaskConfig) -> tuple[int | None, tuple[str, ...]]:
    """(the training set's size, what it assumes) for a named set its card counts, after the
    validation hold-out and ``train_limit`` as ``draw_problems`` takes them; None otherwise."""
    source = SOURCES.get(config.dataset)
    if source is None or source.records is None:
        return None, ()
    train, _ = draw_problems(
        source.records, train_limit=config.train_limit, val_limit=config.val_limit, seed=0, keep_first=True
    )
    bound = source.records_bound and len(train) == source.records - (config.val_limit or 0)
    return len(train), (
        (f"{config.dataset}: {source.records:,} rows, its card's count before filtering (an upper bound)",)
        if bound
        else ()
    )


def with_blocks(architecture, blocks: int):
    """The architecture with ``blocks`` decoder layers (every layer alike: the same attention)."""
    shape = copy.deepcopy(architecture)
    shape.num_hidden_layers = blocks
    if getattr(shape, "layer_types", None):  # per-layer attention kinds: the first's for each
        shape.layer_types = shape.layer_types[:1] * blocks
    return shape
