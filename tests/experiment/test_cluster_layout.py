"""The cluster's layout (attent.experiment.cluster_layout) is the one source of its paths and tracking URL.
The GPU experiment and sweep files (and the bases they name), cluster.yaml and cluster-local.yaml, the
KubeRay manifests and the guides name no other, `attent kuberay` holds no copy of its strings, and a file
that names another path or a plain-HTTP tracking server fails, naming the file and the key."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest
import yaml
from attent.cli import kuberay
from attent.experiment import cluster_layout as layout
from attent.experiment.cluster_layout import file_problems, text_problems

from tests.helpers import kuberay as k8s
from tests.helpers.paths import REPO

GPU_FILES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "experiments").rglob("*_gpu.yaml"))
DEPLOY = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "deploy" / "kubernetes").glob("*.yaml"))
LAUNCHERS = ["cluster.yaml", "cluster-local.yaml", *DEPLOY]
GUIDES = ["docs/guides/cluster.md", "docs/guides/kubernetes.md", "docs/pricing.md", "docs/workloads/mae-data.md"]
MULTIMAE = REPO / "experiments" / "multimae_gpu.yaml"
MILESTONE = REPO / "experiments" / "sweeps" / "milestone_llama2_metamath_gpu.yaml"


def test_the_walk_finds_the_gpu_files_and_their_bases():
    assert {"experiments/multimae_gpu.yaml", "experiments/sweeps/milestone_llama2_metamath_gpu.yaml"} <= set(GPU_FILES)
    bases = {(yaml.safe_load((REPO / f).read_text()).get("sweep") or {}).get("base") for f in GPU_FILES}
    assert {"../multimae_gpu.yaml", "../llm_lora_gpu.yaml", "../imagefolder_vit_gpu.yaml"} <= bases


@pytest.mark.parametrize("name", GPU_FILES)
def test_every_gpu_file_names_only_the_clusters_paths(name, monkeypatch):
    monkeypatch.chdir(REPO)
    assert file_problems(name) == []


def write(tmp_path, data: dict, name: str = "bad_gpu.yaml", text: str = "") -> str:
    path = tmp_path / name
    path.write_text(text + yaml.safe_dump(data, sort_keys=False))
    return str(path)


def multimae(**changes) -> dict:
    """experiments/multimae_gpu.yaml with ``changes`` ({"ray.storage_path": ...}) set in it."""
    data = yaml.safe_load(MULTIMAE.read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is None:
            node.pop(leaf)
        else:
            node[leaf] = value
    return data


@pytest.mark.parametrize(
    "changes,key,named",
    [
        ({"ray.storage_path": "/mnt/shared/x"}, "ray.storage_path", "/shared/ray_results"),
        ({"ray.storage_path": "s3://bucket/ray_results"}, "ray.storage_path", "/shared/ray_results"),
        ({"ray.storage_path": None}, "ray.storage_path", "unset"),
        ({"task.data_path": "/data/imagenet-s50-multimae"}, "task.data_path", "/shared/data"),
        ({"downstream.1.task.data_path": "/mnt/nyuv2"}, "downstream[1].task.data_path", "/shared/data"),
        ({"mlflow.tracking_uri": "http://TRACKING_SERVER:5000"}, "mlflow.tracking_uri", "leave it unset"),
        ({"train.init_weights": "/shared/scratch/run"}, "train.init_weights", "none of the cluster's places"),
    ],
)
def test_a_gpu_file_naming_another_path_fails_naming_the_file_and_key(tmp_path, changes, key, named):
    path = write(tmp_path, multimae(**changes))
    (problem,) = file_problems(path)
    assert problem.startswith(f"{path}: {key}: ") and named in problem, problem


def test_a_sweep_is_checked_with_its_base_each_naming_its_own_file(tmp_path):
    base = write(tmp_path, multimae(**{"ray.storage_path": "/mnt/shared/attent/ray_results"}), "base_gpu.yaml")
    sweep = {
        "sweep": {
            "name": "s",
            "base": "base_gpu.yaml",
            "overrides": {"task.data_path": "/shared/data/ok"},
            "grid": {"task.data_path": ["/shared/data/a", "/data/b"]},
            "trials": [{"ray.storage_path": "/scratch/ray_results"}],
        }
    }
    problems = file_problems(write(tmp_path, sweep, "sweep_gpu.yaml"))
    keys = [p.split(": ")[:2] for p in problems]
    assert keys == [
        [str(tmp_path / "sweep_gpu.yaml"), "sweep.grid.task.data_path[1]"],
        [str(tmp_path / "sweep_gpu.yaml"), "sweep.trials[0].ray.storage_path"],
        [base, "ray.storage_path"],
    ], problems


def test_a_comment_naming_another_path_or_a_plain_http_tracking_server_fails(tmp_path):
    """The milestone's submit line as it was: the caches under /mnt/shared and its own tracking URI over HTTP."""
    old = (
        "#   RAY_AUTH_MODE=token ray job submit --address http://HEAD:8265 --working-dir . \\\n"
        '#     --runtime-env-json \'{"env_vars": {"HF_HOME": "/mnt/shared/hf", "HF_HUB_OFFLINE": "1",\n'
        '#       "ATTENT_DATA_DIR": "/mnt/shared/attent-data"}}\' \\\n'
        "#     -- attent sweep experiments/sweeps/milestone_llama2_metamath_gpu.yaml \\\n"
        "#        mlflow.tracking_uri=http://TRACKING_SERVER:5000\n"
    )
    path = write(tmp_path, multimae(), text=old)
    problems = file_problems(path)
    assert all(p.startswith(f"{path}: line ") for p in problems), problems
    text = "\n".join(problems)
    for named in ("/mnt/shared/hf", "HF_HOME=/mnt/shared/hf", "ATTENT_DATA_DIR=", "http://TRACKING_SERVER:5000"):
        assert named in text, named
    assert "line 5 (comment): names a tracking URI" in text and "HEAD:8265" not in text  # the dashboard's is no issue


def test_the_milestone_is_submitted_with_the_layouts_offline_environment():
    comment = " ".join(line.lstrip("# ") for line in MILESTONE.read_text().splitlines() if line.startswith("#"))
    runtime_env = json.loads(re.search(r"--runtime-env-json '([^']*)'", comment).group(1))
    assert runtime_env == {"env_vars": layout.OFFLINE_ENV}
    assert "mlflow.tracking_uri" not in comment and "MLFLOW_TRACKING_URI" not in comment


@pytest.mark.parametrize("name", LAUNCHERS + GUIDES)
def test_the_launchers_manifests_and_guides_name_only_the_clusters_paths(name):
    assert text_problems((REPO / name).read_text()) == []


def test_the_guides_state_the_layouts_paths():
    cluster, kube = (REPO / GUIDES[0]).read_text(), (REPO / GUIDES[1]).read_text()
    for path in (layout.STORAGE_PATH, layout.ARTIFACTS, layout.DATA_ROOT, layout.HF_HOME, layout.TLS_CERT):
        assert path in cluster, path
    assert f"ray.storage_path={layout.STORAGE_PATH}" in kube and f"`{layout.DATA_ROOT}/...`" in kube
    pricing = (REPO / GUIDES[2]).read_text()
    assert f"HF_HOME={layout.HF_HOME} " in pricing and f"{layout.ATTENT_DATA_DIR}/metamathqa/train.json" in pricing


@pytest.mark.parametrize(
    "old,new,named",
    [
        ("/shared/mlflow-artifacts", "/shared/artifacts", "none of the cluster's places"),
        ("https://$HEAD_IP:5000", "http://$HEAD_IP:5000", "speaks https"),
        (
            "  - test -x ~/.local/bin/uv",
            "  - test -e /data || sudo ln -s /shared/data /data\n  - test -x ~/.local/bin/uv",
            "/data",
        ),
    ],
)
def test_a_launcher_naming_another_path_or_scheme_fails(old, new, named):
    text = (REPO / "cluster.yaml").read_text()
    assert old in text
    problems = text_problems(text.replace(old, new, 1))
    assert problems and all(named in p for _, p in problems), problems


def ray_pods() -> list[dict]:
    found = []
    for name in ("rayjob.yaml", "raycluster.yaml"):
        for doc in k8s.load(REPO / "deploy" / "kubernetes" / name):
            spec = doc["spec"].get("rayClusterSpec", doc["spec"])
            found += [group["template"]["spec"] for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]]
    return found


def test_the_kuberay_pods_mount_the_shared_storage_and_trust_the_server_as_the_layout_says():
    for pod in ray_pods():
        (container,) = pod["containers"]
        claims = {v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        assert [m["mountPath"] for m in container["volumeMounts"] if m["name"] in claims] == [layout.SHARED]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env[layout.CERT_ENV] == layout.POD_TLS_CERT
        assert env["MLFLOW_TRACKING_URI"] == kuberay.tracking_uri()
        assert layout.NODE_ENV["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"]
    assert kuberay.tracking_uri().startswith("https://") and kuberay.tracking_uri().endswith(":5000")
    server = (REPO / "deploy" / "kubernetes" / "tracking-server.yaml").read_text()
    assert f"--tls-cert={layout.POD_TLS_CERT}" in server and f"--port={layout.TRACKING_PORT}" in server
    assert f"{{name: {layout.CERT_ENV}, value: {layout.POD_TLS_CERT}}}" in server


def test_attent_kuberay_holds_no_copy_of_the_layouts_strings():
    values = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str | int)}
    values |= {layout.POD_TLS_CERT.rsplit("/", 1)[0]}
    tree = ast.parse((REPO / "platform" / "attent" / "cli" / "kuberay.py").read_text())
    literals = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
    assert sorted(map(str, literals & values)) == []


def test_the_layout_imports_neither_ray_nor_mlflow_nor_torch():
    code = (
        "import sys, attent.experiment.cluster_layout\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'mlflow', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
