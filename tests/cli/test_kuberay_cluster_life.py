"""What clusters do to the manifests `attent kuberay` writes: the kubelet's later mounts of the server's
volume, another namespace, the pods' environment, a file given from any folder, a job tried again, the
data Job (the manifests themselves, checked offline: tests/cli/test_kuberay.py)."""

from __future__ import annotations

import os
import shlex

import pytest
import yaml
from attent.cli import kuberay
from attent.cli.main import main as attent_main

from tests.cli.test_kuberay import DEPLOY, IMAGE, document, pods, ray_pods, server_args
from tests.helpers import kuberay as k8s
from tests.helpers.kubelet import kubelet_mount
from tests.helpers.paths import REPO


def test_the_servers_secrets_survive_the_kubelets_later_mounts_of_its_volume(tmp_path):
    """The kubelet redoes a volume's group ownership at every mount unless ``fsGroupChangePolicy:
    OnRootMismatch`` finds its top done already (kubelet_mount); `attent server` refuses secrets
    the group may read. Its first start on a fresh volume, the pod moved (a second mount), its second
    start: with the Deployment's policy the secrets stay 0600; with the default they would not."""
    from attent.server import auth

    args, _ = server_args()
    pod = document("Deployment")["spec"]["template"]["spec"]
    policy, group = pod["securityContext"]["fsGroupChangePolicy"], os.getgid()  # a group this user may give
    for tried, refused in ((policy, False), ("Always", True)):
        volume = tmp_path / tried / "var-lib-attent"  # the claim mounted at /var/lib/attent
        volume.mkdir(parents=True)
        store = args.backend_store_uri.replace("/var/lib/attent", str(volume))
        spec = auth.auth_spec(store, args.auth_dir.replace("/var/lib/attent", str(volume)), "READ", tmp_path)
        kubelet_mount(volume, group, tried)  # the first pod: a new, empty volume
        auth.prepare(spec)
        assert kubelet_mount(volume, group, tried) is refused  # a rollout, a drain, a reschedule
        if refused:
            with pytest.raises(ValueError, match="can be read by other users"):
                auth.prepare(spec)
        else:
            assert auth.prepare(spec)["MLFLOW_AUTH_ADMIN_USERNAME"] == auth.ADMIN


def test_every_pod_keeps_its_volumes_ownership_across_mounts():
    for where, pod in pods().items():
        context = pod["securityContext"]
        assert "fsGroup" not in context or context.get("fsGroupChangePolicy") == "OnRootMismatch", where


def rendered(argv: list[str], tmp_path) -> list[dict]:
    out = tmp_path / "out.yaml"
    assert attent_main(["kuberay", *argv, "--out", str(out)]) == 0
    return k8s.load(out)


def test_another_namespace_holds_every_document_and_every_name_of_the_server(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    shipped = [
        doc for name in ("namespace.yaml", "storage.yaml", "tracking-server.yaml") for doc in k8s.load(DEPLOY / name)
    ]
    assert rendered(["--shared"], tmp_path) == shipped  # one source: the shipped files, moved
    shared = rendered(["--shared", "--namespace", "lab", "--image", "reg/attent:1", "--storage-class", "efs"], tmp_path)
    job = rendered(["experiments/multimae_gpu.yaml", "--image", "reg/attent:1", "--namespace", "lab"], tmp_path)
    for doc in shared + job:
        assert k8s.problems(doc) == [], doc["kind"]
        assert doc["metadata"].get("namespace", doc["metadata"]["name"]) == "lab"
        text = yaml.safe_dump(doc)
        assert ".attent.svc" not in text and "SET-ME" not in text, doc["kind"]
    (deployment,) = [doc for doc in shared if doc["kind"] == "Deployment"]
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert any("attent-server.lab.svc:*" in arg for arg in command)  # MLflow answers the Service's new name
    assert kuberay.tracking_uri("lab") in job[0]["spec"]["entrypoint"]


def test_the_pods_environment_takes_variables_and_secrets_and_refuses_what_it_sets(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    argv = ["experiments/digits_vit.yaml", "--image", IMAGE, "--env", "HF_HOME=/shared/hf", "--env-secret", "hf"]
    (job,) = rendered([*argv, "--queue", "gpus"], tmp_path)
    assert k8s.problems(job) == [] and job["metadata"]["labels"][kuberay.KUEUE_QUEUE_LABEL] == "gpus"
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "HF_HOME", "value": "/shared/hf"} in head["env"] and head["envFrom"] == [
        {"secretRef": {"name": "hf"}}
    ]
    capsys.readouterr()
    for bad, message in (("HF_HOME", "give KEY=VALUE"), ("MLFLOW_TRACKING_URI=x", "set by attent kuberay itself")):
        assert attent_main(["kuberay", "experiments/digits_vit.yaml", "--image", IMAGE, "--env", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_a_file_is_found_in_its_checkout_from_any_folder_and_a_file_outside_one_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO / "experiments")
    (job,) = rendered(["multimae_gpu.yaml", "--image", IMAGE], tmp_path)
    assert job["spec"]["entrypoint"].startswith(f"attent train {kuberay.IMAGE_ROOT}/experiments/multimae_gpu.yaml ")
    outside = tmp_path / "mine.yaml"
    outside.write_text((REPO / "experiments" / "digits_vit.yaml").read_text())
    capsys.readouterr()
    assert attent_main(["kuberay", str(outside), "--image", IMAGE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is in no checkout of attent" in err[0], err


def test_a_sweeps_job_carries_its_sweep_on_when_it_is_tried_again(monkeypatch):
    monkeypatch.chdir(REPO)
    job = kuberay.manifest("experiments/sweeps/ablation_digits.yaml", [], image=IMAGE)
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:2] == ["attent", "sweep"] and words[-1] == "--resume=auto" and job["spec"]["backoffLimit"] > 0


def test_the_data_job_fills_the_shared_volume_as_the_pods_user(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    argv = [
        "experiments/multimae_gpu.yaml",
        "--image",
        IMAGE,
        "--data-job",
        "--data-command",
        "fetch-data /shared/data",
    ]
    (job,) = rendered([*argv, "--env-secret", "hf"], tmp_path)
    assert k8s.problems(job) == [] and job["kind"] == "Job"
    pod = job["spec"]["template"]["spec"]
    assert (
        pod["securityContext"]["runAsUser"] == kuberay.UID == ray_pods()["RayJob head"]["securityContext"]["runAsUser"]
    )
    script = pod["containers"][0]["command"][-1]
    steps = [
        f"test -w {kuberay.SHARED}",
        "fetch-data /shared/data",
        "attent data cache /opt/attent/experiments/multimae_gpu.yaml",
    ]
    assert [script.find(step) for step in steps] == sorted(script.find(step) for step in steps) and -1 not in [
        script.find(step) for step in steps
    ]
