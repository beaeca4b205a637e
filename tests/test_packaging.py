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
import tomllib
from importlib.metadata import packages_distributions, version

import pytest
from attent.cli import extras
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tests.helpers.paths import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
LOCK = REPO / "requirements" / "platform.lock"
SELECTION_API = ("Selector", "SelectionConfig", "select", "SubsetSampler")


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
    assert lines[0].startswith(f"attent {argv[0]}: error: ") and lines[0].endswith(extras.install_line("platform"))


def test_doctor_names_the_extra_of_what_it_misses(tmp_path):
    done = run_without(["ray", "mlflow"], ["doctor"], cwd=tmp_path)
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert done.returncode == 1 and [line.split()[1] for line in failed] == ["ray", "tracking"], done.stdout
    assert all(extras.install_line("platform") in line for line in failed)


def built_metadata(tmp_path):
    """The wheel's metadata as the build backend writes it (prepare_metadata_for_build_wheel, in this
    environment, well under a second), from a copy of what it reads: no egg-info left in the clone."""
    import shutil

    from build.util import project_wheel_metadata

    source = tmp_path / "attent"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(REPO / name, source / name)
    for folder in ("platform/attent", "analysis"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return project_wheel_metadata(source, isolated=False)


def test_the_built_metadata_carries_the_licence(tmp_path):
    """There was no LICENSE and no licence in the metadata: Apache-2.0 now, as PEP 639 declares it (an SPDX
    expression and the file, which the wheel carries), and as the README says."""
    metadata = built_metadata(tmp_path)
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    assert metadata.get("License") is None and not any("License ::" in c for c in metadata.get_all("Classifier") or [])
    licence = (REPO / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence and "Copyright 2026 The attent authors" in licence
    assert "Apache-2.0" in (REPO / "README.md").read_text()


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


def module_imports(path, *, top_only: bool = False) -> list[str]:
    """The modules ``path`` imports (at its top only, or anywhere), and the ones it looks up with
    ``importlib.util.find_spec("name")`` (a data file of a package, found without importing it)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in tree.body if top_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "find_spec" and node.args:
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append(node.args[0].value)
    return found


def imported_distributions(script) -> set[str]:
    """The distributions ``script`` needs: its third-party imports and those of the attent modules it
    imports (followed through their top-level attent imports), as installed here."""
    modules, seen, todo = set(), set(), [script]
    while todo:
        path = todo.pop()
        top_level = set(module_imports(path, top_only=True))
        for name in module_imports(path):
            if name.partition(".")[0] != "attent":
                modules.add(name.partition(".")[0])
                continue
            base = REPO / "platform" / name.replace(".", "/")
            found = next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)
            if found and found not in seen and (name in top_level or path == script):
                seen.add(found)
                todo.append(found)
    modules -= set(sys.stdlib_module_names) | {"__future__"}
    providers = packages_distributions()
    return {canonicalize_name(d) for m in modules for d in providers.get(m, [m])}


def installed_closure(names: set[str]) -> set[str]:
    """``names`` and what they need at run time, as installed here."""
    from importlib.metadata import PackageNotFoundError, distribution

    found, todo = set(), list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        found.add(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        todo += [r.name for r in map(Requirement, requires) if r.marker is None or r.marker.evaluate({"extra": ""})]
    return found


def install_line_brings(line: str) -> set[str]:
    """What ``pip install 'attent[a,b]' other ...`` installs (attent's extras expanded), with their needs;
    from a clone, ``pip install '.[a,b]'`` (or ``-e``) is attent's the same."""
    names = set()
    for word in line.replace("'", " ").split():
        if word.startswith("-"):
            continue
        req = Requirement("attent" + word[1:] if word == "." or word.startswith(".[") else word)
        assert req.name != "attent" or req.extras <= set(PROJECT["optional-dependencies"]), f"no such extra: {line}"
        names |= (
            (declared(None) | set().union(*(declared(e) for e in req.extras))) if req.name == "attent" else {req.name}
        )
    return installed_closure(names)


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.py")))
def test_each_example_names_the_install_that_brings_what_it_imports(example):
    """examples/hf_trainer.py and trl_sft.py imported peft and datasets, which neither extra brings:
    each example now says what to install, and that install brings every package it imports."""
    path = REPO / "examples" / example
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    line = re.search(r"Needs `pip install ([^`]+)`", docstring)
    assert line, f"{example}: its docstring names no `pip install ...` line"
    # the PyPI line and the clone's alike: no release is published yet, so the clone's is the one that works
    lines = re.findall(r"`pip install\s+([^`]+)`", docstring)
    assert any(re.search(r"(^|\s)'?\.(\[|\s|$)", found) for found in lines), f"{example}: no install from a clone"
    for found in lines:
        missing = imported_distributions(path) - install_line_brings(found) - {"attent"}
        assert sorted(missing) == [], f"{example}: `pip install {found}` brings no {sorted(missing)}"


@pytest.mark.parametrize("page,example", [("huggingface.md", "hf_trainer.py"), ("trl.md", "trl_sft.py")])
def test_the_integration_pages_install_what_their_examples_import(page, example):
    text = (REPO / "docs" / "integrations" / page).read_text()
    lines = re.findall(r"`pip install\s+([^`]+)`", text)
    brought = set().union(*(install_line_brings(line) for line in lines))
    assert sorted(imported_distributions(REPO / "examples" / example) - brought - {"attent"}) == []


def python_floor() -> str:
    """requires-python's floor, e.g. "3.11"."""
    (spec,) = [s for s in SpecifierSet(PROJECT["requires-python"]) if s.operator == ">="]
    return spec.version


def test_requires_python_admits_every_version_the_lock_pins():
    """The lock pinned numpy 2.4.6, pandas 3.1.1, transformers 5.24 (all >= 3.11) under requires-python
    >= 3.10, so `make demo` died inside pip on 3.10: every pinned distribution (as installed here, from
    the lock) must install on the floor's first release."""
    from importlib.metadata import PackageNotFoundError, distribution

    floor = f"{python_floor()}.0"
    pins = dict(line.split("==") for line in LOCK.read_text().splitlines() if line.strip() and not line.startswith("#"))
    refused = {}
    for name, pinned in pins.items():
        try:
            found = distribution(name)
        except PackageNotFoundError:  # a platform-specific pin absent here
            continue
        assert found.version == pinned, f"{name} {found.version} is installed, the lock says {pinned}: make setup"
        needs = found.metadata.get("Requires-Python")
        if needs and not SpecifierSet(needs).contains(floor):
            refused[f"{name}=={pinned}"] = needs
    assert refused == {}, f"requires-python >= {python_floor()}, but these need more: {refused}"


def test_the_docs_state_the_python_floor_and_the_makefile_and_ruff_hold_it():
    floor = python_floor()
    for page in ("README.md", "docs/getting-started.md"):
        text = (REPO / page).read_text()
        assert f"Python ≥ {floor}" in text and not re.search(r"Python ≥ 3\.(?!11)\d+", text), page
    assert f"sys.version_info >= ({floor.replace('.', ', ')})" in (REPO / "Makefile").read_text()
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"][
        "target-version"
    ] == "py" + floor.replace(".", "")
    assert "3.11" in (REPO / "CHANGELOG.md").read_text().split("## [", 2)[1]  # the decision, in Unreleased


def test_the_version_lives_in_pyproject_alone():
    """One place: pyproject.toml's version, which the metadata (and so `attent --version`) carries."""
    assert version("attent") == PROJECT["version"]
    literal = re.compile(r"""(__version__\s*=|version\s*=\s*["']\d)""")
    found = [str(p.relative_to(REPO)) for p in (REPO / "platform").rglob("*.py") if literal.search(p.read_text())]
    assert found == [] and "dynamic" not in PROJECT


def test_the_readme_installs_from_a_clone_until_a_release_is_published():
    """`pip install attent` read "from PyPI", where no release exists: the lines given work from a clone
    (tests/test_light_install.py installs the wheel they build) and the PyPI ones wait for a release."""
    readme = (REPO / "README.md").read_text()
    install = readme[readme.index("## Install") : readme.index("## Use it")]
    lines = re.findall(r"^(pip install .*?)\s+#", install, re.M)
    assert lines and all(re.fullmatch(r"pip install (\.|'\.\[[a-z]+\]')", line) for line in lines), lines
    assert {re.search(r"\[(\w+)\]", line).group(1) for line in lines if "[" in line} <= set(
        PROJECT["optional-dependencies"]
    )
    assert "No release of attent is on PyPI yet" in install and "Once a release is published" in install
    assert "python -m build" in install
