"""Final-answer extraction and normalisation for the math evaluation suites (GSM8K, MATH, CHAMP).

Pure string functions: a model completion goes in, a canonical answer string (or None) comes out,
and two canonical answers are compared exactly.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

_NUMBER = re.compile(r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_FINAL_MARKER = re.compile(r"####|answer is", re.IGNORECASE)
_ANSWER_IS = re.compile(r"answer is[:\s]*", re.IGNORECASE)


# --- GSM8K ----------------------------------------------------------------------------------
def normalize_number(text: str) -> str | None:
    """'$1,234.50' -> '1234.5', '18.' -> '18', '-3.0' -> '-3'; None if no number is there."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    canonical = format(value.normalize(), "f")
    return "0" if canonical in ("-0", "0") else canonical


def _first_number(text: str) -> str | None:
    match = _NUMBER.search(text)
    return normalize_number(match.group()) if match else None


def _last_number(text: str) -> str | None:
    matches = _NUMBER.findall(text)
    return normalize_number(matches[-1]) if matches else None


def gsm8k_gold_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K reference solution, normalised."""
    _, sep, tail = solution.rpartition("####")
    answer = normalize_number(tail.strip()) if sep else None
    if answer is None:
        raise ValueError(f"GSM8K solution without a '#### N' answer: {solution[-80:]!r}")
    return answer


def extract_gsm8k_answer(completion: str) -> str | None:
    """A model's final number: the first number after the last ``####`` or "The answer is"
    marker, else the last number in the text."""
    *_, after_last_marker = _FINAL_MARKER.split(completion)
    answer = _first_number(after_last_marker) if after_last_marker != completion else None
    return answer if answer is not None else _last_number(completion)


# --- MATH-style answers ---------------------------------------------------------------------
def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:].removeprefix("\\boxed").removeprefix("\\fbox")
    if rest.startswith(" "):
        return rest.strip().split("$")[0].split()[0] if rest.strip() else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return rest[1:i]
    return None


def extract_math_answer(completion: str) -> str | None:
    """The boxed answer, else what follows the last "The answer is", else None."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    parts = _ANSWER_IS.split(completion)
    if len(parts) > 1:
        answer = parts[-1].strip().split("\n")[0].rstrip(". ").strip("$ ")
        return answer or None
    return None


def _fix_fracs(text: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{2}`` -> ``\frac{1}{2}``."""
    head, *pieces = text.split("\\frac")
    out = head
    for piece in pieces:
        out += "\\frac"
        if piece.startswith("{") or len(piece) < 2:
            out += piece
            continue
        num, den, tail = piece[0], piece[1], piece[2:]
        if den == "{":
            out += "{" + num + "}" + den + tail
        else:
            out += "{" + num + "}{" + den + "}" + tail
    return out


def _fix_sqrt(text: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}``."""
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)


def _fix_slash_fraction(text: str) -> str:
    """``3/4`` (two integers) -> ``\\frac{3}{4}``."""
    match = re.fullmatch(r"(-?\d+)/(\d+)", text)
    return f"\\frac{{{match.group(1)}}}{{{match.group(2)}}}" if match else text


def normalize_math_answer(answer: str) -> str:
    """Canonical form of a MATH-style answer (after Hendrycks et al.'s ``strip_string``)."""
    text = answer.strip().replace("\n", "").replace("\\!", "")
    text = re.sub(r"\\text\{\s*([^{}]*?)\s*\}", r"\1", text)
    text = re.sub(r"\\mbox\{\s*([^{}]*?)\s*\}", r"\1", text)
    for old, new in (
        ("\\\\", "\\"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
        ("$", ""),
        ("\\%", ""),
        ("%", ""),
        ("\\displaystyle", ""),
        ("\\,", ""),
        ("\\;", ""),
    ):
        text = text.replace(old, new)
    text = text.strip().rstrip(".")
    text = re.sub(r"^[a-zA-Z]\s*=\s*", "", text)  # "x = 5" -> "5"
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if text.startswith("."):
        text = "0" + text
    text = _fix_sqrt(text.replace(" ", ""))
    text = _fix_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    text = re.sub(r"(\d)\.0+(?!\d)", r"\1", text)  # trailing ".0" / ".00"
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)  # thousands separators
    return _fix_slash_fraction(text)


def _as_number(text: str) -> Fraction | None:
    r"""A plain number, ``a/b`` or ``\frac{a}{b}`` as an exact fraction, else None."""
    match = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(\d+)\}", text)
    try:
        if match:
            value = Fraction(int(match.group(2)), int(match.group(3)))
            return -value if match.group(1) else value
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def math_answers_equal(predicted: str | None, gold: str) -> bool:
    """Equal after normalisation, or equal as exact numbers (``0.25`` vs ``\\frac{1}{4}``)."""
    if predicted is None:
        return False
    pred, ref = normalize_math_answer(predicted), normalize_math_answer(gold)
    if pred == ref:
        return True
    pred_value, ref_value = _as_number(pred), _as_number(ref)
    return pred_value is not None and pred_value == ref_value


# --- CHAMP ----------------------------------------------------------------------------------
_PROSE = re.compile(r"[A-Za-z]{3,}")
_MATH_WORDS = {"sqrt", "floor", "sum"}


def champ_gold_answers(answer: str) -> list[str]:
    """Auto-gradable forms of a CHAMP answer (``"C(10, 5), or equivalently 252"`` -> both forms);
    empty when the answer is prose ("The limit does not exist") that needs a human or LLM judge."""
    answer = re.sub(r"\s*\(i\.e\.,[^)]*\)$", "", answer.strip())
    forms = re.split(r",\s*or (?:equivalently|approximately|an equivalent form such as)\s*", answer)
    if answer in ("Yes", "No"):
        return [answer]
    return [
        form for form in forms if not set(_PROSE.findall(form)) - _MATH_WORDS and "," not in form and "=" not in form
    ]
