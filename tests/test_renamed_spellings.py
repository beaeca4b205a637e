"""The glossary's words in the code (docs/concepts.md#glossary), and the old spellings of renamed
public names and configuration keys: each still works, warns with a ``FutureWarning`` naming the
new spelling and the release that removes it, and gives what the new spelling gives."""

from __future__ import annotations

import importlib
import warnings

import pytest
from attent.experiment.schema import ConfigError
from attent.selection.deprecation import REMOVED_IN, moved_names, renamed_keys, warn_renamed
from conftest import REPO

REMOVED = rf"will be removed in {REMOVED_IN.replace('.', '[.]')}"


def test_the_warning_names_the_release_that_removes_the_old_spelling():
    assert REMOVED_IN == "0.3.0"
    with pytest.warns(FutureWarning, match=rf"old is deprecated and {REMOVED}: use new"):
        warn_renamed("old", "new")
    with pytest.raises(ValueError, match="both a and b are set"):
        renamed_keys({"a": 1, "b": 2}, {"a": "b"}, "x")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert renamed_keys({"b": 2}, {"a": "b"}, "x") == {"b": 2}  # today's spelling: no warning
    with pytest.raises(AttributeError, match="has no attribute 'other'"):
        moved_names("some.module", {"OLD": "attent.selection.deprecation.REMOVED_IN"})("other")


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("attent.selection.config", "METHODS", "METHOD_NAMES"),
        ("attent.benchmark", "METHODS", "ARMS"),
        ("attent.benchmark.spec", "METHODS", "ARMS"),
        ("attent.benchmark.spec", "EQUAL_COST_METHODS", "EQUAL_COST_ARMS"),
        ("attent.theory.config", "METHODS", "TEACHING_RULES"),
    ],
)
def test_renamed_tables_keep_their_old_names(module, old, new):
    loaded = importlib.import_module(module)
    with pytest.warns(FutureWarning, match=rf"{module}[.]{old} is deprecated and {REMOVED}: use .*[.]{new}") as caught:
        value = getattr(loaded, old)
    assert value is getattr(loaded, new)
    assert caught[0].filename == __file__  # at the caller's line


def test_one_methods_table():
    """``METHODS`` is the selection methods' registry, and its names are ``METHOD_NAMES``."""
    from attent.selection.config import METHOD_NAMES
    from attent.selection.methods import METHODS

    assert tuple(METHODS) == METHOD_NAMES and "random" not in METHODS


def write_benchmark(tmp_path, arms_key: str, arm_key: str):
    path = tmp_path / f"{arms_key}.yaml"
    path.write_text(f"""benchmark:
  name: {arms_key}
  seeds: [0]
  workloads:
    - name: w
      base: {REPO}/experiments/digits_vit.yaml
      overrides: {{train.epochs: 2}}
      metric: eval_test_accuracy
      tune:
        - {{{arm_key}: attent, key: selection.temperature, values: [1, 4]}}
      {arms_key}: {{full: {{}}, attent: {{}}, random: {{}}}}
""")
    return path


def test_a_benchmark_names_its_arms_and_still_reads_methods(tmp_path):
    from attent.benchmark import BenchmarkRun, load_benchmark

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        spec, runs = load_benchmark(write_benchmark(tmp_path, "arms", "arm"))
    with pytest.warns(FutureWarning) as caught:
        old_spec, old_runs = load_benchmark(write_benchmark(tmp_path, "methods", "method"))
    said = {str(w.message) for w in caught}
    assert any("benchmark.workloads[].methods" in m and "benchmark.workloads[].arms" in m for m in said)
    assert any("tune[].method" in m and "tune[].arm" in m for m in said)
    assert old_spec.workloads[0].arms == spec.workloads[0].arms and old_spec.workloads[0].tune == spec.workloads[0].tune
    assert [r.arm for r in old_runs] == [r.arm for r in runs] == ["full", "attent", "random"]
    assert [r.experiment.selection for r in old_runs] == [r.experiment.selection for r in runs]
    with pytest.warns(FutureWarning, match=rf"BenchmarkRun.method is deprecated and {REMOVED}: use BenchmarkRun.arm"):
        assert runs[1].method == "attent"
    with pytest.warns(FutureWarning, match="BenchmarkRun.method"):
        again = BenchmarkRun(
            workload=runs[1].workload,
            method="attent",
            experiment=runs[1].experiment,
            attent_budget=runs[1].attent_budget,
        )
    assert again == runs[1]
    both = write_benchmark(tmp_path, "arms", "arm")
    both.write_text(both.read_text().replace("      arms:", "      methods: {full: {}}\n      arms:"))
    with pytest.raises(ConfigError, match="both methods and arms are set"):
        load_benchmark(both)


def test_the_llm_evaluation_suites_key_and_its_old_spelling(tmp_path):
    import yaml
    from attent.experiment.files import load_experiment

    shipped = REPO / "experiments" / "gsm8k_smollm2.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        new = load_experiment(shipped, ["task.eval.suites=[gsm8k, humaneval]"])
    data = yaml.safe_load(shipped.read_text())
    data["task"]["eval"]["benchmarks"] = data["task"]["eval"].pop("suites")
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    with pytest.warns(FutureWarning, match=rf"task.eval.benchmarks is deprecated and {REMOVED}: use task.eval.suites"):
        old = load_experiment(tmp_path / "old.yaml", ["task.eval.benchmarks=[gsm8k, humaneval]"])
    assert old == new and old.task.eval.suites == ["gsm8k", "humaneval"]
    assert "benchmarks" not in old.task.eval.model_dump()
    data["task"]["eval"]["suites"] = ["math"]
    (tmp_path / "both.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="both benchmarks and suites are set"):
        load_experiment(tmp_path / "both.yaml")


def test_a_layers_old_spelling_overrides_the_new_one_below_it_and_the_reverse():
    """Files and overrides merge layer by layer: whichever spelling a layer uses, the upper layer wins."""
    from attent.experiment.files import load_experiment
    from attent.selection.config import deep_merge
    from attent.theory.config import load

    with pytest.warns(FutureWarning, match="task.eval.benchmarks"):
        cfg = load_experiment(REPO / "experiments" / "gsm8k_smollm2.yaml", ["task.eval.benchmarks=[gsm8k_loss]"])
    assert cfg.task.eval.suites == ["gsm8k_loss"]
    with pytest.warns(FutureWarning, match="task.eval.benchmarks"):
        merged = deep_merge(
            {"task": {"eval": {"benchmarks": ["gsm8k"], "eval_limit": 4}}}, {"task": {"eval": {"suites": ["math"]}}}
        )
    assert merged == {"task": {"eval": {"suites": ["math"], "eval_limit": 4}}}
    with pytest.warns(FutureWarning, match="teach.methods"):
        assert load(REPO / "experiments" / "theory_teaching.yaml", ["teach.methods=[greedy]"]).teach.rules == ["greedy"]
    assert deep_merge({"selection": {"method": "full"}}, {"selection": {"method": "attent"}}) == {
        "selection": {"method": "attent"}
    }  # a key of the same name elsewhere is not renamed


def test_the_llm_suites_module():
    from attent.tasks.llm.evaluation import suites

    assert {"EvalSuite", "CodeSuite", "build_suite", "run_suite"} <= set(vars(suites))
    assert isinstance(suites.build_suite("gsm8k", folder=None, code_timeout=1, code_memory_mb=256), suites.EvalSuite)


def test_the_theory_lab_compares_teaching_rules_and_still_reads_methods():
    from attent.theory.config import build, load

    path = REPO / "experiments" / "theory_teaching.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert load(path).teach.rules == ["greedy", "random", "full"]
    with pytest.warns(FutureWarning, match=rf"teach.methods is deprecated and {REMOVED}: use teach.rules"):
        cfg = build({"teach": {"methods": ["greedy", "full"]}})
    assert cfg.teach.rules == ["greedy", "full"]
    with pytest.warns(FutureWarning, match="TeachConfig.methods"):
        assert cfg.teach.methods == ["greedy", "full"]
    with pytest.raises(ConfigError, match="both methods and rules are set"):
        build({"teach": {"methods": ["greedy"], "rules": ["full"]}})
    with pytest.raises(ConfigError, match="teach.rules: unknown"):
        build({"teach": {"rules": ["magic"]}})
