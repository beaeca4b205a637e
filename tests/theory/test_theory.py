"""The theory lab (attent.theory, run by attent.lab): closed-form gradients vs autograd, the empirical
ANTK vs a brute-force computation, the greedy teacher, the attention variants, and the teaching
experiment's MLflow output. CPU only, a few seconds each."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attent.experiment.schema import ConfigError
from attent.theory.config import load
from attent.theory.gradients import GradientCase, gradient_check
from attent.theory.learner import AttentionLearner, attend
from attent.theory.tangent_kernel import brute_force_kernel, empirical_kernel, kernel_drift
from attent.theory.teaching import choose, make_problem
from torch import nn

from tests.helpers.paths import REPO

CONFIG = REPO / "experiments" / "theory_teaching.yaml"
KINDS = ("self", "masked", "cross")


def deviations(key_dim: int, reading: str) -> dict[tuple[str, str], float]:
    rows = gradient_check([GradientCase(kind, key_dim, dim=5) for kind in KINDS], draws=2)
    return {(row["kind"], row["block"]): row["max_rel"] for row in rows if row["reading"] == reading}


@pytest.mark.parametrize("key_dim", [1, 5])
def test_closed_form_gradients_equal_autograd(key_dim):
    """With ω computed from the layer's attention (all d_k columns), the formulas for ∂f/∂W^V,
    ∂f/∂W^Q_(:,i) and ∂f/∂W^K_(:,i) are exact: float64 rounding only, for one and for several
    query/key columns, in all three variants."""
    worst = deviations(key_dim, "full")
    assert len(worst) == 9
    assert max(worst.values()) < 1e-12, worst


def test_single_column_reading_is_exact_only_for_one_column():
    """Reading the per-column formula with column i's attention alone, softmax(Q_(:,i) K_(:,i)ᵀ/√d),
    agrees with autograd for d_k = 1 and is far off for d_k > 1 (measured: relative deviation
    1-8 on W^Q and W^K; the value gradient has no ω and stays exact)."""
    one, several = deviations(1, "column"), deviations(5, "column")
    assert max(one.values()) < 1e-12, one
    for kind in KINDS:
        assert several[(kind, "W_V")] < 1e-12
        assert several[(kind, "W_Q")] > 0.3 and several[(kind, "W_K")] > 0.3, several


def test_empirical_kernel_matches_brute_force():
    torch.manual_seed(0)
    learner = AttentionLearner(4, 3, 2, kind="masked", dtype=torch.float64)
    sequences = torch.randn(5, 6, 4, dtype=torch.float64)
    params = dict(learner.named_parameters())
    fast = empirical_kernel(learner, params, sequences, chunk=2)  # chunks of 2, 2, 1
    assert fast.shape == (5, 5)
    torch.testing.assert_close(fast, brute_force_kernel(learner, params, sequences), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fast, fast.T)

    # any module with a scalar per sample, a subset of its parameters (the rest stays fixed)
    mlp = nn.Sequential(nn.Linear(3, 7), nn.Tanh(), nn.Linear(7, 1)).double()
    inputs = torch.randn(6, 3, dtype=torch.float64)
    last = {name: p for name, p in mlp.named_parameters() if name.startswith("2.")}
    kernel = empirical_kernel(mlp, last, inputs, chunk=4)
    assert not kernel.requires_grad
    torch.testing.assert_close(kernel, brute_force_kernel(mlp, last, inputs), rtol=1e-10, atol=1e-10)
    features = torch.cat([torch.tanh(mlp[0](inputs)), torch.ones(6, 1, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(kernel, features @ features.T)  # the last layer's NTK, by hand

    # a function of (params, *sample): cross-attention with a context per sample
    weights = {name: p.detach() for name, p in AttentionLearner(4, dtype=torch.float64).named_parameters()}
    queries, contexts = torch.randn(3, 5, 4, dtype=torch.float64), torch.randn(3, 2, 4, dtype=torch.float64)
    fn = lambda w, S, C: attend(w, S, C)  # noqa: E731
    torch.testing.assert_close(
        empirical_kernel(fn, weights, (queries, contexts), chunk=2),
        brute_force_kernel(fn, weights, (queries, contexts)),
        rtol=1e-10,
        atol=1e-10,
    )


def test_kernel_drift_separates_scale_from_shape():
    K = torch.tensor([[2.0, 1.0], [1.0, 3.0]])
    drift = kernel_drift([K, 2 * K])
    assert drift["to_final"] == pytest.approx([0.5, 0.0])
    assert drift["alignment_to_final"] == pytest.approx([1.0, 1.0])
    assert drift["step"] == pytest.approx([0.0, 1.0])


def test_greedy_teacher_picks_the_largest_discrepancies():
    cfg = load(CONFIG, ["problem.num_sequences=40", "teach.subset=7"])
    problem = make_problem(cfg.problem, probe=3, seed=3)
    weights = dict(problem.initial)
    chosen = choose("greedy", problem, weights, 7, torch.Generator())
    scores = torch.linalg.vector_norm(attend(weights, problem.sequences) - problem.targets, dim=(1, 2))
    assert sorted(chosen.tolist()) == sorted(scores.argsort(descending=True)[:7].tolist())
    others = torch.ones(40, dtype=torch.bool)
    others[chosen] = False
    assert scores[chosen].min() > scores[others].max()
    randomly = choose("random", problem, weights, 7, torch.Generator().manual_seed(0))
    assert len(set(randomly.tolist())) == 7 and choose("full", problem, weights, 7, torch.Generator()) is None


def test_masked_attention_is_causal_and_cross_attention_shapes():
    torch.manual_seed(0)
    masked = AttentionLearner(4, 3, 5, kind="masked")
    S = torch.randn(2, 6, 4)
    later = S.clone()
    later[:, 3:] += torch.randn(2, 3, 4)  # change elements 3, 4, 5
    before, after = masked(S), masked(later)
    assert before.shape == (2, 6, 5)
    torch.testing.assert_close(before[:, :3], after[:, :3], rtol=0, atol=0)
    assert (before[:, 3:] - after[:, 3:]).abs().max() > 1e-3
    jac = torch.autograd.functional.jacobian(lambda x: masked(x), S[0])  # [6, 5, 6, 4]
    for j in range(5):
        assert jac[j, :, j + 1 :].abs().max() == 0  # output j ignores elements after j
    assert jac[5, :, 5].abs().max() > 0

    cross = AttentionLearner(4, 3, 5, kind="cross")
    queries, context = torch.randn(2, 3, 4), torch.randn(2, 7, 4)
    assert cross(queries, context).shape == (2, 3, 5)
    with pytest.raises(ValueError):
        cross(queries)
    with pytest.raises(ValueError):
        AttentionLearner(4, kind="self")(queries, context)


def test_config_refuses_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match="unknown keys"):
        load(CONFIG, ["teach.bogus=1"])
    with pytest.raises(ConfigError, match="subset"):
        load(CONFIG, ["teach.subset=10000"])
    with pytest.raises(ConfigError, match="integer"):
        load(CONFIG, ["teach.max_iterations=2.5"])


SHORT = [
    "seeds=[0]",
    "problem.num_sequences=32",
    "teach.subset=8",
    "teach.max_iterations=6",
    "kernel.every=4",
    "kernel.probe=3",
    "teach.target_losses=[100.0]",
]


def test_teaching_run_logs_figures_to_mlflow(tmp_path, monkeypatch):
    """A short run of the shipped YAML, as `python -m attent.lab` runs it: one parent run with
    the figures and summaries, one child run per method with its per-iteration curves."""
    from attent.lab.__main__ import main
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = main([str(CONFIG), *SHORT, f"mlflow.tracking_uri={uri}", "--out", str(tmp_path / "out")])
    assert code == 0
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("theory-teaching")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags["attent.role"] == "theory"]
    children = [r for r in runs if r.data.tags["attent.role"] == "theory_run"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    figures = {f.path for f in client.list_artifacts(parent, "figures")}
    assert figures == {
        f"figures/{name}.png"
        for name in ("loss_vs_iterations", "loss_vs_wallclock", "loss_vs_cpu_time", "antk_drift", "kernel_heatmaps")
    }
    local = Path(client.download_artifacts(parent, "figures", str(tmp_path / "dl")))
    assert all((local / Path(name).name).stat().st_size > 1000 for name in figures)
    assert {"summary.md", "summary.json", "gradient_check.md", "config.json"} <= {
        f.path for f in client.list_artifacts(parent)
    }
    assert sorted(r.data.tags["attent.theory.method"] for r in children) == ["full", "greedy", "random"]
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent
        assert len(client.get_metric_history(child.info.run_id, "loss")) == 7  # iterations 0..6
        assert [m.step for m in client.get_metric_history(child.info.run_id, "antk_drift_to_final")] == [0, 4, 6]
        assert child.data.metrics["iterations_to_100"] == 0
    assert parents[0].data.metrics["greedy.iterations_to_100"] == 0
    assert (tmp_path / "out" / "figures" / "antk_drift.png").is_file()
    assert "| greedy |" in (tmp_path / "out" / "summary.md").read_text()


@pytest.fixture
def cli(monkeypatch):
    """`attent ...` in this process (``attent.cli.main.main``), the variables it sets restored after."""
    from attent.cli.main import main

    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "WARNING")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    return main


def test_attent_theory_logs_to_mlflow_tracking_uri(tmp_path, monkeypatch, cli, empty_store):
    """`attent theory` with the shipped YAML and $MLFLOW_TRACKING_URI set: the runs land in that store (as an
    experiment's would, ``experiment.uris.resolve_tracking_uri``), not in ./mlflow.db."""
    import shutil

    from mlflow.tracking import MlflowClient

    work, store = tmp_path / "work", tmp_path / "elsewhere" / "theory.db"
    work.mkdir()
    store.parent.mkdir()
    shutil.copyfile(empty_store, store)
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    assert cli(["theory", str(CONFIG), *SHORT]) == 0
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("theory-teaching").experiment_id])
    parents = [r for r in runs if r.data.tags["attent.role"] == "theory"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.params["mlflow.tracking_uri"] == f"sqlite:///{store}"
    assert len(runs) == 4  # the parent and its three teaching rules' runs
    assert not (work / "mlflow.db").exists()


def test_attent_theory_refuses_a_store_inside_ray_job_submits_copy(tmp_path, monkeypatch, cli, capsys):
    """Under `ray job submit --working-dir .` the default sqlite:///mlflow.db resolves inside Ray's copy of
    the folder, deleted with the job: refused before any run, as an experiment is, by `attent theory` and by
    `attent validate` of the file; an absolute store passes."""
    copy = tmp_path / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123abcd"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for command in (["theory", str(CONFIG), *SHORT], ["validate", str(CONFIG)]):
        assert cli(command) == 2
        err = capsys.readouterr().err
        assert err.startswith(
            f"attent {command[0]}: error: mlflow.tracking_uri resolves to {copy}/mlflow.db, inside Ray's temporary "
            "copy of `ray job submit --working-dir`"
        ), err
        assert "`attent theory FILE mlflow.tracking_uri=sqlite:///$PWD/mlflow.db`" in err
    assert not (copy / "mlflow.db").exists()
    assert cli(["validate", str(CONFIG), f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"]) == 0
