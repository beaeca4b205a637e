"""The documentation site builds strictly: ``mkdocs build --strict`` fails on any warning, so a
broken link or anchor inside docs/, a link to a repository file that does not exist, or a page
missing from the nav fails the suite. The generated references are checked against the code they
are generated from, and the README's own links against the repository; so are the test files and
the layout the docs name, the floors they cite (pyproject.toml's) and what each integration snippet
uses (brought by the install lines beside it).

Cost: one build, 6-12 s of wall-clock on 2 cores (5 s of CPU; most of it mkdocstrings reading
the sources and the Material theme writing ~45 pages and the published data), in the fast tier."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.test_packaging import install_line_brings

NEEDED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
MISSING = [
    name
    for name in NEEDED
    if importlib.util.find_spec(name.split(".")[0]) is None or importlib.util.find_spec(name) is None
]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"the docs toolchain is not installed ({', '.join(MISSING)}): pip install -e '.[docs]'"
)


def build(out: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about MkDocs 2.0, not ours
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    log = done.stdout + done.stderr
    warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not warnings, "mkdocs build --strict failed:\n" + "\n".join(
        warnings or [log[-4000:]]
    )


def page_text(site: Path, page: str) -> str:
    html = (site / page / "index.html").read_text()
    return re.sub(r"<[^>]+>", " ", html[html.index("<article") : html.index("</article>")])


def test_the_site_builds_strictly_with_complete_references(tmp_path):
    """One build (one test, so that pytest-xdist does not build it on each worker), then what it
    wrote: the data a findings page links to, and the generated references against the code."""
    site = tmp_path / "site"
    build(site)
    assert (site / "index.html").is_file()

    # a findings page's link to its folder under benchmarks/results/ reaches a copy in the site
    html = (site / "findings" / "data-size" / "index.html").read_text()
    assert 'href="../../repo/benchmarks/results/data_size/"' in html
    published = site / "repo" / "benchmarks" / "results" / "data_size"
    assert (published / "index.html").is_file()
    assert (published / "data_size" / "figures" / "data_size_joined.png").is_file()

    # the configuration reference: every field of the models it is generated from
    sys.path[:0] = [str(REPO / "platform"), str(REPO)]
    try:
        from attent.experiment.schema import ExperimentConfig, RayConfig, TrainConfig
        from attent.selection.config import SelectionConfig
        from attent.tasks.registry import config_classes
    finally:
        del sys.path[:2]
    text = page_text(site, "reference/configuration")
    assert "attent:config-reference" not in text
    for model in (ExperimentConfig, TrainConfig, RayConfig, SelectionConfig, *config_classes()):
        missing = [name for name in model.model_fields if f" {name} " not in text]
        assert missing == [], f"{model.__name__}: {missing}"

    # the command-line reference: every command the parser has
    from attent.cli.main import COMMANDS

    text = page_text(site, "reference/cli")
    assert [command for command in COMMANDS if f"attent {command}" not in text] == []

    # the API reference: the public names, from their docstrings
    html = (site / "reference" / "api" / "index.html").read_text()
    for target in (
        "attent.selection.selector.Selector",
        "attent.selection.config.SelectionConfig",
        "attent.selection.strategies.select",
        "attent.integrations.huggingface.AtteNTTrainer",
        "attent.integrations.huggingface_trl.AtteNTSFTTrainer",
        "attent.integrations.lightning.AtteNTCallback",
        "attent.integrations.lightning_stream.AtteNTStreamCallback",
    ):
        assert f'id="{target}"' in html, target


def test_the_readme_links_point_at_files_of_the_repository():
    readme = (REPO / "README.md").read_text()
    text = re.sub(r"```.*?```", "", readme, flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not (REPO / target.split("#")[0]).exists():
            broken.append(target)
    assert broken == []
    assert len(readme.splitlines()) <= 250


@pytest.mark.parametrize("page", ["docs/guides/experiments.md", "docs/guides/ray.md"])
def test_the_guides_first_ray_job_submit_gives_absolute_store_and_checkpoints(page):
    """`ray job submit --working-dir .` as the guides first wrote it: the default sqlite:///mlflow.db and
    ray_results resolved inside Ray's temporary copy of the folder, and the run never reached the user's
    store (the caveat came paragraphs later). `attent` now refuses that; the first command gives both."""
    text = (REPO / page).read_text().replace("\\\n", " ")
    first = next(line for line in text.splitlines() if "ray job submit --working-dir" in line and "attent " in line)
    assert "mlflow.tracking_uri=sqlite:///$PWD/" in first and "ray.storage_path=$PWD/" in first, first


# Hugging Face's own test file, named where the docs say it was run against AtteNTTrainer: not this repository's
FOREIGN_TESTS = {"tests/trainer/test_trainer.py"}


def test_every_test_file_the_docs_and_cluster_files_name_exists():
    """cluster.yaml named tests/test_cluster_config.py after it moved to tests/engine/: every
    ``tests/...py`` the README, the docs and the cluster files name is a file of the repository."""
    pages = [REPO / "README.md", *REPO.glob("cluster*.yaml"), *sorted((REPO / "docs").rglob("*.md"))]
    missing = {}
    for page in pages:
        named = set(re.findall(r"\btests/[\w/.-]*?\.py\b", page.read_text())) - FOREIGN_TESTS
        if gone := sorted(path for path in named if not (REPO / path).is_file()):
            missing[str(page.relative_to(REPO))] = gone
    assert missing == {}


def test_the_floors_the_install_docs_cite_are_pyprojects():
    """docs/getting-started.md cited a numpy 2.4 floor that pyproject.toml does not declare (numpy>=1.26;
    2.4 is the lock's version): every "name ≥ version" the install docs give for a declared requirement
    is that requirement's floor in pyproject.toml."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *(line for group in project["optional-dependencies"].values() for line in group)]
    floors = {}
    for req in map(Requirement, lines):
        for spec in req.specifier:
            if spec.operator == ">=":
                floors.setdefault(canonicalize_name(req.name), set()).add(spec.version)
    cited = []
    for page in ("README.md", "docs/getting-started.md", "docs/integrations/index.md"):
        text = (REPO / page).read_text().replace("\n", " ")
        cited += [(page, name, floor) for name, floor in re.findall(r"([A-Za-z][\w-]*) ≥ (\d[\d.]*\d)", text)]
        for listed in re.findall(r"floors? \(([^)]*)\)", text):  # as "the extras' own floors (transformers 5.24, ...)"
            cited += [(page, name, floor) for name, floor in re.findall(r"([A-Za-z][\w-]*) (\d[\d.]*\d)", listed)]
    wrong = [c for c in cited if canonicalize_name(c[1]) in floors and c[2] not in floors[canonicalize_name(c[1])]]
    assert wrong == [] and {"numpy", "torch", "transformers"} <= {canonicalize_name(c[1]) for c in cited}


def test_the_readme_layout_names_what_exists():
    """The README's Layout listed `integrations/ Selector (pytorch.py)` after pytorch.py had gone: every
    folder and file it names, and every module it names in a description, is in the repository."""
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("## Layout") :].split("```")[1]
    missing, top = [], REPO
    for line in block.splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent > 2:  # a blank line, or a description's second line
            continue
        name, _, description = line.strip().partition(" ")
        path = (REPO if indent == 0 else top) / name
        if indent == 0:
            top = path
        folder = path if name.endswith("/") else path.parent
        named = [path, *(folder / module for module in re.findall(r"\((\w+\.py)\)", description))]
        missing += [str(p.relative_to(REPO)) for p in named if not p.exists()]
    assert missing == []


def snippet_needs(block: str) -> set[str]:
    """The distributions a docs snippet uses: its imports (attent's own aside) and the tracker its
    ``report_to=`` names, which Trainer imports (``report_to="mlflow"`` fails without mlflow)."""
    modules = {m.partition(".")[0] for m in re.findall(r"^\s*(?:from|import)\s+([\w.]+)", block, re.M)}
    modules |= set(re.findall(r"""report_to=["'](\w+)["']""", block)) - {"none", "all"}
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    providers = packages_distributions()
    return {canonicalize_name(d) for m in modules - {"attent"} for d in providers.get(m, [m])}


@pytest.mark.parametrize("page", sorted(p.name for p in (REPO / "docs" / "integrations").glob("*.md")))
def test_each_integration_snippet_is_brought_by_the_install_lines_beside_it(page):
    """The Hugging Face page's snippet set report_to="mlflow" under an install line that brought no
    mlflow. Each snippet's imports and tracker are brought by the install lines of the page's opening
    (before its first section) and of the snippet's own section, each of them naming real extras."""
    intro, *sections = re.split(r"^## ", (REPO / "docs" / "integrations" / page).read_text(), flags=re.M)

    def lines(text):
        return re.findall(r"`pip install\s+([^`]+)`", text.replace("\n", " "))

    for section in [intro, *sections]:
        brought = set().union(*(install_line_brings(line) for line in lines(intro) + lines(section)))
        for block in re.findall(r"```python\n(.*?)```", section, re.S):
            assert sorted(snippet_needs(block) - brought) == [], f"{page}: {section.splitlines()[0]}"
