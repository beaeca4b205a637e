"""benchmarks/ as a suite: every spec headed by the `attent bench` command that runs it, the
scripts importing `attent` as installed (no `sys.path` patch) and nothing of tests/, no test
importing a script (a test runs one through its command line), and the results index up to date."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from conftest import REPO

BENCHMARKS = REPO / "benchmarks"
TESTS = REPO / "tests"


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


@pytest.mark.parametrize("spec", sorted(p.name for p in BENCHMARKS.glob("*.yaml")))
def test_a_spec_is_headed_by_its_command(spec):
    assert "attent bench benchmarks/" + spec in (BENCHMARKS / spec).read_text().splitlines()[0]


def test_scripts_patch_no_module_path_and_import_nothing_of_the_tests():
    helpers = {p.stem for p in TESTS.glob("*.py")} | {"<by path>"}
    found = {}
    for script in sorted(BENCHMARKS.glob("*.py")):
        patched = [w for w in ("sys.path.insert", "sys.path.append", "sys.path[") if w in script.read_text()]
        from_tests = sorted(imported(script) & helpers)
        if patched or from_tests:
            found[script.name] = patched + from_tests
    assert found == {}


def test_no_test_imports_a_benchmark_script():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} | {"<by path>"}
    found = {t.name: sorted(imported(t) & scripts) for t in sorted(TESTS.glob("*.py")) if imported(t) & scripts}
    assert found == {}


def test_the_results_index_is_up_to_date():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "results_index.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
