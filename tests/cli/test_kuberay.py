"""deploy/kubernetes/, checked offline: every manifest against the pinned KubeRay release's CRD schemas
(unknown fields refused, as kubeconform -strict refuses them) and KubeRay's cross-field rules, the plain
objects' structure (tests/helpers/kuberay.py says what is checked); a broken copy fails naming the field;
the RayJob and RayCluster are what `attent kuberay` writes for their experiment, sized from its ray:
section; the pods, the server, the Secrets, the image and the guide agree with one another."""

from __future__ import annotations

import copy
import re
import shlex
import types
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from attent.cli import kuberay
from attent.cli.main import main as attent_main
from attent.engine.preflight.resources import fit_count, worker_bundle
from attent.experiment.schema import RayConfig

from tests.helpers import kuberay as k8s
from tests.helpers.paths import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
GUIDE = (REPO / "docs" / "guides" / "kubernetes.md").read_text()
FILES = sorted(p.name for p in DEPLOY.glob("*.yaml"))
DOCUMENTS = [(name, i, doc) for name in FILES for i, doc in enumerate(k8s.load(DEPLOY / name))]
IMAGE = "registry.example/attent:SET-ME"


def document(kind: str, name: str | None = None) -> dict:
    found = [doc for _, _, doc in DOCUMENTS if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"{kind} {name}: {len(found)} shipped"
    return copy.deepcopy(found[0])


def pods() -> dict[str, dict]:
    """Every pod spec shipped, by where it is."""
    found = {"Deployment attent-server": document("Deployment")["spec"]["template"]["spec"]}
    for kind, spec in (("RayCluster", document("RayCluster")["spec"]), ("RayJob", document("RayJob")["spec"])):
        spec = spec.get("rayClusterSpec", spec)
        found[f"{kind} head"] = spec["headGroupSpec"]["template"]["spec"]
        for group in spec["workerGroupSpecs"]:
            found[f"{kind} {group['groupName']}"] = group["template"]["spec"]
    return found


def ray_pods() -> dict[str, dict]:
    return {where: pod for where, pod in pods().items() if where.startswith("Ray")}


@pytest.mark.parametrize("name,index,doc", DOCUMENTS, ids=[f"{n}-{d['kind']}" for n, _, d in DOCUMENTS])
def test_every_shipped_manifest_validates(name, index, doc):
    assert k8s.problems(doc) == []
    assert doc["metadata"].get("namespace") == kuberay.NAMESPACE or doc["kind"] == "Namespace"


def set_path(doc: dict, path: str, value) -> dict:
    """``doc`` with ``value`` at a dotted path (``a.b[0].c``); ``...`` removes the key."""
    keys = [int(part) if part.isdigit() else part for part in re.findall(r"[^.\[\]]+", path)]
    node = doc
    for key in keys[:-1]:
        node = node[key]
    if value is ...:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return doc


GROUP = "spec.rayClusterSpec.workerGroupSpecs[0]"
BROKEN = [
    # (kind, the change, the field the refusal names)
    ("RayJob", (f"{GROUP}.replicaz", 1), f"{GROUP}.replicaz: unknown field"),
    ("RayJob", (f"{GROUP}.maxReplicas", "1"), f"{GROUP}.maxReplicas: '1' is not of type 'integer'"),
    ("RayJob", ("spec.rayClusterSpec.authOptions.mode", "tokens"), "spec.rayClusterSpec.authOptions.mode: 'tokens'"),
    (
        "RayJob",
        ("spec.shutdownAfterJobFinishes", False),
        "spec.ttlSecondsAfterFinished: needs shutdownAfterJobFinishes",
    ),
    ("RayJob", (f"{GROUP}.minReplicas", 3), f"{GROUP}.minReplicas: 3 is greater than maxReplicas 1"),
    ("RayJob", ("spec.rayClusterSpec.rayVersion", "2.50.0"), "spec.rayClusterSpec.rayVersion: 2.50.0 is below 2.52.0"),
    ("RayJob", ("metadata.name", "Multimae_job"), "metadata.name: 'Multimae_job' is no DNS-1035 label"),
    ("RayCluster", ("spec.headGroupSpec", ...), "spec.headGroupSpec: required field missing"),
    (
        "RayCluster",
        ("spec.workerGroupSpecs[0].template.spec.containers[0].resources.limits.cpu", "eighty"),
        "spec.workerGroupSpecs[0].template.spec.containers[0].resources.limits.cpu: 'eighty' does not match",
    ),
    (
        "RayCluster",
        ("spec.headGroupSpec.template.spec.containers[0].volumeMounts[0].name", "sharedd"),
        "spec.headGroupSpec.template.spec.containers[0].volumeMounts[0].name: 'sharedd' is no volume of the pod",
    ),
    ("Deployment", ("spec.template.spec.containers[0].imagee", IMAGE), "spec.template.spec.containers[0].imagee"),
    ("Deployment", ("spec.selector.matchLabels", {"app": "x"}), "spec.selector.matchLabels: do not select"),
    ("Service", ("spec.ports[0].port", "https"), "spec.ports[0].port: 'https' is not of type 'integer'"),
    ("PersistentVolumeClaim", ("spec.accessModes", ["ReadWriteAll"]), "spec.accessModes: ['ReadWriteAll']"),
]


@pytest.mark.parametrize("kind,change,named", BROKEN, ids=[f"{kind}-{change[0]}" for kind, change, _ in BROKEN])
def test_a_broken_manifest_fails_naming_the_field(kind, change, named):
    name = "attent-tracking" if kind == "PersistentVolumeClaim" else None
    broken = set_path(document(kind, name), *change)
    found = k8s.problems(broken)
    assert any(line.startswith(named) for line in found), found


def header_command(name: str) -> list[str]:
    first = (DEPLOY / name).read_text().splitlines()[0]
    assert first.startswith("# attent kuberay "), first
    return shlex.split(first.removeprefix("# attent "))


@pytest.mark.parametrize("name", ["rayjob.yaml", "raycluster.yaml"])
def test_the_shipped_rayjob_and_raycluster_are_what_attent_kuberay_writes(name, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / name
    assert attent_main([*header_command(name), "--out", str(out)]) == 0
    assert out.read_text() == (DEPLOY / name).read_text(), (
        f"deploy/kubernetes/{name} is not what `attent {' '.join(header_command(name))}` writes now: run it with "
        f"--out deploy/kubernetes/{name}"
    )


def shape(doc: dict) -> tuple[int, dict[str, str]]:
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    (group,) = spec["workerGroupSpecs"]
    return group["maxReplicas"], group["template"]["spec"]["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize(
    "path,overrides,per_pod,pods,limits",
    [
        ("experiments/digits_vit.yaml", ["ray.num_workers=2", "ray.cpus_per_worker=2"], 1, 2, {"cpu": "2"}),
        ("experiments/multimae_gpu.yaml", [], 8, 1, {"cpu": "80", "nvidia.com/gpu": "8"}),
        ("experiments/multimae_gpu.yaml", [], 3, 3, {"cpu": "30", "nvidia.com/gpu": "3"}),
        ("experiments/multimae_gpu.yaml", ["ray.cpus_per_worker=1.5"], 1, 8, {"cpu": "1500m", "nvidia.com/gpu": "1"}),
        ("experiments/sweeps/ablation_digits.yaml", ["ray.num_workers=2"], 1, None, {"cpu": "1"}),
    ],
)
def test_the_pods_are_sized_from_the_experiments_ray_section(path, overrides, per_pod, pods, limits, monkeypatch):
    monkeypatch.chdir(REPO)
    job = kuberay.manifest(path, overrides, image=IMAGE, workers_per_pod=per_pod)
    assert k8s.problems(job) == []
    replicas, got = shape(job)
    if path.startswith("experiments/sweeps/"):
        from attent.sweep.spec import load_sweep

        sweep = load_sweep(path, overrides)
        pods = 2 * min(sweep.spec.max_concurrent or 1, len(sweep.trials))
        assert job["spec"]["entrypoint"].startswith(f"attent sweep {kuberay.IMAGE_ROOT}/{path} ray.num_workers=2 ")
    assert replicas == pods and {key: got[key] for key in limits} == limits
    assert ("nvidia.com/gpu" in got) == ("nvidia.com/gpu" in limits)
    # the job's own command writes checkpoints to the shared volume and logs through the server
    assert f"ray.storage_path={kuberay.STORAGE_PATH}" in job["spec"]["entrypoint"]
    assert f"mlflow.tracking_uri={kuberay.tracking_uri()}" in job["spec"]["entrypoint"]


def test_an_elastic_worker_count_sizes_the_pods_for_its_top():
    assert kuberay.max_workers(4) == 4 and kuberay.max_workers((2, 6)) == 6 and kuberay.max_workers([1, 3]) == 3


def test_the_raycluster_hosts_each_gpu_experiment():
    replicas, limits = shape(document("RayCluster"))
    pod = {"CPU": float(limits["cpu"]), "GPU": float(limits.get("nvidia.com/gpu", 0))}
    for path in sorted((REPO / "experiments").glob("*.yaml")):
        section = (yaml.safe_load(path.read_text()) or {}).get("ray", {})
        if not section.get("use_gpu"):
            continue
        ray = RayConfig.model_validate(section)
        capacity = fit_count(worker_bundle(types.SimpleNamespace(ray=ray)), pod) * replicas
        assert capacity >= kuberay.max_workers(ray.num_workers), (
            f"{path.name}: {ray.num_workers} workers, room for {capacity}"
        )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["experiments/digits_vit.yaml", "--workers-per-pod", "0"], "--workers-per-pod 0: give at least 1"),
        (["/etc/hosts.yaml"], "config file '/etc/hosts.yaml' does not exist"),
        (["experiments/digits_vit.yaml", "--memory-per-cpu", "4G"], "--memory-per-cpu 4G: give whole gibibytes"),
    ],
)
def test_attent_kuberay_refuses_bad_input_in_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert attent_main(["kuberay", *argv, "--image", IMAGE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attent kuberay: error: ") and message in err[0], err


def test_ray_is_the_locks_the_images_and_the_manifests():
    lock = dict(
        line.split("==") for line in (REPO / "requirements" / "platform.lock").read_text().split() if "==" in line
    )
    assert kuberay.RAY_VERSION == lock["ray"] == version("ray")
    for kind in ("RayCluster", "RayJob"):
        spec = document(kind)["spec"]
        assert spec.get("rayClusterSpec", spec)["rayVersion"] == kuberay.RAY_VERSION


def test_the_pinned_release_is_named_with_its_commit_and_licence():
    readme = (DEPLOY / "schemas" / "README.md").read_text()
    assert f"KubeRay **{k8s.RELEASE}**" in readme and re.search(r"commit\*\* `[0-9a-f]{40}`", readme)
    assert "Apache License 2.0" in readme and "Apache License" in (DEPLOY / "schemas" / "LICENSE").read_text()
    assert sorted(p.name for p in (DEPLOY / "schemas").glob("*.json")) == ["raycluster_v1.json", "rayjob_v1.json"]
    assert f"--version {k8s.RELEASE.removeprefix('v')}" in GUIDE  # the operator the guide installs


def secrets_named(pod: dict) -> set[str]:
    names = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", []) if "valueFrom" in e}
    return names


def test_every_secret_and_claim_the_manifests_name_is_made_by_the_guide_or_shipped():
    created = set(re.findall(r"kubectl -n attent create secret (?:generic|tls) ([\w-]+)", GUIDE))
    named = set().union(*(secrets_named(pod) for pod in pods().values()))
    named |= {document(kind)["spec"].get("rayClusterSpec", document(kind)["spec"])["authOptions"]["secretName"]
              for kind in ("RayCluster", "RayJob")}  # fmt: skip
    assert named == created == {kuberay.RAY_TOKEN_SECRET, kuberay.TLS_SECRET, kuberay.CREDENTIALS_SECRET}
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for pod in pods().values()
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    shipped = {doc["metadata"]["name"] for _, _, doc in DOCUMENTS if doc["kind"] == "PersistentVolumeClaim"}
    assert claims == shipped
    shared = document("PersistentVolumeClaim", kuberay.SHARED_CLAIM)["spec"]["accessModes"]
    assert shared == ["ReadWriteMany"], "Ray pods on several nodes write the checkpoints at once"


def server_args() -> tuple[types.SimpleNamespace, dict]:
    """`attent server`'s arguments in the Deployment, parsed by attent's own parser, and its container."""
    import argparse

    from attent.cli.main import add_run_commands
    from attent.cli.services import add_service_commands

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_run_commands(sub)
    add_service_commands(sub)
    container = document("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][0] == "attent"
    return parser.parse_args(container["command"][1:]), container


def mount_of(container: dict, pod: dict, path: str) -> tuple[dict, dict]:
    """The mount holding ``path`` and its volume."""
    mount = max(
        (m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")),
        key=lambda m: len(m["mountPath"]),
    )
    return mount, next(v for v in pod["volumes"] if v["name"] == mount["name"])


def test_the_server_keeps_its_users_and_store_on_its_volume_and_serves_https_with_users():
    args, container = server_args()
    pod = document("Deployment")["spec"]["template"]["spec"]
    assert args.command == "server" and args.auth is True and args.port == kuberay.SERVER_PORT
    for path in (args.backend_store_uri.removeprefix("sqlite:///"), args.auth_dir, args.artifacts_destination):
        _, volume = mount_of(container, pod, path)
        assert volume["persistentVolumeClaim"]["claimName"] == "attent-tracking", path
    _, cert = mount_of(container, pod, args.tls_cert)
    assert cert["secret"] == {"secretName": kuberay.TLS_SECRET, "items": [{"key": "tls.crt", "path": "tls.crt"}]}
    # the key: copied 0600 by the init container from the Secret into a memory volume
    mount, key = mount_of(container, pod, args.tls_key)
    assert key == {"name": mount["name"], "emptyDir": {"medium": "Memory"}}
    (init,) = pod["initContainers"]
    assert "install -m 600 " in init["command"][-1] and init["command"][-1].endswith(args.tls_key)
    # Service attent-server reaches this pod at the URI every Ray pod is given, under a name MLflow accepts
    service = document("Service")["spec"]
    assert service["selector"].items() <= pod_labels().items()
    assert service["ports"][0]["port"] == kuberay.SERVER_PORT
    assert service["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}
    host = re.match(r"https://([^:]+):", kuberay.tracking_uri()).group(1)
    assert host.startswith(f"{document('Service')['metadata']['name']}.{kuberay.NAMESPACE}.")
    assert {host, f"{host}:*", "localhost:*"} <= set(args.allowed_hosts.split(","))
    assert re.search(rf"subjectAltName=DNS:{re.escape(host)},", GUIDE)  # the guide's certificate names it


def pod_labels() -> dict:
    return document("Deployment")["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("where", sorted(ray_pods()))
def test_every_ray_pod_logs_through_the_server_over_tls_with_the_users_credentials(where):
    pod = ray_pods()[where]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLFLOW_TRACKING_URI"] == kuberay.tracking_uri() and env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.25"
    mount, volume = mount_of(container, pod, env["MLFLOW_TRACKING_SERVER_CERT_PATH"])
    assert volume["secret"]["items"] == [{"key": "tls.crt", "path": "tls.crt"}], "the TLS key is the server's alone"
    mount, volume = mount_of(container, pod, f"{kuberay.HOME}/.mlflow/credentials")
    assert volume["secret"]["secretName"] == kuberay.CREDENTIALS_SECRET and mount["readOnly"]
    mount, volume = mount_of(container, pod, f"{kuberay.STORAGE_PATH}/x")
    assert volume["persistentVolumeClaim"]["claimName"] == kuberay.SHARED_CLAIM
    assert not any("PASSWORD" in name or "TOKEN" in name for name in env), "secrets come from Secrets, not the manifest"
    assert pod["securityContext"]["runAsUser"] == kuberay.UID and container["image"] == IMAGE


def test_the_image_installs_what_the_cluster_files_install():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    cluster = (REPO / "cluster.yaml").read_text()
    extras = re.search(r"attent\[([\w,]+)\] @ file://", cluster).group(1)
    assert f"-c requirements/platform.lock '.[{extras}]'" in dockerfile
    assert re.search(r"uv venv --python (3\.\d+)", cluster).group(1) in re.search(
        r"FROM python:([\d.]+)", dockerfile
    ).group(1)
    assert f"WORKDIR {kuberay.IMAGE_ROOT}" in dockerfile and f"--uid {kuberay.UID}" in dockerfile
    assert f"HOME={kuberay.HOME}" in dockerfile and "wget" in dockerfile  # KubeRay's probes run wget
    for _, _, doc in DOCUMENTS:
        assert IMAGE not in yaml.safe_dump(doc) or doc["kind"] in ("Deployment", "RayCluster", "RayJob")
    images = {c["image"] for pod in pods().values() for c in pod["containers"] + pod.get("initContainers", [])}
    assert images == {IMAGE}, "one image, one pin: the guide's sed replaces it everywhere"


def test_the_guide_walks_from_the_operator_to_an_mlflow_run():
    steps = [
        "helm install kuberay-operator kuberay/kuberay-operator",
        "docker build -f deploy/kubernetes/Dockerfile",
        "kubectl apply -f deploy/kubernetes/namespace.yaml -f deploy/kubernetes/storage.yaml",
        "kubectl apply -f deploy/kubernetes/tracking-server.yaml",
        "attent server users add me",
        "kubectl apply -f deploy/kubernetes/raycluster.yaml",
        "ray job submit --address http://127.0.0.1:8265",
        "attent kuberay experiments/multimae_gpu.yaml --image",
        "kubectl apply -f job.yaml",
        "port-forward svc/attent-server 5000",
        "attent report --experiment multimae-vitb16 --tracking-uri https://127.0.0.1:5000",
    ]
    positions = [GUIDE.find(step) for step in steps]
    assert -1 not in positions and positions == sorted(positions), dict(zip(steps, positions))
    assert f"svc/{document('RayCluster')['metadata']['name']}-head-svc" in GUIDE  # KubeRay's head Service
    assert f"rayjob {document('RayJob')['metadata']['name']}" in GUIDE
    for name in FILES:
        assert f"deploy/kubernetes/{name}" in GUIDE, f"the guide never names {name}"
    assert Path(REPO / "mkdocs.yml").read_text().count("guides/kubernetes.md") == 1
