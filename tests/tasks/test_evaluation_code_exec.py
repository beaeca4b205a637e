"""Sandboxed execution: every way generated code can misbehave is a failed sample, not a crash."""

import os
import time

import pytest
from attent.tasks.llm.evaluation.code_exec import run_many, run_python

ADD = "def add(a, b):\n    return a + b\n"


def test_correct_program_passes():
    assert run_python(ADD + "assert add(2, 3) == 5").outcome == "passed"


@pytest.mark.parametrize(
    "program",
    [
        ADD + "assert add(2, 3) == 6",  # wrong answer
        "def add(a, b):\n    raise ValueError('boom')\nassert add(1, 2) == 3",  # exception
        "def add(a, b)\n    return a + b\nassert add(1, 2) == 3",  # syntax error
        "import sys\nsys.exit(0)\n" + ADD + "assert add(2, 3) == 6",  # clean exit before the asserts
        "import os\nos._exit(0)\nassert False",  # hard exit before the asserts
        "print('x' * 10)\nraise SystemExit(3)",
        "data = bytearray(50 * 2**30)\nassert len(data) > 0",  # 50 GiB allocation
        "data = [0] * (2**31)\nassert data",  # 16 GiB list
        "while True:\n    print('x' * 10_000)",  # output flood: stopped by the file-size limit
    ],
)
def test_misbehaving_programs_fail(program):
    result = run_python(program, timeout=5)
    assert result.outcome == "failed"
    assert not result.passed


def test_infinite_loop_times_out():
    assert run_python("while True:\n    pass", timeout=1).outcome == "timeout"


def test_program_cannot_import_the_project_or_site_packages():
    result = run_python("import attent", timeout=5)
    assert result.outcome == "failed"
    assert "ModuleNotFoundError" in result.stderr_tail


def test_program_runs_in_a_private_empty_folder_with_a_bare_environment(tmp_path):
    program = (
        "import os\n"
        "assert os.listdir('.') == ['program.py'], os.listdir('.')\n"
        "assert 'VIRTUAL_ENV' not in os.environ and 'SECRET' not in os.environ\n"
        "open('scratch.txt', 'w').write('ok')\n"
    )
    os.environ["SECRET"] = "x"
    try:
        assert run_python(program, timeout=5).passed
    finally:
        del os.environ["SECRET"]


def test_background_children_are_killed_on_timeout(tmp_path):
    marker = tmp_path / "alive"
    child = f"import time; time.sleep(3); open({str(marker)!r}, 'w').write('x')"
    program = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])\nwhile True:\n    pass\n"
    assert run_python(program, timeout=1).outcome == "timeout"
    time.sleep(3.5)
    assert not marker.exists()


def test_run_many_keeps_input_order():
    programs = [ADD + f"assert add({i}, 1) == {i + 1 if i % 2 else 0}" for i in range(6)]
    outcomes = [r.passed for r in run_many(programs, timeout=5, workers=2)]
    assert outcomes == [i % 2 == 1 for i in range(6)]
