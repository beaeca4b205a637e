"""Fresh virtual environments for the install tests (tests/test_light_install.py): a venv whose path
holds this environment's torch, shared read-only (a folder of symlinks to torch, its dist-info and its
runtime requirements, on the venv's path through a .pth file), so that pip sees torch installed and
nothing multi-GB is downloaded; other packages of this environment shared the same way."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PLATFORM_PACKAGES = ("ray", "mlflow")


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def runtime_closure(*names: str) -> dict[str, object]:
    """The installed distributions ``names`` need at run time (their requirements, recursively,
    markers evaluated here; a name may carry extras, ``ray[default,train]``, whose requirements count)."""
    found, done, todo = {}, set(), [Requirement(name) for name in names]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in done:
            continue
        done.add((name, frozenset(req.extras)))
        try:
            found[name] = found.get(name) or distribution(name)
        except PackageNotFoundError:  # a requirement for another platform or Python
            continue
        for line in found[name].requires or []:
            nested = Requirement(line)
            if nested.marker is None or any(nested.marker.evaluate({"extra": e}) for e in ["", *req.extras]):
                todo.append(nested)
    return found


def share(folder: Path, names: tuple[str, ...], skip: set[str] = frozenset()) -> list[str]:
    """Symlink into ``folder`` the installed files of ``names`` and of what they need (less
    ``skip``): their top-level packages, modules and dist-info. The distributions shared."""
    folder.mkdir(parents=True, exist_ok=True)
    shared = []
    for name, found in runtime_closure(*names).items():
        if name in skip:
            continue
        shared.append(name)
        site = Path(found.locate_file(""))
        for top in {Path(f).parts[0] for f in found.files or []}:
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not (folder / top).exists():
                (folder / top).symlink_to(site / top)
    return shared


def fresh_venv(path: Path) -> Path:
    """A new venv whose path holds this environment's torch (see the module's docstring)."""
    run(sys.executable, "-m", "venv", path)
    python = path / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    share(path.parent / f"{path.name}-torch", ("torch",))
    (site / "shared_torch.pth").write_text(f"{path.parent / f'{path.name}-torch'}\n")
    return python


def torch_seen(python: Path) -> dict:
    """Where the venv's torch is and its version, as Python and pip see them (without importing it)."""
    code = (
        "import json, importlib.metadata as m, importlib.util as u; "
        "print(json.dumps({'file': u.find_spec('torch').origin, 'version': m.version('torch')}))"
    )
    return json.loads(run(python, "-c", code).stdout)


def installed(python: Path) -> set[str]:
    listed = json.loads(run(python, "-m", "pip", "list", "--format", "json").stdout)
    return {canonicalize_name(p["name"]) for p in listed}


def assert_absent(python: Path, names=PLATFORM_PACKAGES) -> None:
    code = f"import importlib.util; print([n for n in {list(names)!r} if importlib.util.find_spec(n)])"
    assert run(python, "-c", code).stdout.strip() == "[]"


# run in the venv: a script, then the top-level modules it left loaded, as the last line of stdout
