"""What the Makefile does for a newcomer before any test runs: the set-up installs from the lock, an
older Python, or one that cannot make a venv (Debian's python3.X-venv missing), is refused in one line
before a venv is made, the editable install's setuptools alarm is silenced for the reason it does not
apply, and `make data` installs Fashion-MNIST for a user who is not root (through sudo) or says plainly
that the demo will run on digits. The Makefile runs for real, with
stub tools on a PATH of their own where it would change the machine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO


def test_the_makefile_installs_from_the_lock():
    makefile = (REPO / "Makefile").read_text()
    assert "LOCK := requirements/platform.lock" in makefile
    assert re.search(r"pip install .*-c \$\(LOCK\) -e '\.\[all,test,docs\]'", makefile)


def make_data(tmp_path, tools: dict[str, str], stdin=subprocess.DEVNULL) -> tuple[subprocess.CompletedProcess, str]:
    """`make data` as a user whose PATH holds only ``tools`` (name -> shell script body), each of which
    appends its name and arguments to calls.log; Fashion-MNIST is not installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        (bin_dir / name).write_text(f'#!/bin/bash\necho "{name} $*" >> {tmp_path}/calls.log\n{body}\n')
        (bin_dir / name).chmod(0o755)
    done = subprocess.run(
        [shutil.which("make"), "-s", "-f", str(REPO / "Makefile"), "data", f"FASHION_MNIST={tmp_path}/none"],
        cwd=tmp_path, env={"PATH": str(bin_dir)}, stdin=stdin, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    log = tmp_path / "calls.log"
    return done, log.read_text() if log.exists() else ""


USER = {"id": "echo 1000", "apt-get": "exit 0"}


def test_make_data_installs_fashion_mnist_with_sudo_for_a_user_who_is_not_root(tmp_path):
    """A sudo user's `make` never installed Fashion-MNIST, and the demo quietly ran on digits:
    it now goes through sudo (here one that needs no password), and names what it does."""
    sudo = '[ "$1" = -n ] && shift; while [[ "$1" == *=* ]]; do export "$1"; shift; done; "$@"'  # no password asked
    done, calls = make_data(tmp_path, {**USER, "sudo": sudo})
    assert done.returncode == 0, done.stderr
    assert (
        "sudo -n true" in calls
        and "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist" in calls
    )
    assert "apt-get install -y -qq dataset-fashion-mnist" in calls and "with sudo" in done.stdout


@pytest.mark.parametrize("sudo", [None, "exit 1"], ids=["no-sudo", "sudo-needs-a-password-and-no-terminal"])
def test_make_data_without_a_way_to_install_says_the_demo_runs_on_digits(tmp_path, sudo):
    done, calls = make_data(tmp_path, {**USER, **({"sudo": sudo} if sudo else {})})
    assert done.returncode == 0 and "apt-get" not in calls
    assert "the demo will run on sklearn digits instead" in done.stdout
    assert "sudo apt-get install dataset-fashion-mnist" in done.stdout


def test_the_makefile_refuses_an_older_python_in_one_line_before_making_a_venv(tmp_path):
    for name in ("Makefile", "pyproject.toml", "requirements/platform.lock"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    old = tmp_path / "python3.10"
    old.write_text(
        f'#!/bin/sh\nexec {sys.executable} -c "import sys; sys.version_info = (3, 10, 14); sys.version = \'3.10.14\'; exec(sys.argv[1])" "$2"\n'
    )
    old.chmod(0o755)
    done = subprocess.run([shutil.which("make"), "-s", f"PYTHON={old}", ".venv/.installed"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and not (tmp_path / ".venv").exists(), done.stderr
    assert lines[0] == (
        f"make: {old} is Python 3.10.14; attent needs Python >= 3.11 (requires-python, and the lock's numpy, pandas, "
        "transformers): run make PYTHON=python3.11 (or newer)"
    )


def test_the_makefile_names_the_venv_package_where_python_cannot_make_a_venv(tmp_path):
    """A fresh Debian's python3 has no ensurepip (python3.X-venv), and `-m venv` failed with the set-up
    half done: the Makefile asks first, names the package for the interpreter's version, makes no venv."""
    for name in ("Makefile", "pyproject.toml", "requirements/platform.lock"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    bare = tmp_path / "python3"  # this Python, as a Debian one without python3.X-venv answers
    bare.write_text(
        f'#!/bin/sh\ncase "$1 $2" in "-m ensurepip"|"-m venv") echo "No module named $2" >&2; exit 1;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    bare.chmod(0o755)
    # a shell's make, not one run under `make test` (whose MAKELEVEL makes it say "make[1]: ***")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run([shutil.which("make"), "-s", f"PYTHON={bare}", ".venv/.installed"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and not (tmp_path / ".venv").exists(), done.stderr
    assert len(lines) == 2 and lines[1].startswith("make: ***"), done.stderr  # ours, then make's own
    assert lines[0].startswith(f"make: {bare} -m venv cannot make a virtualenv here (no ensurepip): ")
    assert f"apt install python3.{sys.version_info[1]}-venv (Debian/Ubuntu" in lines[0]


def test_no_folder_at_the_top_is_named_like_the_package():
    """What setuptools' editable-install warning is about (a folder named `attent` in the working
    directory shadowing the package), and why the Makefile silences it: there is none."""
    assert not (REPO / "attent").exists() and (REPO / "platform" / "attent" / "__init__.py").is_file()
    assert "PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install" in (REPO / "Makefile").read_text()
