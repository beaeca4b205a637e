"""The order timed trials run in: seed-major (every configuration of a seed, full data's included,
before any of the next seed), each seed's block rotated, so that a drift of the machine over a long
sweep or benchmark is shared by every configuration. Pure functions and Tune's variant generator;
no Ray cluster, nothing trained."""

from __future__ import annotations

from attent.benchmark import load_benchmark
from attent.benchmark.spec import CALIBRATED_FROM, seed_arms
from attent.contract import base_method
from attent.sweep.spec import launch_order, load_sweep, seed_block
from attent.sweep.tune import _tuner

from tests.helpers.paths import REPO


def test_seed_blocks_rotate_so_no_item_is_always_first_or_last():
    assert seed_block(list("abcd"), 0, 4) == list("abcd")
    assert seed_block(list("abcd"), 1, 4) == list("bcda")
    assert seed_block(list("abcd"), 3, 4) == list("dabc")
    # fewer seeds than items: the starts spread over the items, not 0, 1, 2
    assert [seed_block(list(range(6)), k, 3)[0] for k in range(3)] == [0, 2, 4]
    # more seeds than items: every item starts as often as the others, give or take one
    firsts = [seed_block(list("ab"), k, 5)[0] for k in range(5)]
    assert sorted(firsts) == ["a", "a", "a", "b", "b"]
    assert seed_block([], 1, 3) == [] and seed_block(["x"], 2, 3) == ["x"]
    for n, seeds in ((14, 3), (8, 3), (5, 5), (3, 7)):
        blocks = [seed_block(list(range(n)), k, seeds) for k in range(seeds)]
        assert all(sorted(block) == list(range(n)) for block in blocks)
        assert len({block[0] for block in blocks}) == min(n, seeds)
        assert len({block[-1] for block in blocks}) == min(n, seeds)


def test_launch_order_is_seed_major_and_rotated_per_seed():
    assert launch_order(3, [0, 1, 2]) == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 1), (2, 2), (0, 2), (1, 2)]
    order = launch_order(8, [7, 11, 13])
    assert [seed for _, seed in order] == [7] * 8 + [11] * 8 + [13] * 8  # no seed starts before the last ends
    assert all(sorted(i for i, s in order if s == seed) == list(range(8)) for seed in (7, 11, 13))
    assert launch_order(4, [5]) == [(0, 5), (1, 5), (2, 5), (3, 5)]


def write_sweep(tmp_path, seeds: str = "[0, 1, 2]"):
    path = tmp_path / "order.yaml"
    path.write_text(f"""
sweep:
  name: order
  base: {REPO / "experiments/digits_vit.yaml"}
  overrides:
    train.epochs: 2
    ray.storage_path: {tmp_path / "ray_results"}
    mlflow.tracking_uri: 'sqlite:///{tmp_path / "m.db"}'
  grid:
    selection.strategy: [hard, soft]
  trials:
    - {{selection.preset: null, selection.method: full}}
  seeds: {seeds}
  max_concurrent: 1
""")
    return path


def test_a_sweep_lists_its_trials_seed_major_with_the_ids_of_their_configuration(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path))
    ids = [trial_id for trial_id, _ in sweep.trials]
    assert ids == [*("t00-s0", "t01-s0", "t02-s0"), *("t01-s1", "t02-s1", "t00-s1"), *("t02-s2", "t00-s2", "t01-s2")]
    what = {"t00": ("attent", "hard"), "t01": ("attent", "soft"), "t02": ("full", None)}
    for trial_id, cfg in sweep.trials:  # the id still names the configuration, wherever it runs
        configuration, seed = trial_id.split("-s")
        assert cfg.seed == int(seed) and cfg.name == f"order-{trial_id}"
        method, strategy = what[configuration]
        assert cfg.selection.method == method
        if strategy:
            assert cfg.selection.strategy == strategy


def test_the_sweep_hands_tune_its_trials_in_launch_order_and_tune_keeps_it(tmp_path, monkeypatch):
    from ray import tune
    from ray.tune.experiment import Experiment
    from ray.tune.search.basic_variant import BasicVariantGenerator

    sweep = load_sweep(write_sweep(tmp_path))
    monkeypatch.setattr(tune, "Tuner", lambda trainable, **kwargs: kwargs)  # what the sweep would start
    given = _tuner(sweep, sweep.trials, "parent", str(tmp_path / "ray_results" / "order"), False, 1)
    grid = given["param_space"]["trial"]["grid_search"]
    assert [t["id"] for t in grid] == [trial_id for trial_id, _ in sweep.trials]
    assert [t["experiment"]["seed"] for t in grid] == [0, 0, 0, 1, 1, 1, 2, 2, 2]

    # Tune's grid generator makes the trials in the order of that list
    generator = BasicVariantGenerator()
    generator.add_configurations([Experiment("order", lambda config: None, config={"trial": tune.grid_search(grid)})])
    made = []
    while (trial := generator.next_trial()) is not None:
        made.append(trial.config["trial"]["id"])
    assert made == [t["id"] for t in grid]


def test_benchmark_seeds_rotate_the_free_arms_and_keep_calibrated_arms_after_their_sources():
    arms = ["full", "full_long", "attent", "random", "infobatch", "full_equal_cost", "infobatch_budget"]
    blocks = [seed_arms(arms, k, 3) for k in range(3)]
    assert blocks[0] == arms
    assert blocks[1] == ["full_long", "attent", "random", "infobatch", "full", "full_equal_cost", "infobatch_budget"]
    assert blocks[2] == ["random", "infobatch", "full", "full_long", "attent", "infobatch_budget", "full_equal_cost"]

    spec, runs = load_benchmark(REPO / "benchmarks" / "specs" / "time_to_accuracy_small.yaml", workloads=["fmnist-vit"])
    [workload] = spec.workloads
    seeds = workload.seeds or spec.seeds
    assert [r.experiment.seed for r in runs] == [s for s in seeds for _ in workload.arms]  # seed-major
    by_seed = {s: [r.arm for r in runs if r.experiment.seed == s] for s in seeds}
    for seed, order in by_seed.items():
        assert sorted(order) == sorted(workload.arms)
        for arm in order:
            for source in CALIBRATED_FROM.get(base_method(arm), ()):
                assert order.index(source) < order.index(arm), (seed, arm, source)
    assert len({order[0] for order in by_seed.values()}) == len(seeds)  # full data is not always first
    assert len({order.index("full") for order in by_seed.values()}) > 1
