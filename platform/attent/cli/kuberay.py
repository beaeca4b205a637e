"""`attent kuberay FILE [key=value ...] --image IMAGE`: the KubeRay manifest of an experiment or sweep,
written from its ``ray:`` section, so that the pods' workers, GPUs and CPUs cannot drift from the YAML.

* without ``--cluster``: a RayJob (ray.io/v1) that runs FILE (`attent train`, or `attent sweep` for a
  sweep file) on a cluster of its own, sized to it (pods x workers per pod >= its Ray Train workers,
  times the sweep's concurrent trials), and tears that cluster down when the job ends;
* with ``--cluster``: a RayCluster for sweeps and interactive `ray job submit`: the same pods, from
  zero up to ``--max-pods``, added by Ray's autoscaler when a job asks for them.

Both use what deploy/kubernetes/ sets up in ``--namespace`` (``attent``; `attent kuberay --shared` moves
those documents into another: ``attent.cli.kuberay_shared``; docs/guides/kubernetes.md): Ray's
token from Secret ``attent-ray-token`` (``authOptions``), the shared volume at /shared (checkpoints,
``ray.storage_path``, and the data), the tracking server ``attent-server`` over HTTPS, its certificate
(never its key) from Secret ``attent-tracking-tls`` and the user's MLflow credentials file from Secret
``attent-mlflow-credentials``, as ~/.mlflow/credentials. Those paths, the server's scheme and port are
the cluster's layout (``attent.experiment.cluster_layout``), which cluster.yaml follows too. The image is
deploy/kubernetes/Dockerfile's: the repository at /opt/attent, installed with the lock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..experiment import cluster_layout as layout

NAMESPACE = "attent"
RAY_VERSION = "2.60.0"  # the lock's ray, the image's (tests/cli/test_kuberay.py checks both)
RAY_TOKEN_SECRET = "attent-ray-token"  # key auth_token, as KubeRay's authOptions.secretName reads it
CREDENTIALS_SECRET = "attent-mlflow-credentials"  # key credentials: MLflow's credentials file
TLS_SECRET = "attent-tracking-tls"  # kubernetes.io/tls: tls.crt (mounted in Ray pods), tls.key (the server's only)
SHARED_CLAIM = "attent-shared"  # ReadWriteMany: /shared on every pod
SERVER_SERVICE, SERVER_PORT = "attent-server", layout.TRACKING_PORT
IMAGE_ROOT = "/opt/attent"  # where the image holds the repository (experiments/, benchmarks/)
HOME, UID = "/home/attent", 1000  # the image's user
SHARED, STORAGE_PATH = layout.SHARED, layout.STORAGE_PATH
CERT_DIR, CERT_FILE = layout.POD_TLS_CERT.rsplit("/", 1)  # the Secret's tls.crt, mounted alone
HEAD_RESOURCES = {"cpu": "4", "memory": "16Gi"}  # GCS, dashboard, job drivers, Tune trials' drivers
TTL_S = 600  # a finished RayJob's cluster is kept 10 minutes (its logs), then deleted
IDLE_TIMEOUT_S = 600  # an idle pod of the RayCluster is given back after 10 minutes
RETRIES = 2  # a failed RayJob is submitted again on a new cluster this many times, carrying its work on
DOCKERFILE = "deploy/kubernetes/Dockerfile"  # marks a checkout's top: the image copies it to IMAGE_ROOT
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def pod_env(namespace: str = NAMESPACE) -> dict[str, tuple[str, str]]:
    """The pods' environment that attent kuberay sets itself (``--env`` may not): name -> (value, why)."""
    return {
        "MLFLOW_TRACKING_URI": (tracking_uri(namespace), "the tracking server's URL in --namespace"),
        layout.CERT_ENV: (layout.POD_TLS_CERT, "the server's certificate, mounted from its Secret"),
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": (layout.TRAIN_POLL_S, "Ray Train's poll of its workers"),
    }


def tracking_uri(namespace: str = NAMESPACE) -> str:
    """The tracking server's URI as every pod of ``namespace`` reaches it (its Service's name)."""
    return layout.tracking_uri(f"{SERVER_SERVICE}.{namespace}.svc")


def quantity(cpus: float) -> str:
    """A CPU count as Kubernetes writes it ("8", "1500m")."""
    return str(int(cpus)) if float(cpus).is_integer() else f"{round(cpus * 1000)}m"


def gibibytes(text: str) -> int:
    match = re.fullmatch(r"(\d+)Gi", text)
    if not match:
        raise ValueError(f"--memory-per-cpu {text}: give whole gibibytes, e.g. 4Gi")
    return int(match.group(1))


def dns_label(name: str, limit: int = 47) -> str:
    """``name`` as a DNS-1035 label (KubeRay's names; a RayJob's at most 47 characters)."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    label = re.sub(r"^[^a-z]+", "", label)[:limit].rstrip("-")
    if not label:
        raise ValueError(f"{name!r} gives no Kubernetes name: pass --name")
    return label


def max_workers(num_workers) -> int:
    """Ray Train workers a run may use: ``num_workers``, or the top of an elastic ``[min, max]``."""
    return int(max(num_workers)) if isinstance(num_workers, list | tuple) else int(num_workers)


def experiment_shape(path: str, overrides: list[str]) -> tuple[dict[str, float], int, int, str]:
    """(one worker's bundle, workers per run, runs at once, `attent` subcommand) of an experiment or sweep."""
    from ..engine.preflight.resources import worker_bundle
    from ..sweep.spec import is_sweep_file, load_sweep

    if is_sweep_file(path):
        sweep = load_sweep(path, overrides)
        configs, command, at_once = [cfg for _, cfg in sweep.trials], "sweep", sweep.spec.max_concurrent or 1
        at_once = min(at_once, len(configs))
    else:
        from ..experiment.files import load_experiment

        configs, command, at_once = [load_experiment(path, overrides)], "train", 1
    bundles = {tuple(sorted(worker_bundle(cfg).items())) for cfg in configs}
    if len(bundles) > 1:
        raise ValueError(f"{path}: its trials ask for different workers ({sorted(bundles)}): one pod shape fits one")
    bundle = dict(bundles.pop())
    if set(bundle) - {"CPU", "GPU"}:
        raise ValueError(f"{path}: ray.resources_per_worker {sorted(set(bundle) - {'CPU', 'GPU'})}: add them by hand")
    workers = max(max(1, max_workers(cfg.ray.num_workers)) for cfg in configs)
    return bundle, workers, at_once, command


@dataclass(frozen=True)
class PodSettings:
    """What every pod of a manifest shares beyond its image: its namespace, the Secret of the MLflow
    user's credentials, environment variables (``--env``) and Secrets given whole as environment
    (``--env-secret``: ``HF_TOKEN`` and the like, never written into a manifest)."""

    namespace: str = NAMESPACE
    credentials: str = CREDENTIALS_SECRET
    env: tuple[tuple[str, str], ...] = ()
    env_secrets: tuple[str, ...] = ()


def parse_env(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` strings as (key, value) pairs, refusing a malformed one or one the pods set already."""
    parsed = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"--env {pair}: give KEY=VALUE, e.g. --env HF_HOME=/shared/hf")
        if key in (reserved := pod_env()):
            raise ValueError(f"--env {key}: set by attent kuberay itself ({reserved[key][1]})")
        parsed.append((key, value))
    return tuple(parsed)


def container(role: str, image: str, resources: dict[str, str], pods: PodSettings) -> dict:
    """The Ray container: the tracking server's URI and certificate, the shared volume, the credentials."""
    mounts = [
        {"name": "shared", "mountPath": SHARED},  # checkpoints and data (the GPU experiments read /shared/data/...)
        {"name": "mlflow-credentials", "mountPath": f"{HOME}/.mlflow", "readOnly": True},
        {"name": "tracking-tls", "mountPath": CERT_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},  # Ray's object store and DataLoader workers
    ]
    spec = {
        "name": f"ray-{role}",
        "image": image,
        "env": [
            *({"name": key, "value": value} for key, (value, _) in pod_env(pods.namespace).items()),
            *({"name": key, "value": value} for key, value in pods.env),
        ],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": mounts,
    }
    if pods.env_secrets:
        spec["envFrom"] = [{"secretRef": {"name": name}} for name in pods.env_secrets]
    if role == "head":
        spec["ports"] = [
            {"containerPort": 6379, "name": "gcs-server"},
            {"containerPort": 8265, "name": "dashboard"},
            {"containerPort": 10001, "name": "client"},
        ]
    return spec


SECURITY_CONTEXT = {
    "runAsUser": UID,
    "runAsGroup": UID,
    "fsGroup": UID,
    # the kubelet gives the volume's files to fsGroup, group-writable, at a mount only where its top
    # does not match already; "Always" (the default) redoes it over every file at every mount: slow on
    # a large /shared, and it leaves the tracking server's secrets group-readable, which it refuses
    "fsGroupChangePolicy": "OnRootMismatch",
}


def pod_template(role: str, image: str, resources: dict[str, str], pods: PodSettings) -> dict:
    spec = {
        "securityContext": dict(SECURITY_CONTEXT),
        "containers": [container(role, image, resources, pods)],
        "volumes": [
            {"name": "shared", "persistentVolumeClaim": {"claimName": SHARED_CLAIM}},
            {"name": "mlflow-credentials", "secret": {"secretName": pods.credentials, "defaultMode": 0o440}},
            # the certificate alone: the key stays in the tracking server's pod
            {
                "name": "tracking-tls",
                "secret": {"secretName": TLS_SECRET, "items": [{"key": "tls.crt", "path": CERT_FILE}]},
            },
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    if "nvidia.com/gpu" in resources:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": {"app.kubernetes.io/part-of": "attent"}}, "spec": spec}


def worker_resources(bundle: dict[str, float], per_pod: int, memory_per_cpu: str) -> dict[str, str]:
    cpus = bundle["CPU"] * per_pod
    resources = {"cpu": quantity(cpus), "memory": f"{math.ceil(cpus) * gibibytes(memory_per_cpu)}Gi"}
    if bundle.get("GPU"):
        resources["nvidia.com/gpu"] = str(int(bundle["GPU"] * per_pod))
    return resources


def cluster_spec(image: str, group: dict, pods: PodSettings) -> dict:
    """A rayClusterSpec: token auth, a head that trains nothing, one worker group."""
    return {
        "rayVersion": RAY_VERSION,
        "authOptions": {"mode": "token", "secretName": RAY_TOKEN_SECRET},
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},  # drivers only: every Train worker lands on a worker pod
            "template": pod_template("head", image, HEAD_RESOURCES, pods),
        },
        "workerGroupSpecs": [group],
    }


def manifest(
    path: str,
    overrides: list[str],
    *,
    image: str,
    cluster: bool = False,
    name: str | None = None,
    pods: PodSettings = PodSettings(),
    workers_per_pod: int = 1,
    max_pods: int | None = None,
    memory_per_cpu: str = "4Gi",
    queue: str | None = None,
) -> dict:
    """The RayJob (or, with ``cluster``, the RayCluster) of the experiment or sweep at ``path``;
    ``queue``: the Kueue LocalQueue that admits it whole (gang scheduling), where Kueue runs."""
    if workers_per_pod < 1:
        raise ValueError(f"--workers-per-pod {workers_per_pod}: give at least 1")
    bundle, workers, at_once, command = experiment_shape(path, overrides)
    per_pod = min(workers_per_pod, workers)
    count = math.ceil(workers / per_pod) * at_once
    kind = "gpu" if bundle.get("GPU") else "cpu"
    template = pod_template("worker", image, worker_resources(bundle, per_pod, memory_per_cpu), pods)
    labels = {"app.kubernetes.io/part-of": "attent", **({KUEUE_QUEUE_LABEL: queue} if queue else {})}
    if cluster:
        if max_pods is not None and max_pods < 1:
            raise ValueError(f"--max-pods {max_pods}: give at least 1")
        group = {"groupName": kind, "replicas": 0, "minReplicas": 0, "maxReplicas": max_pods or count}
        spec = cluster_spec(image, {**group, "rayStartParams": {}, "template": template}, pods)
        spec = {
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"idleTimeoutSeconds": IDLE_TIMEOUT_S, "upscalingMode": "Default"},
            **spec,
        }
        metadata = {"name": dns_label(name or "attent", 53), "namespace": pods.namespace, "labels": labels}
        return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": metadata, "spec": spec}
    group = {"groupName": kind, "replicas": count, "minReplicas": count, "maxReplicas": count, "rayStartParams": {}}
    spec = {
        "entrypoint": " ".join(job_command(command, image_path(path), overrides, pods.namespace)),
        "shutdownAfterJobFinishes": True,  # the cluster goes when the job ends ...
        "ttlSecondsAfterFinished": TTL_S,  # ... after its logs were kept this long
        # a retry (a new cluster) carries on: a run from its newest checkpoint, a sweep by --resume=auto
        "backoffLimit": RETRIES,
        "rayClusterSpec": cluster_spec(image, {**group, "template": template}, pods),
    }
    metadata = {"name": dns_label(name or run_name(path, command)), "namespace": pods.namespace, "labels": labels}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata, "spec": spec}


def run_name(path: str, command: str) -> str:
    from ..experiment.files import read_yaml

    data = read_yaml(path)
    return data["sweep"]["name"] if command == "sweep" else data.get("name", Path(path).stem)


def job_command(command: str, file: str, overrides: list[str], namespace: str) -> list[str]:
    """The RayJob's ``attent`` command: the same whether it is the first try or a retry, since a run
    resumes from its newest checkpoint and a sweep is told to carry on where it exists."""
    resume = ["--resume=auto"] if command == "sweep" else []
    return [
        "attent",
        command,
        file,
        *overrides,
        f"ray.storage_path={STORAGE_PATH}",
        f"mlflow.tracking_uri={tracking_uri(namespace)}",
        *resume,  # after the overrides: argparse takes no positional after an option
    ]


def image_path(path: str) -> str:
    """Where the image holds ``path``: its place in the checkout it lies in (the folder above it
    holding deploy/kubernetes/Dockerfile, which copies that checkout to /opt/attent), from any folder."""
    file = Path(path).resolve()
    for top in file.parents:
        if (top / DOCKERFILE).is_file():
            return f"{IMAGE_ROOT}/{file.relative_to(top).as_posix()}"
    raise ValueError(
        f"{path} is in no checkout of attent (no {DOCKERFILE} in a folder above it): give a file of the "
        "repository the image is built from"
    )
