"""Experiment configs: every shipped YAML loads; bad input is refused before Ray starts."""

from __future__ import annotations

import warnings

import pytest
import yaml
from attent.cli.main import main
from attent.experiment.files import load_experiment, parse_overrides
from attent.experiment.schema import ConfigError

from tests.helpers.paths import REPO

SHIPPED = sorted((REPO / "experiments").rglob("*.yaml"))


def test_there_are_shipped_experiments():
    assert len(SHIPPED) >= 2


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_yaml_parses_and_names_its_command(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# attent ") and path.name in first, "headed by the command that runs it"
    data = yaml.safe_load(path.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # on today's spellings (no deprecated alias)
        if "sweep" in data:  # sweep files wrap a base experiment
            from attent.sweep.spec import load_sweep

            load_sweep(path)
        elif "teach" in data:  # the theory lab's experiment (attent theory)
            from attent.theory.config import load

            load(path)
        else:
            load_experiment(path)


def test_random_is_a_strategy_and_no_method():
    """One way to ask for Random: ``selection.strategy: random`` (``selection.method: random``, a
    spelling of a release never published, is refused naming the methods)."""
    new = load_experiment(REPO / "experiments/digits_vit.yaml", ["selection.strategy=random"])
    assert (new.selection.method, new.selection.strategy) == ("attent", "random")
    with pytest.raises(ConfigError, match="selection.method"):
        load_experiment(REPO / "experiments/digits_vit.yaml", ["selection.method=random"])


def test_overrides_nest_and_parse_yaml_values():
    assert parse_overrides(["train.epochs=3", "selection.ratio.kind=cosine", "ray.use_gpu=true", "a.b=null"]) == {
        "train": {"epochs": 3},
        "selection": {"ratio": {"kind": "cosine"}},
        "ray": {"use_gpu": True},
        "a": {"b": None},
    }
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_overrides(["epochs"])


def test_overrides_apply_on_top_of_the_file():
    cfg = load_experiment(REPO / "experiments/digits_vit.yaml", ["train.epochs=2", "selection.strategy=hard"])
    assert cfg.train.epochs == 2 and cfg.selection.strategy == "hard" and cfg.selection.preset == "vit"


def test_a_bare_off_turns_the_fused_loss_off():
    """YAML reads a bare `off` as false, in a file and on the command line alike; the LLM task's
    fused_loss takes it as "off" (a GPU run's `task.fused_loss=off` was refused)."""
    cfg = load_experiment(REPO / "experiments/gsm8k_smollm2.yaml", ["task.fused_loss=off"])
    assert cfg.task.fused_loss == "off"
    assert load_experiment(REPO / "experiments/gsm8k_smollm2.yaml").task.fused_loss == "auto"
    with pytest.raises(ConfigError, match="fused_loss"):
        load_experiment(REPO / "experiments/gsm8k_smollm2.yaml", ["task.fused_loss=true"])


BAD = {
    "unknown strategy": (["selection.strategy=greedy"], "selection.strategy"),
    "ratio above one": (["selection.ratio.start=1.5"], "(0, 1]"),
    "ratio zero": (["selection.ratio={kind: fixed, start: 0}"], "(0, 1]"),
    "unknown key": (["train.epoch=3"], "train.epoch: unknown key"),
    "wrong type": (["train.epochs=many"], "train.epochs"),
    "negative epochs": (["train.epochs=0"], "train.epochs"),
    "unknown method": (["selection.method=magic"], "selection.method"),
    "unknown preset": (["selection.preset=bert"], "preset"),
    "missing data folder": (
        ["task.dataset=fashion_mnist", "task.data_path=/nonexistent/fmnist"],
        "/nonexistent/fmnist",
    ),
    "bad fault rank": (["fault.fail_rank=3"], "fail_rank"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_refused_before_any_worker_starts(case, tmp_path, monkeypatch, capsys):
    import ray

    monkeypatch.chdir(tmp_path)
    overrides, message = BAD[case]
    ray_was_up = ray.is_initialized()
    code = main(["train", str(REPO / "experiments/digits_vit.yaml"), *overrides])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") < 15, err  # one clear message, not a traceback
    assert ray.is_initialized() == ray_was_up  # no Ray was started or connected for it
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "ray_results").exists()


@pytest.mark.parametrize(
    "text, message",
    [("name: [unclosed", "not valid YAML"), ("", "expected a mapping"), ("- a\n- b\n", "expected a mapping")],
)
def test_bad_yaml_is_refused(text, message, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_missing_file_is_refused(capsys):
    assert main(["validate", "/nonexistent/exp.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_validate_accepts_a_good_file(capsys):
    assert main(["validate", str(REPO / "experiments/digits_vit.yaml")]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # two workers of 64 already take 128 samples a step: a global batch of 64 cannot be kept
        (["ray.num_workers=2", "train.global_batch_size=64"], "lower train.batch_size to 32"),
        # three workers of 64 take 192 samples a step: 256 is no whole number of steps
        (["ray.num_workers=3", "train.global_batch_size=256"], "not a multiple of train.batch_size=64 x 3"),
    ],
)
def test_a_global_batch_accumulation_cannot_reach_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(REPO / "experiments/digits_vit.yaml", overrides)


def test_an_elastic_run_may_round_its_accumulation_at_world_sizes_that_do_not_divide_it():
    # 1, 2 and 4 workers of 32 keep 128 exactly; 3 round up to 2 micro-batches (192)
    cfg = load_experiment(
        REPO / "experiments/digits_vit.yaml",
        ["ray.num_workers=[1, 4]", "train.batch_size=32", "train.global_batch_size=128"],
    )
    assert (cfg.ray.min_workers, cfg.ray.max_workers, cfg.train.global_batch_size) == (1, 4, 128)


def test_a_local_json_stream_counts_the_rows_ray_data_reads(tmp_path):
    """JSON lines count a row a line holding anything; a .json file holding one JSON array (which
    read_json reads whole, a row an item) counts its items, not its lines."""
    import json

    from attent.experiment.schema import StreamConfig

    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(5)]
    (tmp_path / "lines.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    (tmp_path / "array.json").write_text(json.dumps(rows, indent=2))  # 22 lines
    assert StreamConfig(format="jsonl", path=str(tmp_path / "lines.jsonl")).local_rows() == 5
    assert StreamConfig(format="jsonl", path=str(tmp_path / "array.json")).local_rows() == 5
    assert StreamConfig(format="jsonl", path=str(tmp_path)).local_rows() == 10
