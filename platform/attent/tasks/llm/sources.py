"""Where the LLM task's data lives: named training sets, local files, the offline mirror folder.

Light on purpose (standard library only, parquet readers imported on use): the task's config
module imports it to validate experiments on the driver without torch, datasets or pandas.

A named dataset comes from ``<data_dir>/<its local file>`` when that file exists (an offline
mirror, e.g. ``ATTENT_DATA_DIR=/data`` with ``/data/gsm8k/train.jsonl``) and from the Hugging
Face hub otherwise (see ``attent.tasks.llm.data``). Any .json / .jsonl / .parquet file is
accepted as a custom dataset.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from attent.tasks.llm.prompts import mbpp_instruction

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


class Example(NamedTuple):
    prompt: str  # the user instruction, before any prompt template
    response: str  # the reply trained on
    group: str = ""  # sub-population (MetaMathQA's augmentation type), "" when none
    # the conversation before ``prompt``: user and assistant turns alternating, every reply trained on too
    earlier: tuple[str, ...] = ()

    def conversation(self) -> list[str]:
        """Every turn, from the first user turn to ``response``."""
        return [*self.earlier, self.prompt, self.response]


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
    """Rows of a .jsonl, .json (a list of objects) or .parquet file, as plain Python values
    (parquet list columns become lists, as they do from the hub, not numpy arrays)."""
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
        import pyarrow.parquet as pq  # heavy: only when a parquet file is read

        return pq.read_table(path).to_pylist()
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
    # the records it holds, as its card counts them (kept ones; None: unknown), for `attent plan`
    # where the data is not here
    records: int | None = None
    records_bound: bool = False  # ``records`` counts rows ``keep`` drops too: an upper bound


def _strip_calculator(solution: str) -> str:
    """GSM8K solutions annotate arithmetic as ``<<16-3=13>>``; models are trained without it."""
    return re.sub(r"<<[^>]*>>", "", solution)


def _mbpp_example(record: dict[str, Any]) -> Example:
    code = record["code"].replace("\r\n", "\n").strip()
    return Example(mbpp_instruction(record["text"], record["test_list"]), f"```python\n{code}\n```")


def is_mbpp_test_task(task_id: int) -> bool:
    """MBPP tasks 11-510 are the test split; the rest (1-10, 511-974) are for training."""
    return 11 <= task_id <= 510


_HUMAN, _ASSISTANT = ("human", "user"), ("gpt", "assistant")


def _wizardlm_example(record: dict[str, Any]) -> Example:
    """Evol-Instruct 70k rows are ``{instruction, output}``; the V2 (143k/196k) rows are
    ShareGPT-style ``{idx, conversations: [{from: human, value}, {from: gpt, value}, ...]}``, of
    which every exchange (a human turn and the reply after it) is kept and trained on: MT-Bench,
    the set's evaluation, asks two turns."""
    if "conversations" not in record:
        return Example(record["instruction"], record["output"])
    turns = record["conversations"]
    exchanges = [
        (asked["value"], reply["value"])
        for asked, reply in zip(turns, turns[1:])
        if asked["from"] in _HUMAN and reply["from"] in _ASSISTANT
    ]
    *earlier, (prompt, response) = exchanges
    return Example(prompt, response, earlier=tuple(text for exchange in earlier for text in exchange))


def _wizardlm_keep(record: dict[str, Any]) -> bool:
    """V2 conversations need a human turn followed by the assistant's reply."""
    if "conversations" not in record:
        return True
    turns = record["conversations"] or []
    return any(asked["from"] in _HUMAN and reply["from"] in _ASSISTANT for asked, reply in zip(turns, turns[1:]))


SOURCES: dict[str, DataSource] = {
    # MetaMathQA-395K.json: {query, response, type (GSM_Rephrased, MATH_SV, ...), original_question}
    "metamathqa": DataSource(
        "meta-math/MetaMathQA",
        None,
        ("train",),
        "metamathqa/train",
        lambda r: Example(r["query"], r["response"], r["type"]),
        records=395_000,
    ),
    # CodeFeedback-Filtered-Instruction.jsonl: {query, answer, resource, lang}; Python rows only
    "codefeedback": DataSource(
        "m-a-p/CodeFeedback-Filtered-Instruction",
        None,
        ("train",),
        "codefeedback/train",
        lambda r: Example(r["query"], r["answer"]),
        keep=lambda r: (r.get("lang") or "").strip().lower() == "python",
        records=157_000,  # the hub's rows in every language: more than the Python ones kept
        records_bound=True,
    ),
    # alpaca_evol_instruct_70k.json: {instruction, output}
    "wizardlm": DataSource(
        "WizardLMTeam/WizardLM_evol_instruct_70k",
        None,
        ("train",),
        "wizardlm/train",
        _wizardlm_example,
        keep=_wizardlm_keep,
        records=70_000,
    ),
    # The paper's dialogue set, WizardLM/evol_instruct_196k: WizardLM's Evol-Instruct V2, now
    # WizardLMTeam/WizardLM_evol_instruct_V2_196k. The hub holds its 143k evolved conversations
    # (ShareGPT-style rows); its card leaves merging the original ShareGPT conversations (about
    # 196k rows in all) to the user, for their licence: a merged file at
    # <data_dir>/wizardlm_evol_instruct_196k/train.{jsonl,json,parquet} is read instead.
    "wizardlm_evol_instruct_196k": DataSource(
        "WizardLMTeam/WizardLM_evol_instruct_V2_196k",
        None,
        ("train",),
        "wizardlm_evol_instruct_196k/train",
        _wizardlm_example,
        keep=_wizardlm_keep,
        records=143_000,  # the hub's; a merged file with ShareGPT's holds about 196k
    ),
    "gsm8k": DataSource(
        "openai/gsm8k",
        "main",
        ("train",),
        "gsm8k/train",
        lambda r: Example(r["question"], _strip_calculator(r["answer"])),
        records=7_473,
    ),
    "mbpp": DataSource(
        "google-research-datasets/mbpp",
        "full",
        ("train", "validation", "prompt"),
        "mbpp/mbpp",
        _mbpp_example,
        keep=lambda r: not is_mbpp_test_task(r["task_id"]),
        records=474,  # tasks 1-10 and 511-974
    ),
}
