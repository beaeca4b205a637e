"""Instruction-tuning data: named sources, local files, tokenisation with response-only labels.

A named dataset comes from ``<data_dir>/<its local file>`` when that file exists (an offline
mirror, e.g. ``ATTENT_DATA_DIR=/data`` with ``/data/gsm8k/train.jsonl``) and from the Hugging
Face hub otherwise. Any .json / .jsonl / .parquet file is accepted as a custom dataset.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import datasets
import pandas as pd
import torch
from torch.utils.data import Dataset

from attent.tasks.llm.prompts import mbpp_instruction

IGNORE_INDEX = -100  # label of tokens that carry no loss (prompt, padding)
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


class Example(NamedTuple):
    prompt: str  # the user instruction, before any prompt template
    response: str  # the reply trained on
    group: str = ""  # sub-population (MetaMathQA's augmentation type), "" when none


# --- files ----------------------------------------------------------------------------------
def data_dir(configured: str | None = None) -> Path | None:
    """The local mirror folder: the configured one, else ``$ATTENT_DATA_DIR``, else None."""
    folder = configured or os.environ.get("ATTENT_DATA_DIR")
    return Path(folder).expanduser() if folder else None


def local_file(folder: Path | None, stem: str) -> Path | None:
    """The first existing ``folder/stem{.jsonl,.json,.parquet}``, else None."""
    if folder is None:
        return None
    candidates = (folder / f"{stem}{suffix}" for suffix in LOCAL_SUFFIXES)
    return next((path for path in candidates if path.is_file()), None)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl, .json (a list of objects) or .parquet file."""
    path = Path(path)
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if path.suffix == ".json":
        with path.open(encoding="utf-8") as f:
            rows = json.load(f)
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of objects")
        return rows
    if path.suffix == ".parquet":
        return pd.read_parquet(path).to_dict(orient="records")
    raise ValueError(f"{path}: unsupported file type (use one of {LOCAL_SUFFIXES})")


# --- named training sets --------------------------------------------------------------------
@dataclass(frozen=True)
class DataSource:
    """Where a named training set lives and how one of its records becomes an Example."""

    hub_path: str
    hub_config: str | None
    hub_splits: tuple[str, ...]  # concatenated
    local_stem: str  # file under the data dir, without suffix
    to_example: Callable[[dict[str, Any]], Example]
    keep: Callable[[dict[str, Any]], bool] = lambda record: True


def _strip_calculator(solution: str) -> str:
    """GSM8K solutions annotate arithmetic as ``<<16-3=13>>``; models are trained without it."""
    return re.sub(r"<<[^>]*>>", "", solution)


def _mbpp_example(record: dict[str, Any]) -> Example:
    code = record["code"].replace("\r\n", "\n").strip()
    return Example(mbpp_instruction(record["text"], record["test_list"]), f"```python\n{code}\n```")


def is_mbpp_test_task(task_id: int) -> bool:
    """MBPP tasks 11-510 are the benchmark; the rest (1-10, 511-974) are for training."""
    return 11 <= task_id <= 510


SOURCES: dict[str, DataSource] = {
    "metamathqa": DataSource(
        "meta-math/MetaMathQA", None, ("train",), "metamathqa/train",
        lambda r: Example(r["query"], r["response"], r["type"])),
    "codefeedback": DataSource(
        "m-a-p/CodeFeedback-Filtered-Instruction", None, ("train",), "codefeedback/train",
        lambda r: Example(r["query"], r["answer"]),
        keep=lambda r: (r.get("lang") or "").lower() == "python"),
    "wizardlm": DataSource(
        "WizardLMTeam/WizardLM_evol_instruct_70k", None, ("train",), "wizardlm/train",
        lambda r: Example(r["instruction"], r["output"])),
    "gsm8k": DataSource(
        "openai/gsm8k", "main", ("train",), "gsm8k/train",
        lambda r: Example(r["question"], _strip_calculator(r["answer"]))),
    "mbpp": DataSource(
        "google-research-datasets/mbpp", "full", ("train", "validation", "prompt"),
        "mbpp/mbpp", _mbpp_example,
        keep=lambda r: not is_mbpp_test_task(r["task_id"])),
}


def load_source_records(source: DataSource, folder: Path | None) -> list[dict[str, Any]]:
    """All records of a named set that it ``keep``s, from the local mirror or the hub."""
    path = local_file(folder, source.local_stem)
    if path is not None:
        records = read_records(path)
    else:
        splits = [datasets.load_dataset(source.hub_path, source.hub_config, split=split)
                  for split in source.hub_splits]
        records = datasets.concatenate_datasets(splits).to_list()
    return [r for r in records if source.keep(r)]


def load_examples(dataset: str, *, folder: Path | None, prompt_field: str, response_field: str,
                  limit: int | None) -> list[Example]:
    """Examples of a named set (see ``SOURCES``) or of a local file with the given fields."""
    if dataset in SOURCES:
        source = SOURCES[dataset]
        return [source.to_example(r) for r in load_source_records(source, folder)[:limit]]
    records = read_records(dataset)[:limit]
    return [Example(str(r[prompt_field]), str(r[response_field])) for r in records]


# --- tokenisation ---------------------------------------------------------------------------
def truncate(prompt_ids: list[int], response_ids: list[int],
             max_length: int) -> tuple[list[int], list[int]]:
    """Fit a pair into ``max_length`` tokens: cut the response's end first; cut the prompt's
    start only as far as needed to keep ``min(len(response), max_length // 4)`` reply tokens."""
    keep_response = min(len(response_ids), max_length // 4)
    prompt_ids = prompt_ids[max(0, len(prompt_ids) - (max_length - keep_response)):]
    return prompt_ids, response_ids[:max_length - len(prompt_ids)]


def build_labels(prompt_ids: list[int], response_ids: list[int]) -> tuple[list[int], list[int]]:
    """``input_ids`` = prompt + response; ``labels`` = IGNORE_INDEX over the prompt, ids over
    the response."""
    return prompt_ids + response_ids, [IGNORE_INDEX] * len(prompt_ids) + response_ids


class SFTDataset(Dataset):
    """Examples tokenised on access: item i -> {"index": i, "input_ids": [...], "labels": [...]}."""

    def __init__(self, examples: list[Example],
                 encode: Callable[[Example], tuple[list[int], list[int]]], max_length: int):
        self.examples = examples
        self.encode = encode  # Example -> (prompt ids, response ids)
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        prompt_ids, response_ids = truncate(*self.encode(self.examples[index]), self.max_length)
        input_ids, labels = build_labels(prompt_ids, response_ids)
        return {"index": index, "input_ids": input_ids, "labels": labels}


def collate_right_padded(items: list[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest item: padding gets ``pad_token_id``, mask 0 and label -100."""
    width = max(len(item["input_ids"]) for item in items)

    def padded(rows: list[list[int]], fill: int) -> torch.Tensor:
        return torch.tensor([row + [fill] * (width - len(row)) for row in rows])

    input_ids = [item["input_ids"] for item in items]
    return {
        "index": torch.tensor([item["index"] for item in items]),
        "input_ids": padded(input_ids, pad_token_id),
        "labels": padded([item["labels"] for item in items], IGNORE_INDEX),
        "attention_mask": padded([[1] * len(row) for row in input_ids], 0),
    }
