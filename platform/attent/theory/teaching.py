"""The teaching experiment: a learner attention layer taught a fixed random attention layer f*.

The dense set is N random sequences S_i (i.i.d. N(0, 1) entries) with their targets f*(S_i). From
an independent initialisation the learner takes T plain SGD steps θ ← θ − η ∇_θ L_batch on the mean
squared error over the sequences it is shown (every teaching rule: the same η, the same initial θ):

* ``greedy`` — Algorithm 1's teacher: every iteration it scores the whole dense set by the
  discrepancy ‖f_θ(S_i) − f*(S_i)‖_F and shows the m largest (``attent.selection.strategies.select(...,
  "hard")``); the scoring forward pass is part of its cost.
* ``random`` — m sequences drawn uniformly without replacement, afresh every iteration.
* ``full`` — all N sequences every iteration (gradient descent on the full loss).

A run stops after T iterations or once the full-set loss is below ε (``teach.epsilon``). Recorded
per iteration, outside the timed part: the full-set loss (1/(N n d_v) Σ_i ‖f_θ(S_i) − f*(S_i)‖²_F)
and the largest discrepancy; the cumulative wall-clock of the rule's own work (selection
scoring + selection + forward/backward/update); and every ``kernel.every`` iterations the
learner's empirical ANTK on a separate probe set (``attent.theory.tangent_kernel.empirical_kernel``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ..selection.strategies import select
from .config import ProblemConfig, TheoryConfig
from .learner import attend, init_weights
from .tangent_kernel import empirical_kernel


@dataclass
class Problem:
    """One seed's teaching problem."""

    sequences: torch.Tensor  # S_i, [N, n, d]
    contexts: torch.Tensor | None  # cross-attention contexts, [N, n, d]
    targets: torch.Tensor  # f*(S_i), [N, n, d_v]
    probe: tuple[torch.Tensor, ...]  # ANTK probe inputs: sequences (and contexts)
    initial: dict[str, torch.Tensor]  # the learner's initial weights
    target_weights: dict[str, torch.Tensor]
    causal: bool

    def outputs(self, weights, index: torch.Tensor | None = None) -> torch.Tensor:
        take = (lambda x: x) if index is None else (lambda x: x[index])
        contexts = None if self.contexts is None else take(self.contexts)
        return attend(weights, take(self.sequences), contexts, causal=self.causal)

    def discrepancies(self, weights) -> torch.Tensor:
        """‖f_θ(S_i) − f*(S_i)‖_F for every sequence of the dense set."""
        return torch.linalg.vector_norm(self.outputs(weights) - self.targets, dim=(1, 2))

    def kernel(self, weights) -> torch.Tensor:
        return empirical_kernel(
            lambda w, *x: attend(w, x[0], x[1] if len(x) > 1 else None, causal=self.causal),
            weights,
            self.probe,
            chunk=len(self.probe[0]),
        )


def make_problem(cfg: ProblemConfig, probe: int, seed: int) -> Problem:
    """Dense set, f* and the learner's initial weights, all drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    target = init_weights(cfg.dim, cfg.key_dim, cfg.value_dim, scale=cfg.target_scale, generator=gen)
    initial = init_weights(cfg.dim, cfg.key_dim, cfg.value_dim, scale=cfg.init_scale, generator=gen)
    cross, causal = cfg.kind == "cross", cfg.kind == "masked"

    def draw(count: int) -> torch.Tensor:
        return torch.randn(count, cfg.seq_len, cfg.dim, generator=gen)

    sequences, contexts = draw(cfg.num_sequences), draw(cfg.num_sequences) if cross else None
    probe_inputs = (draw(probe), draw(probe)) if cross else (draw(probe),)
    with torch.no_grad():
        targets = attend(target, sequences, contexts, causal=causal)
    return Problem(sequences, contexts, targets, probe_inputs, initial, target, causal)


@dataclass
class RunRecord:
    """One teaching rule × seed: curves indexed by iteration (0 = before the first update)."""

    rule: str
    seed: int
    loss: list[float] = field(default_factory=list)  # full-set mean squared error
    max_discrepancy: list[float] = field(default_factory=list)  # max_i ‖f_θ(S_i) − f*(S_i)‖_F
    time_s: list[float] = field(default_factory=list)  # cumulative method wall-clock
    cpu_s: list[float] = field(default_factory=list)  # cumulative method CPU time (this process)
    kernel_iterations: list[int] = field(default_factory=list)
    kernels: list[torch.Tensor] = field(default_factory=list)  # ANTK on the probe set
    samples_backpropagated: int = 0

    @property
    def iterations(self) -> int:
        return len(self.loss) - 1

    def to_target(self, target: float) -> tuple[int | None, float | None, float | None]:
        """(first iteration with full-set loss ≤ target, method wall-clock and CPU time by then),
        or Nones."""
        for t, value in enumerate(self.loss):
            if value <= target:
                return t, self.time_s[t], self.cpu_s[t]
        return None, None, None


def choose(rule: str, problem: Problem, weights, subset: int, generator: torch.Generator):
    """The sequences of this iteration's update (None: all of them)."""
    if rule == "greedy":
        with torch.no_grad():
            return select(problem.discrepancies(weights), subset, "hard")
    if rule == "random":
        return torch.randperm(len(problem.sequences), generator=generator)[:subset]
    if rule == "full":
        return None
    raise ValueError(f"unknown teaching rule {rule!r}")


def sgd_step(problem: Problem, weights, index, lr: float) -> None:
    targets = problem.targets if index is None else problem.targets[index]
    loss = (problem.outputs(weights, index) - targets).pow(2).mean()
    grads = torch.autograd.grad(loss, list(weights.values()))
    with torch.no_grad():
        for w, g in zip(weights.values(), grads):
            w.sub_(lr * g)


def teach(rule: str, problem: Problem, cfg: TheoryConfig, seed: int) -> RunRecord:
    """Train a copy of the problem's initial learner by the teaching ``rule``; see the module docstring."""
    t_cfg = cfg.teach
    weights = {name: w.clone().requires_grad_(True) for name, w in problem.initial.items()}
    generator = torch.Generator().manual_seed(10_000 + seed)
    record, elapsed = RunRecord(rule, seed), [0.0, 0.0]  # wall-clock, CPU
    observe(record, problem, weights, 0, elapsed, cfg)
    for iteration in range(1, t_cfg.max_iterations + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        index = choose(rule, problem, weights, t_cfg.subset, generator)
        sgd_step(problem, weights, index, t_cfg.lr)
        elapsed[0] += time.perf_counter() - start
        elapsed[1] += time.process_time() - start_cpu
        record.samples_backpropagated += len(problem.sequences) if index is None else len(index)
        done = iteration == t_cfg.max_iterations
        observe(record, problem, weights, iteration, elapsed, cfg)
        if record.loss[-1] < t_cfg.epsilon or not math.isfinite(record.loss[-1]):  # ε reached, or diverged
            done = True
        if done:
            if record.kernel_iterations[-1] != iteration:
                record.kernel_iterations.append(iteration)
                record.kernels.append(problem.kernel(weights))
            break
    return record


def observe(
    record: RunRecord, problem: Problem, weights, iteration: int, elapsed: list[float], cfg: TheoryConfig
) -> None:
    """Untimed evaluation: full-set loss, largest discrepancy, and the ANTK at checkpoints."""
    with torch.no_grad():
        errors = problem.outputs(weights) - problem.targets
    record.loss.append(errors.pow(2).mean().item())
    record.max_discrepancy.append(torch.linalg.vector_norm(errors, dim=(1, 2)).max().item())
    record.time_s.append(elapsed[0])
    record.cpu_s.append(elapsed[1])
    if iteration % cfg.kernel.every == 0:
        record.kernel_iterations.append(iteration)
        record.kernels.append(problem.kernel(weights))


def run_all(cfg: TheoryConfig, progress=print) -> list[RunRecord]:
    """Every teaching rule on every seed, one run at a time (rules interleaved per seed)."""
    torch.set_num_threads(cfg.teach.threads)
    records = []
    for seed in cfg.seeds:
        problem = make_problem(cfg.problem, cfg.kernel.probe, seed)
        for rule in cfg.teach.rules:
            record = teach(rule, problem, cfg, seed)
            reached = [
                f"{target:g} " + (f"at {t} ({seconds:.2f}s)" if t is not None else "not reached")
                for target in cfg.teach.target_losses
                for t, seconds, _ in [record.to_target(target)]
            ]
            progress(
                f"seed {seed} {rule:>6}: loss {record.loss[0]:.4g} -> {record.loss[-1]:.4g} in "
                f"{record.iterations} iterations, {record.time_s[-1]:.2f}s method time; " + ", ".join(reached)
            )
            records.append(record)
    return records
