"""A file's stand-in, derived without Ray: every paper-scale file shrinks to the stand-in size with its stages kept
(its data paths and sources, the architecture family, the selection, a checkpoint each epoch, one failure and its
resume, the downstream jobs), under names of its own; a sweep's covering trials set every kind of setting the file
sets; what cannot be reached is named one line each before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from attent.cli.main import main
from attent.experiment.cluster_layout import SHARED
from attent.experiment.files import load_experiment
from attent.rehearsal import standin
from attent.rehearsal.run import derive
from attent.sweep.spec import load_sweep
from attent.tasks.config import STAND_IN

from tests.helpers.paths import REPO

PAPER_SCALE = sorted(REPO.glob("experiments/*_gpu.yaml")) + sorted(REPO.glob("experiments/sweeps/*_gpu.yaml"))


@pytest.mark.parametrize("path", PAPER_SCALE, ids=lambda p: p.name)
def test_a_paper_scale_file_shrinks_with_its_stages_kept(path):
    rehearsal = derive(str(path), [], use_gpu=True, shared=((SHARED,), "/stand-in"))
    for cfg in rehearsal.experiments():
        assert cfg.name.endswith(standin.SUFFIX) or standin.SUFFIX + "-t" in cfg.name
        assert cfg.mlflow.experiment.endswith(standin.SUFFIX)
        assert cfg.ray.max_workers <= standin.WORKERS and cfg.ray.checkpoint_every == 1
        assert cfg.ray.max_workers or rehearsal.sweep  # local mode: a sweep's later trials only
        assert cfg.train.batch_size <= standin.BATCH and cfg.train.epochs <= 2 * standin.EPOCHS
        assert cfg.ray.storage_path.startswith("/stand-in/shared/")  # the shared storage, moved
        assert cfg.task.train_limit <= STAND_IN.train_samples
        model = getattr(cfg.task, "model", None)
        if hasattr(model, "depth"):
            assert model.depth == STAND_IN.depth and model.embed_dim == STAND_IN.width
        for job in cfg.downstream:
            assert job.train.epochs == 1 and job.task["train_limit"] <= STAND_IN.train_samples
            assert job.task.get("head_hidden", 0) <= STAND_IN.channels  # a dense head's conv at the stand-in width
            assert cfg.downstream_experiment(job, pretrained=None).ray.max_workers <= standin.WORKERS
    first = rehearsal.experiments()[0]
    assert first.fault.fail_once_after_epoch == standin.FAULT_AFTER_EPOCH  # a failure and the resume from it
    original = dict(load_sweep(path).trials)[rehearsal.sweep.trials[0][0]] if rehearsal.sweep else load_experiment(path)
    assert [job.name for job in first.downstream] == [job.name for job in original.downstream]
    assert type(first.task) is type(original.task) and first.selection.method == original.selection.method


@pytest.mark.parametrize("path", sorted(REPO.glob("experiments/sweeps/*.yaml")), ids=lambda p: p.name)
def test_the_covering_trials_set_every_kind_of_setting_the_sweep_sets(path):
    sweep = load_sweep(path)
    chosen = dict(standin.covering_trials(sweep))
    first = [tid for tid, cfg in sweep.trials if cfg.seed == sweep.spec.seeds[0]]
    assert set(chosen) <= set(first)

    def kinds(ids):
        return {(k, standin._kind(v)) for tid in ids for k, v in sweep.settings[tid].items()} | {
            (cfg.selection.method, str(cfg.selection.strategy)) for tid, cfg in sweep.trials if tid in ids
        }

    assert kinds(chosen) == kinds(first)


def test_a_longer_control_keeps_its_ratio_to_the_base_and_only_the_whole_first_trial_runs_the_full_length():
    path = REPO / "experiments/sweeps/ratio_multimae_gpu.yaml"
    alone = derive(str(path), [], use_gpu=False, shared=((SHARED,), None)).experiments()
    assert [cfg.train.epochs for cfg in alone] == [standin.EPOCHS, 2 * standin.SETTING_EPOCHS]  # the 2E control
    assert alone[0].ray.num_workers == standin.WORKERS and alone[1].ray.num_workers == 0
    base = frozenset({(path.parent / "../multimae_gpu.yaml").resolve()})  # rehearsed whole by the same command
    beside = derive(str(path), [], use_gpu=False, shared=((SHARED,), None), rehearsed=base).experiments()
    assert [cfg.train.epochs for cfg in beside] == [standin.SETTING_EPOCHS, 2 * standin.SETTING_EPOCHS]
    assert {cfg.ray.num_workers for cfg in beside} == {0} and not any(cfg.downstream for cfg in beside)
    assert {cfg.ray.cpus_per_worker for cfg in beside} == {standin.WORKERS}  # the CPUs its two workers would have
    assert {cfg.task.train_limit for cfg in beside} == {standin.SETTING_SAMPLES}
    assert {cfg.train.loader_workers for cfg in beside} == {0} and alone[0].train.loader_workers == 1


def test_a_files_cycles_fit_the_stand_ins_epochs_with_a_pick_a_redraw_and_an_epoch_on_all_data():
    """multimae_gpu.yaml's 10 cycles of 5 -> 50 subset epochs after a warm-up epoch, in 4 epochs: the
    warm-up, one cycle of 2 subset epochs (Soft re-draws at the second) and 1 on all data; a sweep's
    2-epoch trials: the warm-up and one subset epoch."""
    path = REPO / "experiments/multimae_gpu.yaml"
    (whole,) = derive(str(path), [], use_gpu=False, shared=((SHARED,), None)).experiments()
    assert [(p.selects, p.all_data) for p in whole.plan] == [(False, True), (True, False), (True, False), (False, True)]
    base = frozenset({path.resolve()})
    ablation = REPO / "experiments/sweeps/ablation_multimae_gpu.yaml"
    for cfg in derive(str(ablation), [], use_gpu=False, shared=((SHARED,), None), rehearsed=base).experiments():
        if cfg.train.epochs == standin.SETTING_EPOCHS and cfg.selection.method == "attent":
            assert [(p.selects, p.all_data) for p in cfg.plan] == [(False, True), (True, False)]


def test_an_unreachable_model_and_missing_data_are_named_one_line_each_before_anything_runs(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: the model's tokenizer is not here
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.chdir(tmp_path)
    code = main(["rehearse", "--shared-folder", str(tmp_path / "storage"),
                 str(REPO / "experiments/llm_lora_gpu.yaml"), str(REPO / "experiments/multimae_gpu.yaml")])  # fmt: skip
    out = capsys.readouterr()
    lines = [line for line in out.out.splitlines() if line.startswith(str(REPO))]
    assert code == 2 and len(lines) >= 3, out
    assert any("llm_lora_gpu.yaml: model: model 'meta-llama/Llama-2-7b-hf' cannot be read here" in x for x in lines)
    assert any("multimae_gpu.yaml: data of task multimae:" in x and "imagenet-s50-multimae" in x for x in lines)
    assert any("multimae_gpu.yaml: data of task mae_downstream:" in x and "nyuv2-multimae" in x for x in lines)
    assert "nothing was run or recorded" in out.err
    assert not Path(tmp_path / "storage" / "shared" / "ray_results").exists()  # no run started


def test_a_sweep_leaves_the_failure_and_downstream_jobs_to_its_base_rehearsed_beside_it():
    sweep = REPO / "experiments/sweeps/ablation_multimae_gpu.yaml"
    alone = derive(str(sweep), [], use_gpu=False, shared=((SHARED,), None))
    beside = derive(str(sweep), [], use_gpu=False, shared=((SHARED,), None),
                    rehearsed=frozenset({(REPO / "experiments/multimae_gpu.yaml").resolve()}))  # fmt: skip
    assert alone.experiments()[0].downstream and alone.experiments()[0].fault.fail_once_after_epoch is not None
    assert all(not cfg.downstream and cfg.fault.fail_once_after_epoch is None for cfg in beside.experiments())
    assert {cfg.ray.num_workers for cfg in beside.experiments()} == {0}  # their settings, in the trial's process
    assert {cfg.ray.num_workers for cfg in alone.experiments()[1:]} <= {0} and alone.experiments()[
        0
    ].ray.num_workers == 2
    assert [cfg.name for cfg in beside.experiments()] == [cfg.name for cfg in alone.experiments()]


def test_on_cpus_a_runs_first_downstream_job_keeps_its_workers_and_the_others_train_in_local_mode():
    from attent.rehearsal.run import _on_cpus

    rehearsal = _on_cpus(
        derive(str(REPO / "experiments/multimae_gpu.yaml"), [], use_gpu=True, shared=((SHARED,), None))
    )
    cfg = rehearsal.experiment
    assert not cfg.ray.use_gpu and len(cfg.downstream) == 3
    jobs = [cfg.downstream_experiment(job, pretrained=None) for job in cfg.downstream]
    assert [job.ray.num_workers for job in jobs] == [cfg.ray.num_workers, 0, 0]  # the file's 8, 4 and 2, shrunk
    assert load_experiment(REPO / "experiments/multimae_gpu.yaml").downstream[0].num_workers is None  # the run's
