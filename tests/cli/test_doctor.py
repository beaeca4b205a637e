"""`attent doctor`'s checks that need no Ray or tracking store: what they report of this node."""

from pathlib import Path

from attent.cli.doctor import check_torch, cpu_model


def test_the_torch_check_names_the_cpu_a_measurement_was_taken_on():
    model = cpu_model()
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        {line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")}
        if cpuinfo.exists()
        else set()
    )
    if names:  # Linux on x86: the model name, not the platform module's guess
        assert model in names
    assert model and model in check_torch()
