"""The code's structure, as docs/contributing.md (Layout) draws it: imports point one way (the command line,
cli, over sweep, benchmark, lab and server, over the engine, over the experiment schema, the tasks and the
theory's maths, over selection; attent.analysis, at the top level in analysis/, reads MLflow through the contract
only, its two reports apart and its statistics module at the bottom), no module imports itself back through
another, every task package is self-contained, the package's top holds its parts and little else, and platform/ is
no package (it would shadow the standard library's ``platform``, which Ray and torch import)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

PLATFORM = REPO / "platform"
ANALYSIS = REPO / "analysis"  # installed as attent.analysis (pyproject.toml)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports, at its top or inside a function, by full name
    (``from attent import contract`` imports ``attent.contract``, not the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def project_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (attent.*, attent.analysis.* among them)."""
    files = {module_name(p, PLATFORM): p for p in (PLATFORM / "attent").rglob("*.py")}
    files |= {f"attent.{module_name(p, REPO)}": p for p in ANALYSIS.rglob("*.py")}
    return {name: imports_of(path, name, set(files)) for name, path in files.items()}


GRAPH = project_graph()


def reaches(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_module_imports_itself_back():
    # A package's __init__ importing its own submodules is no cycle a reader follows; any other is.
    cycles = sorted(
        name for name in GRAPH if name in reaches(name) and not all(m.startswith(name + ".") for m in GRAPH[name])
    )
    assert cycles == []


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "attent" and len(parts) > 1 else parts[0]


# The parts of the package from the bottom up: a part imports only parts on a lower level (none on its own
# level but itself), so no arrow points back up.
LEVELS = [
    {"selection"},  # the selection library
    {"contract", "integrations"},  # MLflow's names (the selection's metric names among them); AtteNT in users' loops
    {"tasks"},  # the Task interface and the workloads
    {"experiment"},  # the experiment file's schema (its task sections from the registry) and its reading
    {"theory", "cost"},  # the theory lab's maths and the empirical ANTK; `attent plan`'s estimate
    {"engine"},  # the run on Ray Train and in MLflow
    {"server", "analysis"},  # the tracking server; the report
    {"sweep", "lab"},  # Ray Tune sweeps (their own tracking server); the theory lab's runner
    {"benchmark", "rehearsal"},  # `attent bench`: seed blocks as a sweep's; `attent rehearse`: a file's stand-in
    {"cli"},  # the command line
]
LEVEL = {part: level for level, parts in enumerate(LEVELS) for part in parts}

# what each part of the platform may import (besides itself)
MAY_IMPORT = {
    "selection": set(),
    "contract": {"selection"},  # the metric names every integration logs too (selection.metric_names)
    "integrations": {"selection"},  # on the selection library only, never on the engine
    "tasks": {"contract", "integrations"},  # the LLM task packs rows as the SFT trainer does (integrations.packed)
    "experiment": {"contract", "selection", "tasks"},
    "theory": {"experiment", "selection"},  # pure maths: no engine, no MLflow
    "cost": {"experiment", "selection", "tasks"},  # the plan's work, the tasks' probes: no Ray, no MLflow
    # the Selector users get, selection.selector (test_the_engine_selects_through_the_selector)
    "engine": {"contract", "experiment", "selection", "tasks", "theory"},
    "server": {"engine", "experiment"},  # the engine's tracking defaults, the store's URIs
    "analysis": {"contract"},
    "sweep": {"contract", "engine", "experiment", "selection", "server"},
    "lab": {"contract", "engine", "experiment", "theory"},
    "benchmark": {"analysis", "contract", "engine", "experiment", "selection", "sweep"},
    "rehearsal": {"analysis", "engine", "experiment", "selection", "sweep", "tasks"},
    "cli": set(LEVEL) - {"cli"},  # any part
}


def test_every_part_has_a_level_and_its_imports():
    parts = {layer(name) for name in GRAPH} - {"attent"}  # attent/__init__.py: its lazy public names
    assert parts == set(MAY_IMPORT) == set(LEVEL)


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_no_import_points_back_up(part):
    assert sorted(m for m in MAY_IMPORT[part] if LEVEL[m] >= LEVEL[part]) == []


MAX_LOOSE_MODULES = 6


def test_the_package_top_holds_its_parts_not_loose_modules():
    """platform/attent/ holds packages by role (cli/, server/, experiment/, sweep/, lab/, ...): beside them
    only __init__.py and a module every part shares (contract.py), never more than six."""
    loose = sorted(path.name for path in (PLATFORM / "attent").glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, loose
    assert {"__init__.py", "contract.py"} <= set(loose)


def test_the_engine_selects_through_the_selector():
    """The engine selects through the Selector users get (attent.selection.selector), and through no
    framework adapter; the adapters sit on the Selector too."""
    engine = {m for name in GRAPH if layer(name) == "engine" for m in GRAPH[name]}
    assert "attent.selection.selector" in engine and not {m for m in engine if layer(m) == "integrations"}
    adapters = {m for name in GRAPH if layer(name) == "integrations" for m in GRAPH[name] if layer(m) == "selection"}
    assert "attent.selection.selector" in adapters


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_imports_point_one_way(part):
    crossing = sorted(
        f"{name} -> {m}"
        for name in GRAPH
        if layer(name) == part
        for m in GRAPH[name]
        if layer(m) != part and layer(m) not in MAY_IMPORT[part]
    )
    assert crossing == []


def test_the_report_statistics_have_nothing_above_them():
    """attent.analysis.stats (the target rule, Holm steps, paired intervals, TOST, the plateau rule) imports no
    other module of the analysis package (its __init__, which holds ReportError, is loaded before any of its
    modules anyway): every report judges through it, none through another report."""
    assert GRAPH["attent.analysis.stats"] <= {"attent.contract", "attent.analysis"}


@pytest.mark.parametrize("report,other", [("paper_tables", "time_to_accuracy"), ("time_to_accuracy", "paper_tables")])
def test_the_two_reports_import_neither_each_other(report, other):
    """The paper tables and the time-to-accuracy report share only what lies beneath both (stats, mlflow_runs,
    cell_format)."""
    mine, theirs = f"attent.analysis.{report}", f"attent.analysis.{other}"
    crossing = sorted(
        f"{name} -> {m}"
        for name in GRAPH
        if name == mine or name.startswith(mine + ".")
        for m in GRAPH[name]
        if m == theirs or m.startswith(theirs + ".")
    )
    assert crossing == []


def test_no_analysis_module_imports_the_report_command():
    """attent.analysis.command (``attent report``'s parser and dispatch) is the top: what the others share lives
    below it."""
    above = sorted(name for name in GRAPH if layer(name) == "analysis" and "attent.analysis.command" in GRAPH[name])
    assert above == []


@pytest.mark.parametrize("task", ["llm", "mae", "vision"])
def test_a_task_package_imports_only_itself_and_the_task_interface(task):
    shared = {
        "attent.contract",
        "attent.tasks.task",
        "attent.tasks.config",
        "attent.tasks.vit",
        "attent.tasks.weights",
        "attent.tasks.cache",  # the decoded cache of the image tasks' files
        "attent.tasks.batches",  # the image tasks' batches of tensor items
        "attent.integrations.packed",  # packed rows' attention check, as AtteNTSFTTrainer's
    }
    own = f"attent.tasks.{task}"
    outside = sorted(
        f"{name} -> {m}"
        for name in GRAPH
        if name == own or name.startswith(own + ".")
        for m in GRAPH[name]
        if not (m == own or m.startswith(own + ".")) and m not in shared
    )
    assert outside == []


def test_platform_is_no_package():
    assert not (PLATFORM / "__init__.py").exists()


@pytest.mark.parametrize("part", ["selection", "integrations", "theory", "experiment"])
def test_selection_integrations_theory_and_the_schema_need_neither_ray_nor_mlflow(part):
    """Usable in any PyTorch loop (and the theory's maths, and the experiment schema, anywhere): no Ray, no
    MLflow, at the top or inside a function."""
    found = set()
    for path in (PLATFORM / "attent" / part).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found |= {f"{path.name}: {n}" for n in names if n.split(".")[0] in ("ray", "mlflow")}
    assert found == set()


def test_the_recipe_and_a_benchmark_run_need_neither_ray_mlflow_nor_datasets():
    """The recipe, the LLM task and the benchmark's run building, selection-stage choice and
    equal-cost calibration import with all three blocked: Ray and MLflow are imported where a run
    trains or is recorded (on a bare GPU node, `attent bench --local` needs the ray package, no
    cluster), and a lent GPU node has no `datasets`."""
    code = """
import sys
for name in ("ray", "mlflow", "datasets"):
    sys.modules[name] = None  # any import of them raises ImportError
import attent.engine.recipe, attent.tasks.llm.task, attent.tasks.llm.evaluation.mt_bench
from attent import contract
from attent.benchmark import choose, equal_cost_epochs, load_benchmark, selection_runs
spec, runs = load_benchmark("benchmarks/specs/llm_size.yaml", workloads=["gsm8k-128"])
workload = spec.workloads[0]
tune = workload.tune[0]
assert len(selection_runs("benchmarks/specs/llm_size.yaml", workload, tune, [])) == len(tune.values)
value, _ = choose(tune, {2: [1.3], 4: [1.25], 8: [1.23]}, contract.lower_is_better(workload.selection_metric()))
assert value == 8 and equal_cost_epochs(8, 29.7, 39.2) == 6
print(len(runs))
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": f"{PLATFORM}:{REPO}"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["18"]


MAX_LINES = 400
MAX_FUNCTION_LINES = 60
PROJECT_PARTS = ("platform", "analysis", "benchmarks", "docs", "experiments", "tests", "examples")


def project_modules() -> list[Path]:
    """Every Python module of the project, outside a virtual environment."""
    return [
        path
        for part in PROJECT_PARTS
        for path in sorted((REPO / part).rglob("*.py"))
        if ".venv" not in path.relative_to(REPO).parts
    ]


def test_no_module_over_400_lines():
    """No Python module of the project is longer than 400 lines: a longer one is split by
    responsibility, its shared helpers moved to a module of their own."""
    too_long = sorted(
        f"{path.relative_to(REPO)} ({lines} lines)"
        for path in project_modules()
        for lines in [len(path.read_text(encoding="utf-8").splitlines())]
        if lines > MAX_LINES
    )
    assert too_long == [], f"modules over {MAX_LINES} lines: {', '.join(too_long)}"


def test_no_function_over_60_lines():
    """No function of the project, docstring included, is longer than 60 lines: a longer one is
    split by responsibility (a stage, a group of commands, a test's arrangement)."""
    too_long = sorted(
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)"
        for path in project_modules()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for lines in [node.end_lineno - node.lineno + 1]
        if lines > MAX_FUNCTION_LINES
    )
    assert too_long == [], f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(too_long)}"


# --- tests/ mirrors the package -------------------------------------------------------------------
TESTS = REPO / "tests"
# the tests of the whole, beside the parts: the layout, the packaging and its install, the docs, the one import, one
# spelling per concept, and the suite's own CPU meter (tests/helpers/suite_cpu.py)
TOP_LEVEL_TESTS = {
    "test_attent_import.py",
    "test_docs.py",
    "test_doctests.py",
    "test_layout.py",
    "test_light_install.py",
    "test_makefile.py",
    "test_one_spelling.py",
    "test_packaging.py",
    "test_suite_cpu.py",
}
TEST_FOLDERS = set(LEVEL) | {"system", "helpers"}  # a part's tests; the system tier; what the tests share
DATA_FOLDERS = {"fixtures", "results"}  # the tests' input files; what the suite measured of itself


def folders_named(*names: str) -> list[Path]:
    return sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name in names)


def test_tests_mirror_the_package():
    """tests/<part>/ holds the tests of the package's part of that name (tests/analysis/ the report's), tests/system/
    the system tier, tests/helpers/ what the tests share; beside them only conftest.py and the tests of the whole.
    Every folder of modules is a package, so that two test modules of one name (a part's and its system tier's)
    are two modules."""
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert sorted(folders - TEST_FOLDERS - DATA_FOLDERS) == []
    loose = {p.name for p in TESTS.glob("*.py")} - {"__init__.py", "conftest.py"}
    assert sorted(loose ^ TOP_LEVEL_TESTS) == []
    packages = [TESTS, *folders_named(*TEST_FOLDERS)]
    assert [str(p.relative_to(REPO)) for p in packages if not (p / "__init__.py").is_file()] == []
    nested = sorted(str(p.relative_to(REPO)) for folder in packages[1:] for p in folder.iterdir() if p.is_dir())
    assert [p for p in nested if not p.endswith("__pycache__")] == []


def test_a_parts_folder_holds_test_modules_and_helpers_hold_none():
    """A part's folder and the system tier's hold test modules (and a conftest.py); what two modules share is in
    tests/helpers/, which holds no test module."""
    stray = sorted(
        str(p.relative_to(REPO))
        for folder in folders_named(*TEST_FOLDERS - {"helpers"})
        for p in folder.glob("*.py")
        if not p.name.startswith("test_") and p.name not in ("__init__.py", "conftest.py")
    )
    assert stray == []
    assert sorted(p.name for p in (TESTS / "helpers").glob("test_*.py")) == []


def test_the_system_tier_is_its_folder():
    """tests/system/conftest.py marks every test under it ``system``; no test elsewhere is marked so (``make test``
    runs ``-m "not system"``)."""

    def marks_system(path: Path) -> bool:
        return any(
            isinstance(node, ast.Attribute) and ast.unparse(node) == "pytest.mark.system"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
        )

    assert sorted(str(p.relative_to(REPO)) for p in TESTS.rglob("*.py") if marks_system(p)) == [
        "tests/system/conftest.py"
    ]


def imported_test_modules(path: Path) -> set[str]:
    """The test modules (``tests.<folder>.test_*``) ``path`` imports, at its top or inside a function, or names
    as a string (``pytest.importorskip("tests.engine.test_faults")``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("tests."):
            names.add(node.value)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if n.split(".")[0] == "tests" and n.split(".")[-1].startswith("test_")}


def test_a_test_module_imports_no_test_module_of_another_part():
    """What tests of two parts share lives in tests/helpers/ (which imports no test module); a module of the system
    tier may import its part's module (the helpers of a split file)."""
    crossing = sorted(
        f"{path.relative_to(REPO)} -> {name}"
        for path in TESTS.rglob("*.py")
        for where in [path.relative_to(TESTS).parts[:-1]]
        for name in imported_test_modules(path)
        if where[:1] == ("helpers",) or (where[:1] != ("system",) and tuple(name.split(".")[1:-1]) != where)
    )
    assert crossing == []
