"""A workload's verdict in sentences (its ``results`` in prose): the selection stage's choices, the
plateau and target sentences, AtteNT's budget and the rows' budget match, and the verdicts its
comparisons earned.
"""

from __future__ import annotations

import math

from attent.analysis.cell_format import percent_cell
from attent.analysis.stats import (
    ALPHA,
    APART,
    BETTER,
    COST_TO_TARGET,
    FINAL,
    INCONCLUSIVE,
    MATCHED,
    PLATEAU_CONFIDENCE,
    PLATEAUED,
    STILL_RISING,
    WORSE,
    Paired,
)
from attent.analysis.time_to_accuracy.results import ATTENT, COMPARATOR_LABELS, FULL, FULL_LONG, WorkloadResult

STILL_IMPROVING = "full data was still improving: this measures the budget, not the selection"


def named(method: str) -> str:
    """The full-data comparators by what they are, other methods by name."""
    return COMPARATOR_LABELS.get(method, method)


def choice_lines(result: WorkloadResult) -> list[str]:
    """One line per choice the selection stage made on validation, in the order it made them."""
    if not result.choices:
        return [
            "No choices recorded on the parent run (no selection stage ran, or an older benchmark): "
            "nothing in this workload was chosen on validation by `attent bench`."
        ]
    lines = []
    for c in result.choices:
        scores = ", ".join(f"{value}: {score:.4f}" for value, score in c.get("scores", {}).items())
        seeds = f", seeds {c['seeds']}" if c.get("seeds") else ""
        lines.append(
            f"{c['key']} = {c['value']} for {c['method']}, by the mean final {c['metric']} over the "
            f"selection runs{seeds} (per value: {scores})."
            + (" It is an end of the candidates tried: a value beyond it may do better." if c.get("at_edge") else "")
        )
    return lines


def plateau_sentence(result: WorkloadResult) -> str:
    p, m = result.plateau, result.metric
    if not p.control:
        return f"Plateau: {p.verdict} (full data for 2E epochs), so nothing shows that full data had plateaued at E."
    if p.reached is None and math.isnan(p.low):
        return f"Plateau: {p.verdict} of {FULL_LONG} and full data (gain {p.mean:+.4f})."
    interval = (
        f"Plateau control: {FULL_LONG} (2E epochs) − full data, final {m}, signed so that positive is an "
        f"improvement: {p.mean:+.4f}, {PLATEAU_CONFIDENCE:.0%} paired interval [{p.low:+.4f}, "
        f"{p.high:+.4f}] over {p.seeds} seeds, against the tolerance {p.tolerance:.4f}: "
    )
    if p.verdict == PLATEAUED:
        return interval + "plateaued (its upper end lies below the tolerance)."
    if p.verdict == STILL_RISING:
        return interval + f"**still improving** (its lower end lies above the tolerance): {STILL_IMPROVING}."
    return interval + f"{p.verdict} (the interval contains the tolerance)."


def target_sentence(result: WorkloadResult) -> str:
    t, sign = result.target, "+" if result.lower else "−"
    return (
        f"Target: {result.metric} {'≤' if result.lower else '≥'} {t.value:.4f} = full data's final value "
        f"{t.reference:.4f} (mean over {t.seeds} seed{'s' if t.seeds != 1 else ''}) {sign} a tolerance of "
        f"{t.tolerance:.4f}, {t.rule}."
    )


def judged_sentences(paired: list[Paired], subject: str = "AtteNT") -> list[str]:
    """A sentence per comparison that earned better, worse or equivalent; one per quantity
    naming those that are inconclusive."""
    lines, inconclusive = [], {}
    for p in paired:
        if not p.judged:
            continue
        if p.verdict == INCONCLUSIVE:
            inconclusive.setdefault(p.quantity, []).append(named(p.method))
            continue
        d = p.places
        tost = f", TOST p (Holm) = {p.p_tost_holm:.3g}" if p.verdict not in (BETTER, WORSE) else ""
        lines.append(
            f"{subject} against {named(p.method)}, {p.quantity}: {p.verdict} (difference {p.mean:+.{d}f}, "
            f"{p.level:.2%} Holm-step interval [{p.low:+.{d}f}, {p.high:+.{d}f}], p (Holm) = "
            f"{p.p_holm:.3g}{tost}, {p.seeds} seeds)."
        )
    lines += [
        f"{quantity[0].upper()}{quantity[1:]}, {INCONCLUSIVE}: {subject} against {', '.join(methods)}."
        for quantity, methods in inconclusive.items()
    ]
    return lines


def family_sentence(result: WorkloadResult) -> str:
    sizes = {q: sum(p.judged for p in result.paired if p.quantity == q) for q in (FINAL, COST_TO_TARGET)}
    return (
        f"Verdicts (AtteNT's): Holm across its {sizes[FINAL]} comparisons of the final metric and, apart, its "
        f'{sizes[COST_TO_TARGET]} of the cost to the target, at {ALPHA}; "equivalent" by a paired TOST within '
        f"± {result.margin:.4g} (final metric; no margin is declared for the cost)."
    )


def verdict(result: WorkloadResult) -> list[str]:
    s = result.summary.set_index("method")
    lines = [plateau_sentence(result), target_sentence(result)]
    if ATTENT not in s.index:
        return lines + ["No AtteNT runs: no budget to match, no comparisons."]
    a = s.loc[ATTENT]
    reached = f"AtteNT stays past the target in {a['reached']} of {a['seeds']} seeds"
    if a["reached"]:
        reached += f", from {a['cost_to_target_s']:.1f} s of method cost (mean over those seeds)"
    if FULL in s.index and s.loc[FULL, "reached"]:
        reached += f"; full data from {s.loc[FULL, 'cost_to_target_s']:.1f} s"
    steps = "" if math.isnan(a["optimizer_steps"]) else f", {a['optimizer_steps']:.0f} optimiser steps"
    if steps and FULL in s.index and not math.isnan(s.loc[FULL, "optimizer_steps"]):
        steps += f" (full data {s.loc[FULL, 'optimizer_steps']:.0f})"
    lines.append(f"{reached}. Its budget: {percent_cell(a['budget'])} of full data's samples back-propagated{steps}.")
    matched = s[s["budget_match"].eq(MATCHED)]
    if len(matched) > 1:
        ordered = matched.sort_values("final_metric", ascending=result.lower)
        lines.append(
            f"At AtteNT's budget, mean final {result.metric} in order (the verdicts below judge the "
            "differences): " + ", ".join(f"{m} {v:.4f}" for m, v in ordered["final_metric"].items()) + "."
        )
    for method, row in s[s["budget_match"].eq(APART)].iterrows():
        lines.append(
            f"{method} trained on another budget ({percent_cell(row['budget'])} of full data's samples, "
            f"AtteNT {percent_cell(a['budget'])}): shown apart, not judged."
        )
    return lines + [family_sentence(result), *judged_sentences(result.paired)]
