"""One spelling per concept (the glossary, docs/concepts.md#glossary): attent has no release, so a
renamed word keeps no old spelling. An old one is refused in one line naming the key, and no shim
that would keep one alive is left in the package."""

from __future__ import annotations

import ast

import pytest
from attent.experiment.schema import ConfigError

from tests.helpers.paths import REPO

SHIMS = {"deprecated_arguments", "warn_renamed", "moved_names", "renamed_keys", "renamed_config_keys"}


def test_no_shim_is_left_in_the_package_or_the_report():
    found = []
    for root in (REPO / "platform", REPO / "analysis"):
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
                if name in SHIMS or (isinstance(node, ast.ImportFrom) and (node.module or "").endswith("deprecation")):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


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


def test_a_benchmark_names_its_arms_and_refuses_methods(tmp_path):
    from attent.benchmark import load_benchmark

    spec, runs = load_benchmark(write_benchmark(tmp_path, "arms", "arm"))
    assert [r.arm for r in runs] == ["full", "attent", "random"]
    with pytest.raises(ConfigError, match="methods"):
        load_benchmark(write_benchmark(tmp_path, "methods", "arm"))
    with pytest.raises(ConfigError, match="method"):
        load_benchmark(write_benchmark(tmp_path, "arms", "method"))


def test_the_llm_evaluation_suites_key_and_no_other(tmp_path):
    import yaml
    from attent.experiment.files import load_experiment

    shipped = REPO / "experiments" / "gsm8k_smollm2.yaml"
    new = load_experiment(shipped, ["task.eval.suites=[gsm8k, humaneval]"])
    assert new.task.eval.suites == ["gsm8k", "humaneval"]
    data = yaml.safe_load(shipped.read_text())
    data["task"]["eval"]["benchmarks"] = data["task"]["eval"].pop("suites")
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="eval.benchmarks: unknown key"):
        load_experiment(tmp_path / "old.yaml")


def test_the_llm_suites_module():
    from attent.tasks.llm.evaluation import suites

    assert {"EvalSuite", "CodeSuite", "build_suite", "run_suite"} <= set(vars(suites))
    assert isinstance(suites.build_suite("gsm8k", folder=None, code_timeout=1, code_memory_mb=256), suites.EvalSuite)


def test_the_theory_lab_compares_teaching_rules_and_no_methods():
    from attent.theory.config import build, load

    assert load(REPO / "experiments" / "theory_teaching.yaml").teach.rules == ["greedy", "random", "full"]
    with pytest.raises(ConfigError, match="unknown keys \\['methods'\\]"):
        build({"teach": {"methods": ["greedy", "full"]}})
    with pytest.raises(ConfigError, match="teach.rules: unknown"):
        build({"teach": {"rules": ["magic"]}})
