"""Variants of AtteNT in the time-to-accuracy report: each paired against full data (at equal cost
and at equal samples) and against its own method, in a family of its own, on a synthetic benchmark
(tests/helpers/tta_benchmark.py, as test_tta_report.py) logged to a real MLflow SQLite store."""

from __future__ import annotations

import pytest
from attent import contract
from attent.analysis.time_to_accuracy.judge import analyse
from attent.analysis.time_to_accuracy.report import build_time_to_accuracy_report
from mlflow import MlflowClient

from tests.helpers.tta_benchmark import log_benchmark, method_specs


def test_variants_are_paired_against_full_data_equal_cost_equal_samples_and_their_method(tmp_path):
    """A variant that ends as AtteNT does (0.866 ± 0.0002): equivalent to AtteNT within the
    margin, better than full data at equal samples (0.80); its own family of 3 comparisons; its
    scoring share and agreement shown."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def specs(seed: int) -> dict[str, dict]:
        base = method_specs(seed)
        wobble = (0.0002, -0.0001, -0.0001)[seed]  # AtteNT ± a little
        return {m: base[m] for m in ("full", contract.METHOD_FULL_EQUAL_SAMPLES, "attent")} | {
            "attent+stale": dict(base["attent"], curve=[v + wobble for v in base["attent"]["curve"]], seconds=5.1)
        }

    log_benchmark(uri, "tta-variants", specs)
    client = MlflowClient(uri)
    for run in client.search_runs([client.get_experiment_by_name("tta-variants").experiment_id]):
        if run.data.tags.get(contract.TAG_BENCH_METHOD, "").startswith("attent"):
            client.log_metric(run.info.run_id, contract.SCORE_AGREEMENT, 0.8, step=3)
    [result], _ = analyse(client, "tta-variants", margins={"vit": 0.002})
    (variant,) = result.variants.to_dict("records")
    assert variant["method"] == "attent+stale"
    assert variant["vs_full_equal_samples_verdict"] == "better"
    assert variant["vs_base_verdict"] == "equivalent within ± 0.002" and variant["vs_base_n"] == 3
    assert "vs_full_equal_cost" not in variant  # the workload has no full data at equal cost
    assert len(result.variant_paired) == 3 and result.margin == 0.002
    assert variant["agreement"] == pytest.approx(0.8)
    assert 0 < variant["scoring_share"] < 1
    text = (
        build_time_to_accuracy_report("tta-variants", tracking_uri=uri, out_dir=tmp_path / "r", margins={"vit": 0.002})
        .joinpath("time_to_accuracy.md")
        .read_text()
    )
    assert "| attent+stale |" in text and "equivalent within ± 0.002" in text
    assert "| − full data | − full data at equal samples | − its method |" in text
