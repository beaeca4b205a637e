"""Empirical ANTK tracking (``antk:``) on a short real run (Ray Train, MLflow): probe-set tracking trains exactly as
the same run without it, a worker restart included (the kernels themselves: tests/engine/test_antk.py)."""

from __future__ import annotations

import mlflow
import numpy as np
import pytest
from attent import contract

from tests.helpers import shared_runs


def test_probe_set_tracking_on_a_real_run_trains_identically(restarted_reference, tmp_path):
    """The reference soft run (digits, 2 workers, 4 epochs) tracking its kernel after every epoch,
    and losing its rank 0 after epoch 2: the kernels come back from the checkpoint, and every
    per-epoch number is the reference's (the run without kernels)."""
    tracked = restarted_reference
    shared_runs.assert_reproduces("digits-soft", tracked.epochs, tracked.subsets)

    client = mlflow.MlflowClient(tracked.tracking_uri)
    run = client.get_run(tracked.run_id)
    m = run.data.metrics
    assert m[contract.TIME_ANTK] > 0 and m[contract.ANTK_PARAMETERS] > 0
    assert m[contract.TIME_METHOD] == pytest.approx(m["time_train_s"] + m["time_scoring_s"] + m["time_selection_s"])

    def history(name):
        return {int(x.step): x.value for x in client.get_metric_history(tracked.run_id, name)}

    assert set(history(contract.ANTK_DRIFT_CONSECUTIVE)) == {1, 2, 3}
    to_final = history(contract.ANTK_DRIFT_TO_FINAL)
    assert set(to_final) == {0, 1, 2, 3} and to_final[3] == 0.0 and to_final[0] > 0
    assert history(contract.ANTK_ALIGNMENT_TO_FINAL)[3] == pytest.approx(1.0)

    path = client.download_artifacts(tracked.run_id, contract.ANTK_KERNELS_ARTIFACT, str(tmp_path))
    saved = np.load(path)
    assert saved["epochs"].tolist() == [0, 1, 2, 3]  # epochs 0 and 1 restored, not recomputed
    kernels = saved["kernels"]
    assert kernels.shape == (4, 10, 10) and len(set(saved["probe_indices"].tolist())) == 10
    for kernel in kernels:
        assert np.array_equal(kernel, kernel.T)
        assert np.linalg.eigvalsh(kernel).min() > -1e-6 * np.abs(kernel).max()
    figures = {a.path for a in client.list_artifacts(tracked.run_id, "figures")}
    assert {contract.ANTK_HEATMAP_FIGURE, contract.ANTK_DRIFT_FIGURE} <= figures
