"""The time-to-accuracy benchmark's numbers from its runs and curves (``tta_runs``): full data's
plateau and the target, the per-run and per-method tables, budgets and standings, paired
t-intervals against AtteNT, the variants against full data, and the temperature table.
``analysis.time_to_accuracy`` states the method and renders the report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from scipy import stats

from analysis.render import percent_cell
from analysis.runs import ReportError
from analysis.tta_runs import METHOD
from attent import contract  # the names the engine logs (no engine import)

LABEL = f"tags.{contract.TAG_LABEL}"
TEMPERATURE = "params.selection.temperature"
FULL, ATTENT = contract.METHOD_FULL, contract.METHOD_ATTENT
EQUAL_COST, INFOBATCH_BUDGET = contract.METHOD_FULL_EQUAL_COST, contract.METHOD_INFOBATCH_BUDGET
TEMPERATURE_METHODS = ("soft", ATTENT)  # base methods whose temperature the report sets side by side
# Row order within a standing: by base method (the part before "+"), then by name.
METHOD_ORDER = (FULL, EQUAL_COST, ATTENT, "hard", "soft", "random", INFOBATCH_BUDGET, "infobatch")
OVERHEADS = {"scoring_s": contract.time_metric("scoring"), "selection_s": contract.time_metric("selection"),
             "eval_s": contract.time_metric("eval"), "checkpoint_s": contract.time_metric("checkpoint"),
             "startup_s": contract.TIME_STARTUP, "teardown_s": contract.TIME_TEARDOWN}

BUDGET_TOLERANCE = 0.02      # relative difference of budgets still called matched
ACCURACY_TOLERANCE = 0.005   # the target's absolute tolerance for a higher-is-better metric
LOSS_TOLERANCE = 0.01        # the target's relative tolerance for a lower-is-better metric
CONFIDENCE = 0.95

# A row's standing: the reference (full data), matched to AtteNT's budget, or apart from it.
REFERENCE, MATCHED, APART = "reference", "matched", "apart"
# Per-run quantities, summarized per method as <name>, <name>_std and <name>_n.
QUANTITIES = ("final_metric", "cost_to_target_s", "method_cost_s", "wallclock_s", "samples_backpropagated",
              "budget", "mean_selected_ratio", "ideal_saving", "realized_saving", "hardness", "overlap",
              "agreement", "scoring_share", *OVERHEADS)

@dataclass
class Plateau:
    """Full data's last quarter of epochs, over seeds."""
    epochs: tuple[int, int]     # first and last epoch (1-based) of the last quarter
    since: int                  # the epoch the movement is measured from (the one before the quarter)
    movement: float             # improvement of the mean curve over the quarter (its good direction)
    seed_std: float             # std over seeds of full data's final value (NaN for one seed)
    value: float                # mean over seeds of the last quarter's evaluations
    seeds: int

    @property
    def reached(self) -> bool | None:
        """True: full data had plateaued; False: still improving; None: one seed, no spread."""
        if self.seeds < 2 or math.isnan(self.seed_std):
            return None
        return self.movement <= 0 or self.movement < self.seed_std


@dataclass
class Target:
    value: float
    tolerance: float
    rule: str                   # how the tolerance was chosen, in words


@dataclass
class Paired:
    """One method against AtteNT over the seeds both ran: AtteNT's minus the method's."""
    method: str
    standing: str
    quantity: str               # "final metric" or "cost to target (s)"
    seeds: int                  # paired seeds with a value on both sides
    mean: float
    low: float
    high: float
    better_when: str            # "higher" or "lower": the sign of the difference that favours AtteNT
    note: str = ""              # why there is no verdict, or the seeds that reached the target

    @property
    def verdict(self) -> str:
        if self.standing == APART:
            return f"not judged: {self.note}"
        if self.seeds == 0:
            return f"no paired seeds{'; ' + self.note if self.note else ''}"
        if self.seeds < 2 or math.isnan(self.low):
            return f"no interval: 1 paired seed{'; ' + self.note if self.note else ''}"
        good = self.low > 0 if self.better_when == "higher" else self.high < 0
        bad = self.high < 0 if self.better_when == "higher" else self.low > 0
        return "AtteNT better" if good else "AtteNT worse" if bad else "indistinguishable at 95 %"

    @property
    def places(self) -> int:
        """Decimals to show: seconds to 0.1 s, the metric to 4."""
        return 1 if self.quantity.endswith("(s)") else 4

    def record(self) -> dict[str, object]:
        return {"method": self.method, "standing": self.standing, "quantity": self.quantity,
                "paired_seeds": self.seeds, "attent_minus_method": self.mean, "low_95": self.low,
                "high_95": self.high, "attent_better_when": self.better_when, "verdict": self.verdict}


# --- statistics ------------------------------------------------------------------------------------

def numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column as floats; all NaN where nobody logged it."""
    if column not in frame:
        return pd.Series(math.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)


def mean_std(values: pd.Series) -> tuple[float, float, int]:
    """Mean, sample std (ddof=1; NaN for fewer than 2 values) and count of the values present."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return math.nan, math.nan, 0
    return float(values.mean()), (float(values.std(ddof=1)) if len(values) > 1 else math.nan), len(values)


def t_interval(differences: pd.Series) -> tuple[float, float, float, int]:
    """Mean and 95 % Student-t interval of paired differences (NaN bounds for fewer than 2)."""
    d = pd.to_numeric(differences, errors="coerce").dropna()
    if len(d) < 2:
        return (float(d.mean()) if len(d) else math.nan), math.nan, math.nan, len(d)
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half), len(d)


def base_method(name: str) -> str:
    """``soft+T0.1`` -> ``soft``: the method a named variant is a variant of."""
    return str(name).split("+", 1)[0]


def plateau_of(full_curves: pd.DataFrame, lower: bool, epochs: int | None = None) -> Plateau:
    """Full data's last quarter (ceil(E / 4) epochs, at least one): how far the mean curve over
    seeds moved in its good direction from the last evaluation before the quarter (the first in
    it where there is none) to the last, the seed std of the final value, and the mean of the
    quarter's evaluations."""
    evaluated = full_curves[full_curves["value"].notna()]
    if evaluated.empty:
        raise ReportError("full data logged no evaluation of the curve metric")
    last = int(epochs or evaluated["epoch"].max())
    first = last - max(1, math.ceil(last / 4)) + 1
    mean_curve = evaluated.groupby("epoch")["value"].mean().sort_index()
    before = mean_curve[mean_curve.index < first]
    since = int(before.index[-1]) if not before.empty else int(mean_curve.index[0])
    change = float(mean_curve.iloc[-1] - mean_curve.loc[since])
    quarter = evaluated[evaluated["epoch"] >= first]
    by_run = (quarter if not quarter.empty else evaluated).sort_values("epoch").groupby("run_id")["value"]
    finals = by_run.last()
    return Plateau((first, last), since, -change if lower else change,
                   float(finals.std(ddof=1)) if len(finals) > 1 else math.nan,
                   float(by_run.mean().mean()), len(finals))


def target_of(plateau: Plateau, lower: bool, tolerance: float | None = None) -> Target:
    """Full data's plateau less the tolerance (plus it, for a lower-is-better metric)."""
    spread = 0.0 if math.isnan(plateau.seed_std) else plateau.seed_std
    if tolerance is not None:
        floor, floor_words = tolerance, f"the tolerance given for this workload, {tolerance:.4g}"
    elif lower:
        floor = LOSS_TOLERANCE * abs(plateau.value)
        floor_words = f"{LOSS_TOLERANCE:.0%} of the plateau, {floor:.4f}"
    else:
        floor, floor_words = ACCURACY_TOLERANCE, f"{ACCURACY_TOLERANCE} absolute"
    slack = max(floor, spread)
    spread_words = ("no seed std (one seed)" if math.isnan(plateau.seed_std)
                    else f"the seed std of full data's final value, {plateau.seed_std:.4f}")
    rule = f"the larger of {floor_words} and {spread_words}"
    return Target(plateau.value + slack if lower else plateau.value - slack, slack, rule)


def time_to_target(curve: pd.DataFrame, target: float, lower: bool) -> float:
    """Method cost at the first evaluation reaching ``target``; NaN when none does. ``curve``:
    ``cost`` (or ``method_cost_s``, cumulative) and ``value`` per epoch."""
    cost = curve["cost"] if "cost" in curve else curve["method_cost_s"]
    reached = curve["value"] <= target if lower else curve["value"] >= target
    hits = cost[reached & curve["value"].notna()]
    return float(hits.min()) if not hits.empty else math.nan


# --- tables ----------------------------------------------------------------------------------------

def per_run_table(runs: pd.DataFrame, curves: pd.DataFrame, metric: str, target: float,
                  lower: bool) -> pd.DataFrame:
    """One row per run: its final metric, cost to the target, costs, savings against full data of
    its seed, budget, the mean hardness and overlap of its picks over epochs, the agreement of
    training and scoring losses, and the share of its ideal saving (in full data's method cost)
    that its scoring passes spent."""
    full = runs[runs[METHOD].eq(FULL)].set_index("seed")
    backprop, cost = f"metrics.{contract.SAMPLES_BACKPROPAGATED}", f"metrics.{contract.TIME_METHOD}"

    def of_full(column: str, any_seed: bool = False) -> pd.Series:
        """Full data's value of the run's seed (or, with ``any_seed``, its mean where that seed
        has none)."""
        values = numeric(full, column)
        matched = runs["seed"].map(values).astype(float)
        return matched.fillna(values.mean()) if any_seed else matched

    by_run = curves.groupby("run_id")
    last_value = curves[curves["value"].notna()].sort_values("epoch").groupby("run_id")["value"].last()
    final = numeric(runs, f"metrics.{metric}").fillna(runs["run_id"].map(last_value))
    samples = numeric(runs, backprop)
    selected = numeric(runs, f"metrics.{contract.MEAN_SELECTED_RATIO}")
    budget = (samples / of_full(backprop, any_seed=True)).fillna(selected)
    method_cost = numeric(runs, cost)
    ideal = 1 - samples / of_full(backprop)
    realized = 1 - method_cost / of_full(cost)
    reach = [time_to_target(curves[curves["run_id"].eq(r)], target, lower) for r in runs["run_id"]]
    return pd.DataFrame({
        "run_id": runs["run_id"], "method": runs[METHOD], "seed": runs["seed"],
        "label": runs[LABEL] if LABEL in runs else runs[METHOD],
        "temperature": numeric(runs, TEMPERATURE),
        "final_metric": final, "cost_to_target_s": reach, "reached": pd.notna(reach),
        "method_cost_s": method_cost, "wallclock_s": numeric(runs, f"metrics.{contract.TIME_WALLCLOCK}"),
        "samples_backpropagated": samples, "budget": budget,
        "mean_selected_ratio": selected,
        "ideal_saving": ideal, "realized_saving": realized,
        "realized_over_ideal": realized / ideal.where(ideal.abs() > 1e-9),
        "hardness": runs["run_id"].map(by_run["hardness"].mean()).astype(float),
        "overlap": runs["run_id"].map(by_run["overlap"].mean()).astype(float),
        "agreement": runs["run_id"].map(by_run["agreement"].mean()).astype(float),
        "scoring_share": numeric(runs, f"metrics.{OVERHEADS['scoring_s']}") / (ideal * of_full(cost)).where(ideal > 1e-9),
        **{name: numeric(runs, f"metrics.{m}") for name, m in OVERHEADS.items()},
    }).reset_index(drop=True)


def order_key(method: str) -> tuple[int, str]:
    base = base_method(method)
    return (METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER), method)


def summarize(per_run: pd.DataFrame) -> pd.DataFrame:
    """One row per method: mean, std and n of every per-run quantity, the seeds that reached the
    target, and its standing against AtteNT's budget; reference, matched, then apart rows."""
    rows = []
    for method, group in per_run.groupby("method", sort=False):
        temperatures = group["temperature"].dropna().unique()
        row = {"method": method, "label": group["label"].iloc[0],
               "temperature": float(temperatures[0]) if len(temperatures) == 1 else math.nan,
               "seeds": len(group), "reached": int(group["reached"].sum())}
        for column in QUANTITIES:
            row[column], row[column + "_std"], row[column + "_n"] = mean_std(group[column])
        rows.append(row)
    summary = pd.DataFrame(rows)
    summary["realized_over_ideal"] = summary["realized_saving"] / summary["ideal_saving"].where(
        summary["ideal_saving"].abs() > 1e-9)
    summary["standing"] = standings(summary)
    summary["matched"] = summary["standing"].eq(MATCHED)
    rank = {REFERENCE: 0, MATCHED: 1, APART: 2}
    keys = [(rank[s], *order_key(m)) for s, m in zip(summary["standing"], summary["method"])]
    return summary.iloc[sorted(range(len(summary)), key=keys.__getitem__)].reset_index(drop=True)


def attent_budget(summary: pd.DataFrame) -> float:
    budget = summary.loc[summary["method"].eq(ATTENT), "budget"]
    return float(budget.iloc[0]) if len(budget) else math.nan


def standings(summary: pd.DataFrame) -> list[str]:
    """Full data: the reference; AtteNT and full data at equal cost: matched; others matched
    where their budget is within BUDGET_TOLERANCE (relative) of AtteNT's, else apart."""
    reference = attent_budget(summary)
    out = []
    for method, budget in zip(summary["method"], summary["budget"]):
        if method == FULL:
            out.append(REFERENCE)
        elif method in (ATTENT, EQUAL_COST):
            out.append(MATCHED)
        else:
            close = abs(budget - reference) <= BUDGET_TOLERANCE * reference  # False for NaN
            out.append(MATCHED if close else APART)
    return out


def paired_comparisons(per_run: pd.DataFrame, summary: pd.DataFrame, lower: bool) -> list[Paired]:
    """Every other method against AtteNT, seed by seed: the final metric and the cost to reach
    the target (over the seeds where both reached it). Rows apart from AtteNT's budget get the
    numbers but no verdict."""
    attent = per_run[per_run["method"].eq(ATTENT)].set_index("seed")
    if attent.empty:
        return []
    standing = dict(zip(summary["method"], summary["standing"]))
    reference = attent_budget(summary)
    out = []
    for method in summary["method"]:
        if method == ATTENT:
            continue
        other = per_run[per_run["method"].eq(method)].set_index("seed")
        seeds = attent.index.intersection(other.index)
        a, o = attent.loc[seeds], other.loc[seeds]
        budget = float(summary.loc[summary["method"].eq(method), "budget"].iloc[0])
        apart = (f"budget {percent_cell(budget)} of full data's samples against AtteNT's "
                 f"{percent_cell(reference)}") if standing[method] == APART else ""
        mean, low, high, n = t_interval(a["final_metric"] - o["final_metric"])
        out.append(Paired(method, standing[method], "final metric", n, mean, low, high,
                          "lower" if lower else "higher", apart))
        both = a["reached"] & o["reached"]
        mean, low, high, n = t_interval((a["cost_to_target_s"] - o["cost_to_target_s"])[both])
        reached = (f"reached the target: AtteNT {int(a['reached'].sum())}/{len(seeds)}, "
                   f"{method} {int(o['reached'].sum())}/{len(seeds)}")
        out.append(Paired(method, standing[method], "cost to target (s)", n, mean, low, high, "lower",
                          apart or (reached if n < len(seeds) else "")))
    return out


def temperature_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Soft and AtteNT rows (variants included) by temperature, where there are two or more."""
    rows = summary[summary["method"].map(base_method).isin(TEMPERATURE_METHODS) & summary["temperature"].notna()]
    if rows["temperature"].nunique() < 2:
        return pd.DataFrame()
    return rows.sort_values(["temperature", "method"])[
        ["method", "temperature", "hardness", "hardness_std", "hardness_n", "final_metric", "final_metric_std",
         "final_metric_n", "budget", "standing"]].reset_index(drop=True)


def variant_table(per_run: pd.DataFrame, summary: pd.DataFrame, lower: bool) -> pd.DataFrame:
    """The variants of a method (names with a "+", e.g. attent+stale): each one's saving, the
    share of it its scoring spent, the agreement of training and scoring losses, and its final
    metric paired, seed by seed, against full data, full data at equal cost and the method it
    varies (95 % t intervals: better, worse or indistinguishable)."""
    rows = []
    for method in summary["method"]:
        if "+" not in str(method):
            continue
        mine = per_run[per_run["method"].eq(method)].set_index("seed")
        row = summary[summary["method"].eq(method)].iloc[0].to_dict()
        for against in (FULL, EQUAL_COST, base_method(method)):
            other = per_run[per_run["method"].eq(against)].set_index("seed")
            seeds = mine.index.intersection(other.index)
            mean, low, high, n = t_interval(mine.loc[seeds, "final_metric"] - other.loc[seeds, "final_metric"])
            good = (high < 0) if lower else (low > 0)
            bad = (low > 0) if lower else (high < 0)
            key = "base" if against == base_method(method) else against
            row.update({f"vs_{key}": mean, f"vs_{key}_low": low, f"vs_{key}_high": high, f"vs_{key}_n": n,
                        f"vs_{key}_verdict": ("no interval" if n < 2 or math.isnan(low) else
                                              "better" if good else "worse" if bad else "indistinguishable")})
        rows.append(row)
    return pd.DataFrame(rows)
