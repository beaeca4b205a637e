"""Where the test suite's CPU goes: a pytest plugin that charges each test the CPU time the whole
machine spent while it ran (``/proc/stat``: every process, Ray's and MLflow's included, which
pytest's ``--durations`` and ``time`` miss), with its wall-clock time. A session fixture is
charged to the first test that uses it. Meaningful only with nothing else running.

    PYTHONPATH=. pytest -m system -p tests.helpers.suite_cpu --suite-cpu=suite_cpu.json   # or any selection

writes each test's ``cpu_s`` and ``wall_s`` to the JSON file and prints the heaviest tests and
the totals by test file.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

TICK = os.sysconf("SC_CLK_TCK")
CHARGED = pytest.StashKey[dict]()  # nodeid -> (cpu_s, wall_s)


def busy_seconds() -> float:
    """CPU seconds every core of the machine has spent outside idle and iowait since boot."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def pytest_addoption(parser):
    parser.addoption("--suite-cpu", metavar="JSON", help="write each test's machine-wide CPU and wall seconds here")


def pytest_configure(config):
    config.stash[CHARGED] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = busy_seconds(), time.perf_counter()
    yield
    item.config.stash[CHARGED][item.nodeid] = (busy_seconds() - cpu, time.perf_counter() - wall)


def pytest_terminal_summary(terminalreporter, config):
    tests = config.stash[CHARGED]
    if not tests:
        return
    path = config.getoption("--suite-cpu")
    if path:
        Path(path).write_text(json.dumps({k: {"cpu_s": c, "wall_s": w} for k, (c, w) in tests.items()}, indent=1))
    by_file = defaultdict(lambda: [0.0, 0.0, 0])
    for nodeid, (cpu, wall) in tests.items():
        row = by_file[nodeid.split("::")[0]]
        row[0], row[1], row[2] = row[0] + cpu, row[1] + wall, row[2] + 1
    write = terminalreporter.write_line
    cpu_total, wall_total = sum(c for c, _ in tests.values()), sum(w for _, w in tests.values())
    write(f"suite CPU: {cpu_total:.0f} CPU-s over {wall_total:.0f} s of tests ({cpu_total / wall_total:.2f} cores)")
    write("by file (CPU-s, wall s, tests):")
    for name, (cpu, wall, count) in sorted(by_file.items(), key=lambda kv: -kv[1][0]):
        write(f"  {cpu:7.1f} {wall:7.1f} {count:3d}  {name}")
    write("heaviest tests (CPU-s, wall s):")
    for nodeid, (cpu, wall) in sorted(tests.items(), key=lambda kv: -kv[1][0])[:20]:
        write(f"  {cpu:7.1f} {wall:7.1f}  {nodeid}")
