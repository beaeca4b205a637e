"""benchmarks/ as a suite: the `attent bench` specs in specs/, each headed by the command that runs
it; the scripts in topic folders, each topic with a README naming its files and their results
folders; every performance script on the one harness (benchmarks/harness.py), the only module path
a script adds; the scripts importing `attent` as installed and nothing of tests/, no test importing
a script (a test runs one through its command line); every results folder named after the spec or
script that made it, and the results index up to date."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO

BENCHMARKS = REPO / "benchmarks"
SPECS = BENCHMARKS / "specs"
RESULTS = BENCHMARKS / "results"
TESTS = REPO / "tests"
TOPICS = sorted(p for p in BENCHMARKS.iterdir() if p.is_dir() and p.name not in ("results", "__pycache__"))
SCRIPTS = sorted(p for topic in TOPICS for p in topic.glob("*.py"))
# what only reads finished runs or code, not the machine: not on the harness
NOT_TIMED = {"run_analysis", "code_reading"}
# results made outside the suite (a run, a sweep, the theory lab, a GPU node's notes), kept beside its studies
MADE_ELSEWHERE = {"antk", "gpu_tier", "paper_tables", "theory"}
HARNESS_PATH = "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))"


def imported(path) -> set[str]:
    """The top-level modules ``path`` imports, anywhere in it (a module loaded from a file path
    counts as ``<by path>``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location":
            names.add("<by path>")
    return names


def is_script(path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text()


def test_the_suite_is_specs_and_topics_with_one_harness():
    assert [p.name for p in BENCHMARKS.glob("*.py")] == ["harness.py"]
    assert list(BENCHMARKS.glob("*.yaml")) == [] and len(list(SPECS.glob("*.yaml"))) >= 10
    assert (BENCHMARKS / "README.md").is_file() and all(not topic.joinpath("__init__.py").exists() for topic in TOPICS)


@pytest.mark.parametrize("spec", sorted(p.name for p in SPECS.glob("*.yaml")))
def test_a_spec_is_headed_by_its_command(spec):
    assert "attent bench benchmarks/specs/" + spec in (SPECS / spec).read_text().splitlines()[0]


@pytest.mark.parametrize("topic", TOPICS, ids=[t.name for t in TOPICS])
def test_a_topic_has_a_readme_naming_its_studies_and_their_results(topic):
    readme = (topic / "README.md").read_text()
    files = sorted(p for p in topic.iterdir() if p.suffix in (".py", ".yaml"))
    assert [p.name for p in files if p.name not in readme] == []
    on_harness = [p for p in files if p.suffix == ".py" and "harness" in imported(p)]
    assert [p.name for p in on_harness if f"results/{p.stem}/" not in readme] == []


def test_every_performance_script_is_on_the_harness_and_patches_only_its_path():
    """A script that times or measures imports the harness (machine, date and commit stamped, results
    written under results/<script>/); the one module-path entry a script adds is benchmarks/ itself,
    for the harness; `attent` comes as installed, and nothing of tests/."""
    helpers = {"tests", "<by path>"} | {p.stem for p in TESTS.rglob("*.py")} - {"__init__"}
    found = {}
    for script in SCRIPTS:
        text = script.read_text()
        timed = is_script(script) and script.parent.name not in NOT_TIMED
        patches = [line.strip() for line in text.splitlines() if re.search(r"sys\.path(\.insert|\.append|\[)", line)]
        wrong = [line for line in patches if not line.startswith(HARNESS_PATH)]
        missing = ["no harness"] if timed and "harness" not in imported(script) else []
        if wrong or missing or imported(script) & helpers:
            found[str(script.relative_to(BENCHMARKS))] = wrong + missing + sorted(imported(script) & helpers)
    assert found == {}


def test_no_test_imports_a_benchmark_script():
    scripts = {p.stem for p in SCRIPTS} | {"harness", "<by path>"}
    found = {
        str(t.relative_to(TESTS)): sorted(imported(t) & scripts)
        for t in sorted(TESTS.rglob("*.py"))
        if imported(t) & scripts
    }
    assert found == {}


def test_results_are_named_after_the_spec_or_script_that_made_them():
    makers = {p.stem for p in SPECS.glob("*.yaml")} | {p.stem for p in SCRIPTS} | MADE_ELSEWHERE
    entries = {p.name if p.is_dir() else p.name.split(".")[0] for p in RESULTS.iterdir() if p.name != "README.md"}
    assert sorted(entries - makers) == []


def test_the_suite_speaks_of_what_it_measures_not_of_its_history():
    pattern = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = [
        f"{p.relative_to(BENCHMARKS)}:{n}"
        for p in sorted(BENCHMARKS.rglob("*"))
        if p.suffix in (".py", ".yaml", ".md") and RESULTS not in p.parents
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def test_the_results_index_is_up_to_date():
    done = subprocess.run(
        [sys.executable, str(REPO / "docs" / "tools" / "results_index.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
