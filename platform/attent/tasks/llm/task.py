"""LoRA instruction fine-tuning of a causal LM, scored per sample for AtteNT."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from attent.contract import DATASET_TRAIN, DATASET_VALIDATION, DatasetDescription
from attent.integrations.packed import attention_problem, varlen_attention
from attent.tasks.llm.config import LLMTaskConfig
from attent.tasks.llm.data import (
    IGNORE_INDEX,
    SOURCES,
    Example,
    SFTDataset,
    collate_right_padded,
    draw_problems,
    example_source,
    fingerprint,
    record_converter,
    seeded_sample,
    sft_item,
    training_source,
)
from attent.tasks.llm.evaluation.mt_bench import HFJudge, Judge, Question, load_mt_bench_questions, run_mt_bench
from attent.tasks.llm.evaluation.response_loss import run_response_loss
from attent.tasks.llm.evaluation.suites import EvalSuite, build_suite, load_gsm8k_test, run_suite
from attent.tasks.llm.loss import response_loss, response_token_loss
from attent.tasks.llm.model import (
    DTYPES,
    add_lora,
    checkpoint_activations,
    load_causal_lm,
    load_tokenizer,
    resolve_checkpoint,
)
from attent.tasks.llm.prompts import encode_exchanges, encode_prompt, resolve_style
from attent.tasks.task import AdapterModel, Batch, OptimizerSpec, Probe, Task, data_seed


class LLMTask(Task):
    """LoRA instruction fine-tuning; each sample's mean response-token loss is the training loss
    and the AtteNT score.

    ``seed`` fixes the LoRA adapters' initialisation (the base weights are pretrained) and, unless
    ``split_seed`` fixes them, which problems train, validate and test. ``judge``
    (any prompt -> judgement text callable) rates MT-Bench answers instead of the configured
    ``eval.mt_bench_judge`` model.
    """

    name = "llm"

    def __init__(self, config: LLMTaskConfig, seed: int, *, judge: Judge | None = None):
        self.config, self.seed = config, seed
        self.tokenizer = load_tokenizer(config.model)
        self.style = resolve_style(self.tokenizer, config.prompt_style)
        self.data_dir = config.resolved_data_dir()
        self.judge = judge
        self.data_seed = data_seed(config.split_seed, seed)
        self._train: SFTDataset | None = None
        self._val: SFTDataset | None = None
        self._suites: dict[str, EvalSuite] = {}
        self._mt_bench_questions: list[Question] | None = None
        self._gsm8k_test: SFTDataset | None = None

    # --- prompts ----------------------------------------------------------------------------
    def _templated(self, conversation: list[str]) -> list[str]:
        """User turns (even positions) put through ``instruction_template``."""
        template = self.config.instruction_template
        return [template.replace("{prompt}", text) if i % 2 == 0 else text for i, text in enumerate(conversation)]

    def encode_prompt(self, conversation: list[str]) -> list[int]:
        """Prompt ids for a conversation ending with a user turn; training and evaluation
        prompts go through this same function."""
        return encode_prompt(self.tokenizer, self.style, self._templated(conversation))

    def encode_example(self, example: Example) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, reply ids) of each exchange of one training example (one, unless it is a
        conversation: ``Example.earlier``)."""
        return encode_exchanges(self.tokenizer, self.style, self._templated(example.conversation()))

    # --- data -------------------------------------------------------------------------------
    def train_dataset(self) -> Dataset:
        if self._train is None:
            self._load_problems()
        return self._train

    def validation_dataset(self) -> SFTDataset | None:
        """The ``val_limit`` problems held out of the training set (None without ``val_limit``)."""
        if self._train is None:
            self._load_problems()
        return self._val

    def _load_problems(self) -> None:
        """The training set's problems split into training and validation (``draw_problems``)."""
        cfg = self.config
        records, to_example = example_source(
            cfg.dataset, folder=self.data_dir, prompt_field=cfg.prompt_field, response_field=cfg.response_field
        )
        train, val = draw_problems(
            len(records),
            train_limit=cfg.train_limit,
            val_limit=cfg.val_limit,
            seed=self.data_seed,
            keep_first=cfg.split_seed is not None,
        )
        self._train = SFTDataset([to_example(records[i]) for i in train], self.encode_example, cfg.max_length)
        if val:
            self._val = SFTDataset([to_example(records[i]) for i in val], self.encode_example, cfg.max_length)

    def stream_item(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        """A record of the training stream (a JSONL or Parquet row, ``stream:``) as a training
        item: the dataset's record made an example (a named set's own conversion, else
        ``prompt_field`` / ``response_field``), tokenised as the map-style items are."""
        cfg = self.config
        example = record_converter(cfg.dataset, cfg.prompt_field, cfg.response_field)(row)
        return sft_item(self.encode_example(example), cfg.max_length, index)

    def collate(self, items: list[dict[str, Any]]) -> Batch:
        return collate_right_padded(items, self.tokenizer.pad_token_id)

    def describe_data(self) -> list[DatasetDescription]:
        """The training examples (after ``train_limit``) and the validation ones (``val_limit``):
        a named set's mirror file or hub name, or the dataset file."""
        dataset = self.config.dataset
        source, source_type = training_source(dataset, self.data_dir)
        name = dataset if dataset in SOURCES else Path(dataset).stem
        splits = (
            ("train", DATASET_TRAIN, self.train_dataset()),
            ("val", DATASET_VALIDATION, self.validation_dataset()),
        )
        return [
            DatasetDescription(
                f"{name}-{split}", source, context, len(examples.examples), fingerprint(examples.examples), source_type
            )
            for split, context, examples in splits
            if examples is not None
        ]

    def group_labels(self) -> torch.Tensor | None:
        """MetaMathQA's augmentation type (GSM_Rephrased, MATH_SV, ...) as group ids."""
        groups = [example.group for example in self.train_dataset().examples]
        if not any(groups):
            return None
        ids = {group: i for i, group in enumerate(sorted(set(groups)))}
        return torch.tensor([ids[group] for group in groups])

    # --- model ------------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        # Seeded locally: the same seed gives the same adapters (and any weights a checkpoint
        # lacks) whatever ran before.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = load_causal_lm(self.config.model, DTYPES[self.config.dtype])
            if self.config.gradient_checkpointing:
                checkpoint_activations(model)
            return add_lora(model, self.config.lora_r, self.config.lora_dropout)

    @classmethod
    def prepare_rehearsal(cls, config: LLMTaskConfig, folder: Path) -> dict[str, Any]:
        """A randomly initialised causal LM of ``config.model``'s architecture at the stand-in size,
        with the model's own tokenizer, saved under ``folder``: the run's ``task.model``; the same of
        its MT-Bench judge where it scores MT-Bench."""
        from attent.tasks.llm.standin import standin_checkpoint

        fields: dict[str, Any] = {"model": str(standin_checkpoint(config.model, Path(folder)))}
        if "mt_bench" in config.eval.suites and config.eval.mt_bench_judge:
            judge = str(standin_checkpoint(config.eval.mt_bench_judge, Path(folder)))
            fields["eval"] = config.eval.model_copy(update={"mt_bench_judge": judge})
        return fields

    @classmethod
    def probe(cls, config: LLMTaskConfig) -> Probe:
        from attent.tasks.llm.probe import llm_probe

        return llm_probe(cls, config)

    def model_to_log(self, model: nn.Module) -> AdapterModel:
        """The LoRA adapter and the tokenizer; the base model by reference: its local folder (the
        converted SmolLM2 or a checkpoint folder), else its hub name."""
        base = Path(resolve_checkpoint(self.config.model))
        return AdapterModel(model, self.tokenizer, str(base) if base.is_dir() else None)

    def load_weights(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """A Ray checkpoint's adapters (named as the model names them), or a logged adapter (named
        as peft saves it, without the adapter's name) through peft."""
        if set(state) <= set(model.state_dict()):
            return super().load_weights(model, state)
        from peft import set_peft_model_state_dict

        loaded = set_peft_model_state_dict(model, state)
        adapters_missing = [k for k in loaded.missing_keys if "lora_" in k]
        if loaded.unexpected_keys or adapters_missing:
            raise ValueError(
                f"the initial adapter does not fit this model (lora_r={self.config.lora_r}, "
                f"{self.config.model}): unexpected {loaded.unexpected_keys[:4]}, missing "
                f"{adapters_missing[:4]}"
            )

    def optimizer_spec(self) -> OptimizerSpec:
        # MetaMath / the paper's LoRA recipe: AdamW 2e-5, no weight decay, cosine with 3% warmup,
        # global batch 128 (reached by gradient accumulation). The optimiser sees only the LoRA
        # adapters (the base is frozen), all of them matrices, so the default parameter groups
        # put them all in the decayed group (which decays by 0.0 unless train.weight_decay says).
        return OptimizerSpec(
            lr=2e-5, weight_decay=0.0, betas=(0.9, 0.999), schedule="cosine", warmup_ratio=0.03, global_batch_size=128
        )

    # --- loss and evaluation ----------------------------------------------------------------
    def score_of(self, losses: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``response_mean``: the losses themselves. ``padded_row_mean``: the released AtteNT code's,
        each sample's summed response-token loss over the batch's padded width (its row of
        next-token losses, zeros off the response, averaged)."""
        if self.config.score == "response_mean":
            return losses
        targets = batch["labels"][:, 1:]
        return losses * (targets != IGNORE_INDEX).sum(dim=1) / targets.shape[1]

    def per_sample_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        # = response_token_loss(model(...).logits, labels), without full-vocabulary logits
        cfg = self.config
        return response_loss(
            model, batch, chunk_tokens=cfg.loss_chunk_tokens, fused=cfg.fused_loss, packed=self.packs(model)
        )

    def packs(self, model: nn.Module) -> bool:
        """Whether a batch runs as one padding-free row: ``packing: on`` where the model's
        attention keeps packed samples apart, ``auto`` under a varlen flash kernel alone.

        Raises:
            ValueError: ``packing: on`` for a model whose attention would mix packed samples.
        """
        if self.config.packing == "off":
            return False
        packs = self.__dict__.setdefault("_packs", {})  # model id -> whether it packs (a probe's task has no __init__)
        if id(model) not in packs:
            problem = attention_problem(model)
            if problem and self.config.packing == "on":
                raise ValueError(f"task.packing: on cannot keep packed samples apart: {problem}; set task.packing=off")
            packs[id(model)] = problem is None and (self.config.packing == "on" or varlen_attention(model))
        return packs[id(model)]

    def kernel_output(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The mean log-likelihood of the sample's response tokens (minus its loss), through
        the LoRA adapters, the only trainable parameters. Full logits and no attention mask:
        ``response_loss`` selects tokens with ``nonzero`` and the mask makes Hugging Face branch
        on data, neither of which vmap allows; batches are right-padded, so causal attention
        never lets a real token see padding and the value is the same."""
        logits = model(input_ids=batch["input_ids"], use_cache=False).logits
        return -response_token_loss(logits, batch["labels"])

    def evaluate(
        self, model: nn.Module, *, rank: int, world_size: int, progress: Callable[[str], None] | None = None
    ) -> dict[str, float]:
        cfg = self.config.eval
        metrics: dict[str, float] = {}
        for name in cfg.suites:
            if name == "mt_bench":
                metrics.update(self.evaluate_mt_bench(model, rank=rank, world_size=world_size, progress=progress))
                continue
            if name == "gsm8k_loss":
                metrics.update(self.evaluate_response_loss(model, rank=rank, world_size=world_size, progress=progress))
                continue
            metrics.update(
                run_suite(
                    self._suite(name),
                    model,
                    self.tokenizer,
                    self.encode_prompt,
                    limit=cfg.eval_limit,
                    max_new_tokens=cfg.max_new_tokens,
                    batch_size=cfg.eval_batch_size,
                    rank=rank,
                    world_size=world_size,
                    progress=progress,
                )
            )
        if self.validation_dataset() is not None:
            metrics.update(self.evaluate_validation_loss(model, rank=rank, world_size=world_size, progress=progress))
        return metrics

    def gsm8k_test_answers(self) -> SFTDataset:
        """``eval.response_loss_limit`` GSM8K test problems (drawn by the data seed; the first ones
        with an int ``split_seed``) with their reference solutions as responses, prepared exactly
        like GSM8K training examples."""
        if self._gsm8k_test is None:
            problems, limit = load_gsm8k_test(self.data_dir), self.config.eval.response_loss_limit
            if limit is not None and self.config.split_seed is None:
                problems = [problems[i] for i in seeded_sample(len(problems), limit, self.data_seed)]
            examples = [SOURCES["gsm8k"].to_example(problem) for problem in problems[:limit]]
            self._gsm8k_test = SFTDataset(examples, self.encode_example, self.config.max_length)
        return self._gsm8k_test

    def evaluate_response_loss(
        self, model: nn.Module, *, rank: int = 0, world_size: int = 1, progress: Callable[[str], None] | None = None
    ) -> dict[str, float]:
        """{"gsm8k_test_response_loss": mean response-token loss of the GSM8K test solutions}
        (token-weighted, lower is better), this rank scoring every world_size-th solution."""
        return run_response_loss(
            "gsm8k",
            model,
            self.gsm8k_test_answers(),
            self.collate,
            batch_size=self.config.eval.eval_batch_size,
            chunk_tokens=self.config.loss_chunk_tokens,
            fused=self.config.fused_loss,
            rank=rank,
            world_size=world_size,
            progress=progress,
        )

    def evaluate_validation_loss(
        self, model: nn.Module, *, rank: int = 0, world_size: int = 1, progress: Callable[[str], None] | None = None
    ) -> dict[str, float]:
        """{"val_loss": mean response-token loss of the validation problems' responses}, computed
        as gsm8k_loss's (token-weighted, lower is better), this rank scoring every world_size-th."""
        return run_response_loss(
            "val",
            model,
            self.validation_dataset(),
            self.collate,
            metric="val_loss",
            batch_size=self.config.eval.eval_batch_size,
            chunk_tokens=self.config.loss_chunk_tokens,
            fused=self.config.fused_loss,
            rank=rank,
            world_size=world_size,
            progress=progress,
        )

    def _suite(self, name: str) -> EvalSuite:
        """Built once per task, so problems are loaded once across evaluations."""
        if name not in self._suites:
            self._suites[name] = build_suite(
                name,
                folder=self.data_dir,
                code_timeout=self.config.eval.code_timeout,
                code_memory_mb=self.config.eval.code_memory_mb,
            )
        return self._suites[name]

    def evaluate_mt_bench(
        self,
        model: nn.Module,
        *,
        rank: int = 0,
        world_size: int = 1,
        progress: Callable[[str], None] | None = None,
        judgements: list[str] | None = None,
    ) -> dict[str, float]:
        """MT-Bench on the first ``eval_limit`` questions, rated by ``judge`` (else by the
        ``eval.mt_bench_judge`` model, loaded once on the model's device)."""
        cfg = self.config.eval
        if self._mt_bench_questions is None:
            self._mt_bench_questions = load_mt_bench_questions(cfg.mt_bench_questions, folder=self.data_dir)
        if self.judge is None:
            if cfg.mt_bench_judge is None:
                raise ValueError("MT-Bench needs a judge: set eval.mt_bench_judge or pass LLMTask(..., judge=callable)")
            self.judge = HFJudge(
                cfg.mt_bench_judge,
                max_new_tokens=cfg.judge_max_new_tokens,
                batch_size=cfg.eval_batch_size,
                device=next(model.parameters()).device,
                dtype=DTYPES[self.config.dtype],
            )
        return run_mt_bench(
            model,
            self.tokenizer,
            self.encode_prompt,
            self._mt_bench_questions[: cfg.eval_limit],
            self.judge,
            max_new_tokens=cfg.max_new_tokens,
            batch_size=cfg.eval_batch_size,
            rank=rank,
            world_size=world_size,
            progress=progress,
            judgements=judgements,
        )
