"""The docstrings' examples run: every module of the package with a ``>>>`` example passes ``doctest``."""

from __future__ import annotations

import doctest
import importlib

import pytest

from tests.helpers.paths import REPO

PACKAGE = REPO / "platform"
MODULES = sorted(
    ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    for path in (PACKAGE / "attent").rglob("*.py")
    if ">>> " in path.read_text(encoding="utf-8")
)


def test_the_package_has_examples_to_run():
    assert MODULES


@pytest.mark.parametrize("name", MODULES)
def test_a_modules_examples_give_what_they_show(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed, name
