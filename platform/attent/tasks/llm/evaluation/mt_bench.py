"""MT-Bench (Zheng et al., 2023): two-turn open questions, each answer rated 1-10 by a judge.

The model answers both turns greedily (turn 2 sees its own turn-1 answer); a judge rates every
answer with the single-answer grading prompt and its ``[[rating]]`` format. The judge is any
callable ``prompt -> judgement text`` (an API client for the paper's GPT-4 setup, a stub in
tests) or ``HFJudge``, a local or hub causal LM run by greedy generation. A judgement without a
readable 1-10 rating is counted (``mt_bench_unparsed``), never fatal.

Questions use FastChat's ``question.jsonl`` format: ``{"question_id", "category", "turns":
[q1, q2], "reference": [r1, r2]}`` (a reference only for math, reasoning and coding). They come
from a file, from ``<data_dir>/mt_bench/question.*``, or from the hub (``lighteval/mt-bench``,
the 80 questions in that format; ``HuggingFaceH4/mt_bench_prompts``'s ``prompt`` column is
accepted for ``turns`` too).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from attent.tasks.llm.evaluation.generation import generate_greedy
from attent.tasks.llm.evaluation.suites import all_reduce_sums
from attent.tasks.llm.model import load_causal_lm, load_tokenizer
from attent.tasks.llm.prompts import encode_prompt as encode_turns
from attent.tasks.llm.prompts import resolve_style
from attent.tasks.llm.sources import local_file, read_records

EncodePrompt = Callable[[list[str]], list[int]]
Judge = Callable[[str], str]  # judge prompt -> judgement text ending in "[[rating]]"
Question = dict[str, Any]

MT_BENCH_HUB = "lighteval/mt-bench"  # FastChat's 80 questions: question_id, category, turns, reference


@runtime_checkable
class BatchJudge(Protocol):
    """A judge that can also rate many prompts in one call (``HFJudge`` batches generation)."""

    def __call__(self, prompt: str) -> str: ...

    def batch(self, prompts: list[str]) -> list[str]: ...


# --- the judge's prompt and its rating ------------------------------------------------------
JUDGE_PROMPT = (
    "Please act as an impartial judge and evaluate the quality of the response provided by an "
    "AI assistant to the user question displayed below. Consider helpfulness, relevance, "
    "accuracy, depth, creativity and level of detail.{reference_note} Begin with a short "
    "explanation, then rate the response on a scale of 1 to 10 in exactly this format: "
    '"[[rating]]", for example "Rating: [[5]]".\n\n'
    "[Question]\n{question}\n\n{reference_block}"
    "[The Start of Assistant's Answer]\n{answer}\n[The End of Assistant's Answer]"
)


def judge_prompt(question: str, answer: str, reference: str | None) -> str:
    note = " Compare the response with the reference answer and penalise mistakes." if reference else ""
    block = f"[The Start of Reference Answer]\n{reference}\n[The End of Reference Answer]\n\n" if reference else ""
    return JUDGE_PROMPT.format(reference_note=note, question=question, reference_block=block, answer=answer)


_NUMBER = r"(\d+(?:\.\d+)?)"
_RATING = re.compile(r"\[\[\s*" + _NUMBER + r"\s*(?:/\s*10\s*)?\]\]")  # [[7]], [[ 7.5 ]], [[8/10]]
_RATING_BACKUP = re.compile(r"\[\s*" + _NUMBER + r"\s*(?:/\s*10\s*)?\]")  # FastChat's fallback: [7]


def parse_rating(judgement: str | None) -> float | None:
    """The judge's rating: the last ``[[x]]`` in its text (else the last ``[x]``), if it is a
    number from 1 to 10; None when there is none (the judgement is counted as unparsed)."""
    if not isinstance(judgement, str):  # a judge that returned nothing usable
        return None
    for pattern in (_RATING, _RATING_BACKUP):
        found = pattern.findall(judgement)
        if found:
            rating = float(found[-1])
            return rating if 1 <= rating <= 10 else None
    return None


def follow_up_question(turns: list[str], first_answer: str) -> str:
    """How the second turn is shown to the judge: the whole exchange, then the follow-up."""
    return (
        f"{turns[0]}\n\n[The assistant's first answer]\n{first_answer}\n\n[The user's follow-up question]\n{turns[1]}"
    )


# --- judges -----------------------------------------------------------------------------------
def judge_all(judge: Judge, prompts: list[str]) -> list[str]:
    """Judgements in prompt order (batched when the judge can batch)."""
    if not prompts:
        return []
    if isinstance(judge, BatchJudge):
        return list(judge.batch(prompts))
    return [judge(prompt) for prompt in prompts]


@dataclass
class HFJudge:
    """A Hugging Face causal LM as judge: the judge prompt as one user turn (its chat template,
    else the Alpaca one), greedy decoding. Loaded on first use, on ``device``."""

    model: str  # hub name, local checkpoint folder, or "smollm2-135m-instruct"
    max_new_tokens: int = 512
    batch_size: int = 8
    device: torch.device | str = "cpu"
    dtype: torch.dtype = torch.float32
    prompt_style: str = "auto"
    _loaded: tuple[Any, Any, str] | None = field(default=None, init=False, repr=False)

    def _load(self) -> tuple[nn.Module, PreTrainedTokenizerBase, str]:
        if self._loaded is None:
            tokenizer = load_tokenizer(self.model)
            network = load_causal_lm(self.model, self.dtype).to(self.device).eval()
            self._loaded = (network, tokenizer, resolve_style(tokenizer, self.prompt_style))
        return self._loaded

    def batch(self, prompts: list[str]) -> list[str]:
        network, tokenizer, style = self._load()
        ids = [encode_turns(tokenizer, style, [prompt]) for prompt in prompts]
        return generate_greedy(network, tokenizer, ids, max_new_tokens=self.max_new_tokens, batch_size=self.batch_size)

    def __call__(self, prompt: str) -> str:
        return self.batch([prompt])[0]


# --- questions --------------------------------------------------------------------------------
def normalize_question(record: dict[str, Any]) -> Question:
    """A question record as ``{question_id, category, turns: [q1, q2], reference: [r1, r2] |
    None}``; refuses records without two turns."""
    turns = record.get("turns", record.get("prompt"))
    if not isinstance(turns, (list, tuple)) or len(turns) < 2 or not all(isinstance(turn, str) for turn in turns[:2]):
        raise ValueError(
            f"MT-Bench question {record.get('question_id', record)!r} needs two "
            "string turns ('turns': [first, follow-up])"
        )
    reference = list(record.get("reference") or [])
    return {
        "question_id": record.get("question_id", record.get("prompt_id")),
        "category": record.get("category", ""),
        "turns": list(turns[:2]),
        "reference": (reference + [None, None])[:2] if reference else None,
    }


def load_mt_bench_questions(
    path: str | Path | None = None, *, folder: Path | None = None, hub_repo: str | Path = MT_BENCH_HUB
) -> list[Question]:
    """Questions from ``path`` (.jsonl/.json/.parquet), else ``<folder>/mt_bench/question.*``,
    else the hub's train split (``hub_repo`` may be a local copy of the hub repository)."""
    source = Path(path).expanduser() if path is not None else local_file(folder, "mt_bench/question")
    if source is not None:
        records = read_records(source)
    else:
        import datasets  # only for the hub: absent where local files are all a run reads

        records = datasets.load_dataset(str(hub_repo), split="train").to_list()
    return [normalize_question(record) for record in records]


# --- running ----------------------------------------------------------------------------------
def _mean(total: float, count: float) -> float:
    return total / count if count else math.nan


def _rating_metrics(ratings: list[float | None], first_turns: int, device: torch.device) -> dict[str, float]:
    """MT-Bench's metrics from every rank's ratings, summed over ranks.

    Args:
        ratings: this rank's ratings, its turn-1 answers' first; None where a judgement had no
            readable rating.
        first_turns: how many of ``ratings`` rate turn-1 answers.
        device: where the all-reduce's tensor is built (the model's device).

    Returns:
        The mean rating per turn and overall (NaN when none was rated), the number of
        judgements and of those without a readable rating.
    """
    sums = []
    for turn in (ratings[:first_turns], ratings[first_turns:]):
        rated = [r for r in turn if r is not None]
        sums += [sum(rated), len(rated)]
    unparsed = sum(r is None for r in ratings)
    sum1, n1, sum2, n2, unparsed, judged = all_reduce_sums([*sums, float(unparsed), float(len(ratings))], device)
    return {
        "mt_bench_turn1": _mean(sum1, n1),
        "mt_bench_turn2": _mean(sum2, n2),
        "mt_bench_score": _mean(sum1 + sum2, n1 + n2),
        "mt_bench_judged": judged,
        "mt_bench_unparsed": unparsed,
    }


def run_mt_bench(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    encode_prompt: EncodePrompt,
    questions: list[Question],
    judge: Judge,
    *,
    max_new_tokens: int = 1024,
    batch_size: int = 8,
    rank: int = 0,
    world_size: int = 1,
    progress: Callable[[str], None] | None = None,
    judgements: list[str] | None = None,
) -> dict[str, float]:
    """Answer this rank's share of ``questions`` (both turns, greedy), judge every answer, and
    all-reduce: mean rating per turn and overall (NaN when no judgement had a rating), the number
    of judgements and of those without a readable rating. ``judgements``, when given, receives
    this rank's judge texts (turn-1 answers first)."""
    shard = [normalize_question(q) for q in questions[rank::world_size]]
    report = (lambda message: progress(f"mt_bench: {message}")) if progress else None

    def generate(conversations: list[list[str]]) -> list[str]:
        return generate_greedy(
            model,
            tokenizer,
            [encode_prompt(c) for c in conversations],
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            progress=report,
        )

    first = generate([[q["turns"][0]] for q in shard])
    second = generate([[q["turns"][0], a, q["turns"][1]] for q, a in zip(shard, first, strict=True)])

    def reference(question: Question, turn: int) -> str | None:
        return question["reference"][turn] if question["reference"] else None

    prompts = [judge_prompt(q["turns"][0], a, reference(q, 0)) for q, a in zip(shard, first, strict=True)]
    prompts += [
        judge_prompt(follow_up_question(q["turns"], a1), a2, reference(q, 1))
        for q, a1, a2 in zip(shard, first, second, strict=True)
    ]
    texts = judge_all(judge, prompts)
    if len(texts) != len(prompts):
        raise ValueError(f"the judge returned {len(texts)} judgements for {len(prompts)} prompts")
    if judgements is not None:
        judgements.extend(texts)
    ratings = [parse_rating(text) for text in texts]
    metrics = _rating_metrics(ratings, len(shard), next(model.parameters()).device)
    if report:
        judged, unparsed = metrics["mt_bench_judged"], metrics["mt_bench_unparsed"]
        report(f"score {metrics['mt_bench_score']:.2f} ({int(judged - unparsed)}/{int(judged)} judgements rated)")
    return metrics
