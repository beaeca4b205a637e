"""tests/helpers/suite_cpu.py, the plugin that charges each test the machine-wide CPU spent while it
ran, on a pytest session of its own (pytester)."""

from __future__ import annotations

import json

pytest_plugins = "pytester"


def test_each_test_is_charged_at_least_its_own_cpu_and_files_are_summed(pytester):
    pytester.makepyfile(
        test_work="""
        import time

        def test_spins():  # 0.3 s of this process's own CPU, which the machine's busy time includes
            end = time.process_time() + 0.3
            while time.process_time() < end:
                pass

        def test_idle():
            pass
    """
    )
    out = pytester.path / "cpu.json"
    result = pytester.runpytest("-p", "tests.helpers.suite_cpu", f"--suite-cpu={out}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    charged = json.loads(out.read_text())
    assert set(charged) == {"test_work.py::test_spins", "test_work.py::test_idle"}
    assert charged["test_work.py::test_spins"]["cpu_s"] >= 0.25  # /proc/stat counts in ticks: a margin of a few
    assert charged["test_work.py::test_spins"]["wall_s"] >= 0.3
    result.stdout.fnmatch_lines(["suite CPU: * CPU-s over * s of tests*", "by file*", "* 2  test_work.py"])
