"""The integrations package says what it holds: its docstring's listing names its modules."""

from __future__ import annotations

import ast

from tests.helpers.paths import REPO

FOLDER = REPO / "platform" / "attent" / "integrations"


def test_the_listing_names_each_integration_that_exists():
    """integrations/__init__.py listed a ``pytorch`` integration after pytorch.py had gone: its listing
    names modules of the folder, every one of them but the Hugging Face trainer's parts (huggingface_*.py
    beside huggingface.py and huggingface_trl.py)."""
    listing = ast.get_docstring(ast.parse((FOLDER / "__init__.py").read_text()))
    listed = {line.split()[0] for line in listing.splitlines() if line.startswith("    ") and line[4] != " "}
    modules = {path.stem for path in FOLDER.glob("*.py")} - {"__init__"}
    assert sorted(listed - modules) == []
    assert sorted(m for m in modules - listed if not m.startswith("huggingface_")) == []
    assert {"huggingface", "huggingface_trl", "lightning", "loaders"} <= listed
