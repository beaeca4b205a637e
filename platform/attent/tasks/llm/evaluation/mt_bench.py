"""MT-Bench (Zheng et al., 2023): two-turn open questions rated 1-10 by a judge model.

The judge is an interface, not a dependency: anything with ``score(question, answer,
reference) -> float`` works. ``LLMJudge`` adapts any text-completion client (a GPT-4 API call in
the paper's setup) with the single-answer grading prompt and its ``[[rating]]`` format. Needs
network or a local judge, so it is not part of the offline ``evaluate`` benchmarks.
Questions use FastChat's ``question.jsonl`` format: ``{"question_id", "category", "turns":
[q1, q2], "reference": [r1, r2] (math, reasoning and coding only)}``.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from torch import nn
from transformers import PreTrainedTokenizerBase

from attent.evaluation.generation import generate_greedy
from attent.tasks.llm.data import read_records

EncodePrompt = Callable[[list[str]], list[int]]


class Judge(Protocol):
    def score(self, question: str, answer: str, reference: str | None = None) -> float:
        """Rate ``answer`` to ``question`` from 1 (worst) to 10 (best); ``reference`` is a
        correct answer to compare against, when the category has one."""


JUDGE_PROMPT = (
    "Please act as an impartial judge and evaluate the quality of the response provided by an "
    "AI assistant to the user question displayed below. Consider helpfulness, relevance, "
    "accuracy, depth, creativity and level of detail.{reference_note} Begin with a short "
    "explanation, then rate the response on a scale of 1 to 10 in exactly this format: "
    "\"[[rating]]\", for example \"Rating: [[5]]\".\n\n"
    "[Question]\n{question}\n\n{reference_block}"
    "[The Start of Assistant's Answer]\n{answer}\n[The End of Assistant's Answer]"
)


def judge_prompt(question: str, answer: str, reference: str | None) -> str:
    note = (" Compare the response with the reference answer and penalise mistakes."
            if reference else "")
    block = (f"[The Start of Reference Answer]\n{reference}\n[The End of Reference Answer]\n\n"
             if reference else "")
    return JUDGE_PROMPT.format(reference_note=note, question=question, reference_block=block,
                               answer=answer)


def parse_rating(reply: str) -> float | None:
    """The last ``[[x]]`` rating in a judge's reply, if it is within 1..10."""
    ratings = re.findall(r"\[\[(\d+(?:\.\d+)?)\]\]", reply)
    rating = float(ratings[-1]) if ratings else None
    return rating if rating is not None and 1 <= rating <= 10 else None


@dataclass
class LLMJudge:
    """A Judge backed by a judge model: ``complete`` sends a prompt and returns its reply."""

    complete: Callable[[str], str]

    def score(self, question: str, answer: str, reference: str | None = None) -> float:
        reply = self.complete(judge_prompt(question, answer, reference))
        rating = parse_rating(reply)
        if rating is None:
            raise ValueError(f"judge reply without a [[1-10]] rating: {reply[-200:]!r}")
        return rating


def load_mt_bench_questions(path: str | Path) -> list[dict[str, Any]]:
    return read_records(path)


def follow_up_question(turns: list[str], first_answer: str) -> str:
    """How the second turn is shown to the judge: the whole exchange, then the follow-up."""
    return (f"{turns[0]}\n\n[The assistant's first answer]\n{first_answer}\n\n"
            f"[The user's follow-up question]\n{turns[1]}")


def run_mt_bench(model: nn.Module, tokenizer: PreTrainedTokenizerBase,
                 encode_prompt: EncodePrompt, questions: list[dict[str, Any]], judge: Judge, *,
                 max_new_tokens: int = 1024, batch_size: int = 8,
                 progress: Callable[[str], None] | None = None) -> dict[str, float]:
    """Answer both turns greedily (turn 2 sees turn 1), judge each; mean ratings per turn."""
    def generate(conversations: list[list[str]]) -> list[str]:
        return generate_greedy(model, tokenizer, [encode_prompt(c) for c in conversations],
                               max_new_tokens=max_new_tokens, batch_size=batch_size,
                               progress=progress)

    first = generate([[q["turns"][0]] for q in questions])
    second = generate([[q["turns"][0], a, q["turns"][1]]
                       for q, a in zip(questions, first, strict=True)])

    def reference(question: dict[str, Any], turn: int) -> str | None:
        return (question.get("reference") or [None, None])[turn]

    turn1 = [judge.score(q["turns"][0], a, reference(q, 0))
             for q, a in zip(questions, first, strict=True)]
    turn2 = [judge.score(follow_up_question(q["turns"], a1), a2, reference(q, 1))
             for q, a1, a2 in zip(questions, first, second, strict=True)]
    return {"mt_bench_turn1": statistics.mean(turn1), "mt_bench_turn2": statistics.mean(turn2),
            "mt_bench_score": statistics.mean(turn1 + turn2)}
