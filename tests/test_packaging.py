"""What `pip install attent` declares: a light core (torch, numpy, pydantic) with the
rest behind extras, every import of the code declared in the extra that brings it, exact versions
in the lock file only, `attent --version`, and one line naming the extra when a command's packages
are missing. The install itself, into fresh venvs: tests/test_light_install.py."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from importlib.metadata import packages_distributions, version

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers.paths import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

from attent.cli import extras  # noqa: E402 -- after the skip above, as pytest.importorskip asks

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
LOCK = REPO / "requirements" / "platform.lock"
SELECTION_API = ("Selector", "SelectionConfig", "select", "Teacher", "SubsetSampler")


def requirements(extra: str | None) -> list[Requirement]:
    """The requirements of the core (None) or of an extra, its attent[...] references expanded."""
    found, todo, seen = [], [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in PROJECT["dependencies"] if name is None else PROJECT["optional-dependencies"][name]:
            req = Requirement(line)
            if req.name == "attent":
                todo.extend(req.extras)
            else:
                found.append(req)
    return found


def declared(extra: str | None) -> set[str]:
    return {canonicalize_name(r.name) for r in requirements(extra)} | (set() if extra is None else declared(None))


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> the files under platform/ and analysis/ (attent.analysis) importing it (not the
    standard library's)."""
    found: dict[str, set[str]] = {}
    for path in [*(REPO / "platform").rglob("*.py"), *(REPO / "analysis").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and not node.level and node.module
                else []
            )
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in ("attent", "__future__"):
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def test_the_package_list_names_every_package_of_the_code():
    """pyproject.toml lists the packages, platform/attent's and analysis/'s (installed as attent.analysis:
    packages.find cannot map a folder to another name), so that none is missing from the wheel alone."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"": "platform", "attent.analysis": "analysis"}
    inits = {part: (REPO / part).rglob("__init__.py") for part in ("platform", "analysis")}
    on_disk = {".".join(p.parent.relative_to(REPO / "platform").parts) for p in inits["platform"]}
    on_disk |= {".".join(("attent", *p.parent.relative_to(REPO).parts)) for p in inits["analysis"]}
    assert sorted(setuptools["packages"]) == sorted(on_disk)


def test_the_core_is_torch_numpy_and_pydantic_with_a_torch_floor():
    core = {canonicalize_name(r.name): r for r in requirements(None)}
    assert set(core) == {"torch", "numpy", "pydantic"}
    assert [s.operator for s in core["torch"].specifier] == [">="], "torch: a floor, no pin, no upper bound"


def test_the_extras_are_the_ones_named_and_all_holds_every_runtime_extra():
    names = set(PROJECT["optional-dependencies"])
    assert names == {"hf", "trl", "peft", "lightning", "scenes", "platform", "llm", "server", "all", "test", "docs"}
    assert declared("all") >= set().union(*(declared(e) for e in names - {"test", "docs"}))


def test_no_declared_requirement_is_an_exact_pin():
    """Exact versions live in the lock file: a pin here would replace a user's torch."""
    lines = [*PROJECT["dependencies"], *(req for group in PROJECT["optional-dependencies"].values() for req in group)]
    assert [line for line in lines if "==" in line] == []


def test_every_import_of_the_code_is_declared_in_the_extra_that_brings_it():
    """extras.py names each third-party module the code imports, and that module's distribution (as
    installed here) is a requirement of the extra extras.py names (or of the core)."""
    imported = third_party_imports()
    known = set(extras.EXTRA_OF) | set(extras.CORE_MODULES) | set(extras.OPTIONAL_MODULES)
    assert {m: sorted(f) for m, f in imported.items() if m not in known} == {}
    providers = packages_distributions()
    undeclared = {}
    for module in set(imported) - set(extras.OPTIONAL_MODULES):
        extra = extras.EXTRA_OF.get(module)
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        assert dists, f"{module} is not installed here"
        if not dists & declared(extra):
            undeclared[module] = (extra or "core", sorted(dists))
    assert undeclared == {}


def test_the_lock_pins_every_declared_requirement_exactly():
    lines = [line for line in LOCK.read_text().splitlines() if line.strip() and not line.startswith("#")]
    pins = dict(line.split("==") for line in lines)
    assert all(re.fullmatch(r"[a-z0-9-]+==[\w.+!-]+", line) for line in lines), "name==version lines only"
    assert "attent" not in pins
    needed = declared("all") | declared("test") | declared("docs")
    assert sorted(needed - set(pins)) == []
    for req in [*requirements("all"), *requirements("test"), *requirements("docs"), *requirements(None)]:
        assert req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True), (
            f"the lock's {req.name}=={pins[canonicalize_name(req.name)]} is outside pyproject.toml's {req}"
        )


def test_the_makefile_installs_from_the_lock():
    makefile = (REPO / "Makefile").read_text()
    assert "LOCK := requirements/platform.lock" in makefile
    assert re.search(r"pip install .*-c \$\(LOCK\) -e '\.\[all,test,docs\]'", makefile)


def test_version_flag_prints_the_installed_version(capsys):
    from attent.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"attent {version('attent')}"


# runs the CLI as if the named packages were not installed
BLOCKED = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, NotInstalled())
from attent.cli.main import main
sys.exit(main({argv!r}))
"""


def run_without(blocked: list[str], argv: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED.format(blocked=blocked, argv=argv)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize(
    "argv,blocked",
    [
        (["validate", "{repo}/experiments/digits_vit.yaml"], ["yaml", "ray", "mlflow", "tqdm"]),
        (["train", "{repo}/experiments/digits_vit.yaml", "train.epochs=1"], ["ray", "mlflow"]),
        (["report", "--experiment", "x", "--tracking-uri", "sqlite:///{tmp}/mlflow.db"], ["mlflow", "pandas"]),
        (["data", "scenes", "--out", "{tmp}/scenes", "--train", "1", "--test", "1"], ["trimesh"]),
    ],
)
def test_a_command_whose_packages_are_missing_names_the_extra_in_one_line(argv, blocked, tmp_path):
    argv = [word.format(tmp=tmp_path, repo=REPO) for word in argv]
    (tmp_path / "mlflow.db").touch()
    done = run_without(blocked, argv, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"attent {argv[0]}: error: ") and "pip install 'attent[platform]'" in lines[0]


def test_doctor_names_the_extra_of_what_it_misses(tmp_path):
    done = run_without(["ray", "mlflow"], ["doctor"], cwd=tmp_path)
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert done.returncode == 1 and [line.split()[1] for line in failed] == ["ray", "tracking"], done.stdout
    assert all("pip install 'attent[platform]'" in line for line in failed)


def test_the_selection_api_imports_nothing_the_core_does_not_declare():
    """`import attent` and the selection library load, beyond what torch itself loads, pydantic
    (and numpy) only: never Ray, MLflow, timm, pyyaml or any other extra's package."""
    code = f"""
import json, sys
import torch
before = set(sys.modules)
import attent
for name in {SELECTION_API!r}:
    getattr(attent, name)
print(json.dumps(sorted({{m.partition(".")[0] for m in set(sys.modules) - before}})))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    loaded = set(json.loads(done.stdout)) - set(sys.stdlib_module_names) - {"attent"}
    core = {"numpy", "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions"}
    assert sorted(loaded - core) == []


def test_no_experiment_points_outside_a_clone():
    """A user-facing experiment reads data a clone has, the hub or $ATTENT_DATA_DIR: never the
    workplace's ../shared/ (tests reach it through tests.helpers.paths.SHARED)."""
    assert [p.name for p in (REPO / "experiments").rglob("*.yaml") if "../shared" in p.read_text()] == []
