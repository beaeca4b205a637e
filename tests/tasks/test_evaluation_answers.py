"""Answer extraction and normalisation on real GSM8K answers and hand-written model outputs."""

import json
import re

import pytest
from attent.tasks.llm.evaluation.answers import (
    champ_gold_answers,
    extract_gsm8k_answer,
    extract_math_answer,
    gsm8k_gold_answer,
    last_boxed,
    math_answers_equal,
    normalize_math_answer,
    normalize_number,
)

from tests.helpers.paths import DATASETS

GSM8K_TEST = DATASETS / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def gsm8k_test() -> list[dict]:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"{GSM8K_TEST} not present")
    return [json.loads(line) for line in GSM8K_TEST.read_text().splitlines()]


def test_gold_answers_of_all_gsm8k_test_problems_parse_to_integers(gsm8k_test):
    golds = [gsm8k_gold_answer(p["answer"]) for p in gsm8k_test]
    assert len(golds) == 1319
    assert all(re.fullmatch(r"-?\d+", g) for g in golds)
    raw = {p["answer"].split("####")[-1].strip(): g for p, g in zip(gsm8k_test, golds, strict=True)}
    assert raw["2,125"] == "2125" and raw["1,450,000"] == "1450000"


def test_reference_solutions_read_as_model_outputs_are_graded_correct(gsm8k_test):
    assert all(extract_gsm8k_answer(p["answer"]) == gsm8k_gold_answer(p["answer"]) for p in gsm8k_test)


def test_gold_without_marker_is_an_error():
    with pytest.raises(ValueError):
        gsm8k_gold_answer("She has 5 apples.")


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("Janet sells 9 eggs.\nShe makes 9 * 2 = $18.\n#### 18", "18"),
        ("She makes $18 every day. The answer is: 18", "18"),
        ("The answer is $1,250.", "1250"),
        ("So the total is 3 + 4 = 7.\nThe answer is 7. Next question: what is 12 + 30?", "7"),
        ("First 12 apples, then 30 more, so 42 apples in total.", "42"),
        ("The answer is: -3", "-3"),
        ("It costs 4.50 dollars, so 9.00 for two. #### 9.00", "9"),
        ("The profit is 70,000 dollars.", "70000"),
        ("Half of it: 0.5", "0.5"),
        ("I cannot solve this.", None),
    ],
)
def test_gsm8k_answer_extraction(completion, expected):
    assert extract_gsm8k_answer(completion) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("$1,234.50", "1234.5"),
        ("18.", "18"),
        ("-3.0", "-3"),
        ("100", "100"),
        ("0.0", "0"),
        ("abc", None),
        ("1e5", "100000"),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{1} then \boxed{x^{2}+1}", r"x^{2}+1"),
        (r"\fbox{7}", "7"),
        (r"\boxed 5$", "5"),
        ("no box here", None),
        (r"\boxed{unclosed", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        (r"Thus the result is $\boxed{\dfrac{3}{4}}$.", r"\dfrac{3}{4}"),
        ("Adding them up gives 10.\nThe answer is: \\frac{1}{2}", r"\frac{1}{2}"),
        ("The answer is: $12$.", "12"),
        ("no final answer", None),
    ],
)
def test_extract_math_answer(completion, expected):
    assert extract_math_answer(completion) == expected


@pytest.mark.parametrize(
    "answer, normalized",
    [
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\tfrac12", r"\frac{1}{2}"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        ("5.0", "5"),
        ("5.00", "5"),
        ("0.5", r"\frac{1}{2}"),
        ("3/4", r"\frac{3}{4}"),
        (r"90^\circ", "90"),
        (r"\$5", "5"),
        (r"10\%", "10"),
        (r"x = 3", "3"),
        (r"\sqrt2", r"\sqrt{2}"),
        (r"\text{(B)}", "(B)"),
        ("1,000", "1000"),
        (".5", r"\frac{1}{2}"),
        ("12.", "12"),
    ],
)
def test_normalize_math_answer(answer, normalized):
    assert normalize_math_answer(answer) == normalized


@pytest.mark.parametrize(
    "predicted, gold, equal",
    [
        (r"\frac{1}{4}", "0.25", True),
        (r"\dfrac{3}{4}", "3/4", True),
        ("2.50", "2.5", True),
        (r"\left(2,3\right)", "(2, 3)", True),
        ("7", "8", False),
        (None, "8", False),
        (r"\frac{1}{3}", "0.33", False),
    ],
)
def test_math_answers_equal(predicted, gold, equal):
    assert math_answers_equal(predicted, gold) is equal


@pytest.mark.parametrize(
    "answer, forms",
    [
        ("239", ["239"]),
        ("C(10, 5), or equivalently 252", ["252"]),
        ("5/14, or approximately 35.7%", ["5/14", "35.7%"]),
        ("100 (i.e., all values)", ["100"]),
        ("sqrt(3)/3, or equivalently 1/sqrt(3)", ["sqrt(3)/3", "1/sqrt(3)"]),
        ("No", ["No"]),
        ("The limit does not exist", []),
        ("x=6, y=5", []),
    ],
)
def test_champ_gold_answers(answer, forms):
    assert champ_gold_answers(answer) == forms
