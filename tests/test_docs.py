"""The documentation site builds strictly: ``mkdocs build --strict`` fails on any warning, so a
broken link or anchor inside docs/, a link to a repository file that does not exist, or a page
missing from the nav fails the suite. The generated references are checked against the code they
are generated from, and the README's own links against the repository.

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
