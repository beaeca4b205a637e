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


def test_the_offline_data_check_looks_for_gsm8k_where_the_llm_task_reads_it(tmp_path, monkeypatch):
    """It looked at a fixed ../shared/datasets/gsm8k/train.jsonl beside the clone; the task reads
    task.data_dir, else $ATTENT_DATA_DIR (attent.tasks.llm.sources): the check follows the same."""
    from attent.cli.doctor import Skip, check_offline_data, gsm8k_file
    from attent.tasks.llm.config import LLMTaskConfig

    monkeypatch.delenv("ATTENT_DATA_DIR", raising=False)
    assert gsm8k_file(None)[0] is None and "ATTENT_DATA_DIR" in gsm8k_file(None)[1]
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    monkeypatch.setenv("ATTENT_DATA_DIR", str(tmp_path))
    task = LLMTaskConfig(name="llm", dataset="gsm8k")
    assert task.resolved_data_dir() == tmp_path  # where the task reads ...
    assert gsm8k_file(None)[0] == tmp_path / "gsm8k" / "train.jsonl"  # ... is where the check looks
    other = tmp_path / "other"
    other.mkdir()
    assert gsm8k_file(str(other)) == (None, f"{other}/gsm8k/train{{.jsonl,.json,.parquet}} does not exist")
    try:
        report = check_offline_data()  # everything present: ok, naming each part
    except Skip as missing:  # some other part missing here: a warning naming what it found and what not
        report = str(missing)
    assert f"GSM8K ({tmp_path}/gsm8k/train.jsonl)" in report.partition("missing")[0]
