"""Instruction-tuning data: loading named sets (local mirror or Hugging Face hub) and local files,
tokenisation with response-only labels, right-padded batches.

The light parts (``SOURCES``, file readers, the mirror folder) live in
``attent.tasks.llm.sources`` and are re-exported here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from attent.contract import DATASET_SOURCE_HUB, DATASET_SOURCE_LOCAL
from attent.tasks.llm.sources import SOURCES, DataSource, Example, local_file, read_records
from attent.tasks.task import holdout_sizes

IGNORE_INDEX = -100  # label of tokens that carry no loss (prompt, padding)


# --- named training sets --------------------------------------------------------------------
def hub_records(
    hub_path: str | Path, hub_config: str | None, splits: tuple[str, ...] | list[str]
) -> list[dict[str, Any]]:
    """The rows of the given splits of a Hugging Face hub dataset, concatenated in order.

    ``hub_path`` is a hub name, or a local folder laid out like the hub repository (a
    ``git clone`` of it: the same data files, and the README whose ``configs`` name them).
    """
    import datasets  # here, not at the top: the loss and the collator need no `datasets` (nor a GPU node)

    parts = [datasets.load_dataset(str(hub_path), hub_config, split=split) for split in splits]
    return datasets.concatenate_datasets(parts).to_list()


def load_source_records(
    source: DataSource, folder: Path | None, hub_repo: str | Path | None = None
) -> list[dict[str, Any]]:
    """All records of a named set that it ``keep``s, from the local mirror file
    ``<folder>/<local_stem>.*`` when there is one, else from the hub (or ``hub_repo``, a local
    copy of the hub repository)."""
    path = local_file(folder, source.local_stem)
    if path is not None:
        records = read_records(path)
    else:
        records = hub_records(hub_repo or source.hub_path, source.hub_config, source.hub_splits)
    return [r for r in records if source.keep(r)]


def example_source(
    dataset: str, *, folder: Path | None, prompt_field: str, response_field: str, hub_repo: str | Path | None = None
) -> tuple[list[dict[str, Any]], Callable[[dict[str, Any]], Example]]:
    """The records of a named set (see ``SOURCES``; those it keeps) or of a local file, and how
    one becomes an Example (converted only once chosen: MetaMathQA holds 395k records)."""
    to_example = record_converter(dataset, prompt_field, response_field)
    if dataset in SOURCES:
        return load_source_records(SOURCES[dataset], folder, hub_repo), to_example
    return read_records(dataset), to_example


def record_converter(dataset: str, prompt_field: str, response_field: str) -> Callable[[dict[str, Any]], Example]:
    """How one record of ``dataset`` (a named set, else a file with the given fields) becomes an
    Example."""
    if dataset in SOURCES:
        return SOURCES[dataset].to_example
    return lambda record: Example(str(record[prompt_field]), str(record[response_field]))


def load_examples(
    dataset: str,
    *,
    folder: Path | None,
    prompt_field: str,
    response_field: str,
    limit: int | None,
    hub_repo: str | Path | None = None,
) -> list[Example]:
    """The first ``limit`` examples (None: all) of a named set or of a local file with the
    given fields."""
    records, to_example = example_source(
        dataset, folder=folder, prompt_field=prompt_field, response_field=response_field, hub_repo=hub_repo
    )
    return [to_example(r) for r in records[:limit]]


def seeded_sample(count: int, n: int, seed: int) -> list[int]:
    """Sorted indices of n of ``count`` items drawn at random (all of them when n >= count)."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return sorted(order[:n].tolist())


def draw_problems(
    count: int, *, train_limit: int | None, val_limit: int | None, seed: int, keep_first: bool
) -> tuple[list[int], list[int]]:
    """(training, validation): sorted, disjoint indices into a training set of ``count``
    problems. Validation: ``val_limit`` problems drawn at random (None: none). Training:
    ``train_limit`` of the others (None: all of them), drawn at random too, unless ``keep_first``:
    then the set's first ``train_limit`` problems, as runs trained before seeds drew them, and
    validation comes from the rest. Either way a validation set leaves the training problems
    as they are without one."""
    if val_limit is None:
        if keep_first or train_limit is None:
            return list(range(min(count, train_limit or count))), []
        return seeded_sample(count, train_limit, seed), []
    train, val = holdout_sizes(count, val_limit, train_limit, "problems")
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    if keep_first and train_limit is not None:
        return list(range(train)), sorted([i for i in order if i >= train][:val])
    return sorted(order[:train]), sorted(order[count - val :])


def training_source(dataset: str, folder: Path | None) -> tuple[str, str]:
    """(where a training set's examples come from, its MLflow source type): a named set's mirror
    file, else its hub name; a dataset file's path."""
    if dataset in SOURCES:
        path = local_file(folder, SOURCES[dataset].local_stem)
        if path is None:
            return SOURCES[dataset].hub_path, DATASET_SOURCE_HUB
        return str(path.resolve()), DATASET_SOURCE_LOCAL
    return str(Path(dataset).expanduser().resolve()), DATASET_SOURCE_LOCAL


def fingerprint(examples: list[Example]) -> str:
    """A hash of the examples' text (prompt, response, group, earlier turns), in order."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(
            "\x1f".join((example.prompt, example.response, example.group, *example.earlier)).encode() + b"\x1e"
        )
    return digest.hexdigest()


# --- tokenisation ---------------------------------------------------------------------------
def truncate(prompt_ids: list[int], response_ids: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """Fit a pair into ``max_length`` tokens: cut the response's end first; cut the prompt's
    start only as far as needed to keep ``min(len(response), max_length // 4)`` reply tokens."""
    keep_response = min(len(response_ids), max_length // 4)
    prompt_ids = prompt_ids[max(0, len(prompt_ids) - (max_length - keep_response)) :]
    return prompt_ids, response_ids[: max_length - len(prompt_ids)]


def build_labels(prompt_ids: list[int], response_ids: list[int]) -> tuple[list[int], list[int]]:
    """``input_ids`` = prompt + response; ``labels`` = IGNORE_INDEX over the prompt, ids over
    the response."""
    return prompt_ids + response_ids, [IGNORE_INDEX] * len(prompt_ids) + response_ids


Exchanges = list[tuple[list[int], list[int]]]  # (prompt ids, reply ids) of each exchange, in order


class SFTDataset(Dataset):
    """Examples tokenised on access: item i -> {"index": i, "input_ids": [...], "labels": [...]}.
    A conversation's first exchange is fitted to ``max_length`` (``truncate``); its later exchanges
    follow as far as they fit, every reply labelled."""

    def __init__(self, examples: list[Example], encode: Callable[[Example], Exchanges], max_length: int):
        self.examples = examples
        self.encode = encode  # Example -> its exchanges' (prompt ids, reply ids)
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return sft_item(self.encode(self.examples[index]), self.max_length, index)


def sft_item(exchanges: Exchanges, max_length: int, index: int) -> dict[str, Any]:
    """An example's exchanges as a training item: the first fitted to ``max_length``
    (``truncate``), the later ones following as far as they fit, every reply labelled."""
    first, *later = exchanges
    input_ids, labels = build_labels(*truncate(*first, max_length))
    for prompt_ids, reply_ids in later:
        ids, more = build_labels(prompt_ids, reply_ids)
        room = max_length - len(input_ids)
        input_ids, labels = input_ids + ids[:room], labels + more[:room]
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
