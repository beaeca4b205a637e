"""The evaluation suites: problem loaders, program assembly and grading on real problems and
reference solutions."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attent.tasks.llm.evaluation.code_exec import run_many
from attent.tasks.llm.evaluation.suites import (
    CHAMP,
    GSM8K,
    MATH,
    MBPP,
    HumanEval,
    all_reduce_counts,
    build_suite,
    extract_code,
    humaneval_program,
    load_champ,
    load_humaneval,
    load_mbpp_test,
    mbpp_program,
)
from attent.tasks.llm.sources import local_file, read_records

from tests.helpers.paths import DATASETS
from tests.helpers.ranks import start_method

MBPP_BROKEN_REFERENCES = {341, 596, 642}  # depend on set order / object sizes (see shared README)


@pytest.fixture(scope="module")
def shared_datasets() -> Path:
    if not (DATASETS / "mbpp" / "mbpp.jsonl").is_file():
        pytest.skip(f"{DATASETS} not present")
    return DATASETS


def test_humaneval_has_164_problems_and_reference_solutions_pass():
    problems = load_humaneval()
    assert len(problems) == 164
    sample = problems[::16]  # 11 problems across the set
    results = run_many([humaneval_program(p, p["canonical_solution"]) for p in sample])
    assert all(r.passed for r in results), [r.stderr_tail for r in results if not r.passed]


def test_humaneval_grades_chat_style_answers_and_rejects_wrong_ones():
    problem = load_humaneval()[0]  # has_close_elements(numbers, threshold)
    restated = (
        "Here is the implementation:\n```python\nfrom typing import List\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(abs(a - b) < threshold\n"
        "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```\n"
        "It compares every pair."
    )
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    suite = HumanEval(timeout=5, memory_mb=512)
    assert suite.grade([problem] * 3, [restated, wrong, problem["canonical_solution"]]) == [True, False, True]


def test_mbpp_has_974_problems_500_for_testing(shared_datasets):
    assert len(read_records(local_file(shared_datasets, "mbpp/mbpp"))) == 974
    problems = load_mbpp_test(shared_datasets)
    assert len(problems) == 500
    assert {p["task_id"] for p in problems} == set(range(11, 511))


def test_mbpp_reference_solutions_pass_their_tests(shared_datasets):
    problems = [p for p in load_mbpp_test(shared_datasets)[::50] if p["task_id"] not in MBPP_BROKEN_REFERENCES]
    completions = [f"```python\n{p['code']}\n```" for p in problems]
    assert len(problems) == 10
    suite = MBPP(shared_datasets, timeout=5, memory_mb=512)
    assert suite.grade(problems, completions) == [True] * 10
    # the same programs with the function renamed fail
    broken = [c.replace("def ", "def renamed_", 1) for c in completions]
    assert not any(suite.grade(problems, broken))


def test_mbpp_program_runs_setup_code_after_the_solution(shared_datasets):
    problem = next(p for p in load_mbpp_test(shared_datasets) if p["test_setup_code"])
    assert run_many([mbpp_program(problem, problem["code"])])[0].passed


@pytest.mark.parametrize(
    "completion, code",
    [
        ("```python\ndef f():\n    return 1\n```", "def f():\n    return 1\n"),
        ("Sure!\n```\nx = 1\n```\nand\n```py\ndef g(): pass\n```", "def g(): pass\n"),
        ("```python\ndef cut_off(x):\n    return", "def cut_off(x):\n    return"),
        ("    return 1\n", "    return 1\n"),
    ],
)
def test_extract_code(completion, code):
    assert extract_code(completion) == code


def test_gsm8k_grades_reference_solutions_correct_and_others_wrong(shared_datasets):
    suite = GSM8K(shared_datasets)
    problems = suite.problems[:20]
    assert len(suite.problems) == 1319
    assert all(suite.grade(problems, [p["answer"] for p in problems]))
    shifted = [p["answer"] for p in problems[1:] + problems[:1]]
    assert sum(suite.grade(problems, shifted)) <= 2


def test_math_reads_a_local_file_and_takes_the_gold_from_the_solution_box(tmp_path):
    (tmp_path / "math").mkdir()
    rows = [
        {"problem": "What is 1/2 + 1/4?", "solution": r"It is $\boxed{\frac34}$."},
        {"problem": "What is 2+2?", "solution": r"$\boxed{4}$", "answer": "4"},
    ]
    (tmp_path / "math" / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    suite = MATH(tmp_path)
    assert [p["answer"] for p in suite.problems] == [r"\frac34", "4"]
    graded = suite.grade(suite.problems, [r"so \boxed{0.75}", "The answer is: 5"])
    assert graded == [True, False]


def test_champ_offers_only_auto_gradable_problems():
    problems = load_champ()
    assert 150 <= len(problems) <= 270
    assert all(p["problem"] and p["answers"] for p in problems)
    first = problems[0]  # P_Combinatorics_1: 239 strings
    completions = [r"There are $\boxed{239}$ strings.", "The answer is 240"]
    assert CHAMP().grade([first, first], completions) == [True, False]


def test_unknown_suite_is_rejected():
    with pytest.raises(ValueError, match="unknown evaluation suite"):
        build_suite("mmlu", folder=None, code_timeout=1, code_memory_mb=256)


def _count_on_rank(rank: int, world_size: int, store: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        results.put((rank, all_reduce_counts(rank + 1, 10, torch.device("cpu"))))
    finally:
        dist.destroy_process_group()


def test_counts_are_summed_over_ranks_so_every_rank_reports_the_same(tmp_path):
    context = mp.get_context(start_method())
    results = context.SimpleQueue()
    processes = [
        context.Process(target=_count_on_rank, args=(rank, 2, tmp_path / "store", results)) for rank in range(2)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0]
    assert sorted(results.get() for _ in processes) == [(0, (3, 20)), (1, (3, 20))]
    assert all_reduce_counts(1, 10, torch.device("cpu")) == (1, 10)  # no process group: local
