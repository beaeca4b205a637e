"""`attent kuberay FILE [key=value ...] --image IMAGE`: the KubeRay manifest of an experiment or sweep,
written from its ``ray:`` section, so that the pods' workers, GPUs and CPUs cannot drift from the YAML.

* without ``--cluster``: a RayJob (ray.io/v1) that runs FILE (`attent train`, or `attent sweep` for a
  sweep file) on a cluster of its own, sized to it (pods x workers per pod >= its Ray Train workers,
  times the sweep's concurrent trials), and tears that cluster down when the job ends;
* with ``--cluster``: a RayCluster for sweeps and interactive `ray job submit`: the same pods, from
  zero up to ``--max-pods``, added by Ray's autoscaler when a job asks for them.

Both use what deploy/kubernetes/ sets up in namespace ``attent`` (docs/guides/kubernetes.md): Ray's
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
import sys
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


def container(role: str, image: str, resources: dict[str, str], namespace: str) -> dict:
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
            {"name": "MLFLOW_TRACKING_URI", "value": tracking_uri(namespace)},
            {"name": layout.CERT_ENV, "value": layout.POD_TLS_CERT},
            {"name": "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "value": layout.TRAIN_POLL_S},
        ],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": mounts,
    }
    if role == "head":
        spec["ports"] = [
            {"containerPort": 6379, "name": "gcs-server"},
            {"containerPort": 8265, "name": "dashboard"},
            {"containerPort": 10001, "name": "client"},
        ]
    return spec


def pod_template(
    role: str, image: str, resources: dict[str, str], namespace: str, credentials: str = CREDENTIALS_SECRET
) -> dict:
    spec = {
        "securityContext": {"runAsUser": UID, "runAsGroup": UID, "fsGroup": UID},
        "containers": [container(role, image, resources, namespace)],
        "volumes": [
            {"name": "shared", "persistentVolumeClaim": {"claimName": SHARED_CLAIM}},
            {"name": "mlflow-credentials", "secret": {"secretName": credentials, "defaultMode": 0o440}},
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


def cluster_spec(image: str, namespace: str, group: dict, credentials: str) -> dict:
    """A rayClusterSpec: token auth, a head that trains nothing, one worker group."""
    return {
        "rayVersion": RAY_VERSION,
        "authOptions": {"mode": "token", "secretName": RAY_TOKEN_SECRET},
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},  # drivers only: every Train worker lands on a worker pod
            "template": pod_template("head", image, HEAD_RESOURCES, namespace, credentials),
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
    namespace: str = NAMESPACE,
    workers_per_pod: int = 1,
    max_pods: int | None = None,
    memory_per_cpu: str = "4Gi",
    credentials: str = CREDENTIALS_SECRET,
) -> dict:
    """The RayJob (or, with ``cluster``, the RayCluster) of the experiment or sweep at ``path``."""
    if workers_per_pod < 1:
        raise ValueError(f"--workers-per-pod {workers_per_pod}: give at least 1")
    bundle, workers, at_once, command = experiment_shape(path, overrides)
    per_pod = min(workers_per_pod, workers)
    pods = math.ceil(workers / per_pod) * at_once
    kind = "gpu" if bundle.get("GPU") else "cpu"
    resources = worker_resources(bundle, per_pod, memory_per_cpu)
    template = pod_template("worker", image, resources, namespace, credentials)
    labels = {"app.kubernetes.io/part-of": "attent"}
    if cluster:
        if max_pods is not None and max_pods < 1:
            raise ValueError(f"--max-pods {max_pods}: give at least 1")
        top = max_pods or pods
        group = {"groupName": kind, "replicas": 0, "minReplicas": 0, "maxReplicas": top, "rayStartParams": {}}
        spec = cluster_spec(image, namespace, {**group, "template": template}, credentials)
        spec = {
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"idleTimeoutSeconds": IDLE_TIMEOUT_S, "upscalingMode": "Default"},
            **spec,
        }
        metadata = {"name": dns_label(name or "attent", 53), "namespace": namespace, "labels": labels}
        return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": metadata, "spec": spec}
    group = {"groupName": kind, "replicas": pods, "minReplicas": pods, "maxReplicas": pods, "rayStartParams": {}}
    from ..experiment.files import read_yaml

    data = read_yaml(path)
    run_name = data["sweep"]["name"] if command == "sweep" else data.get("name", Path(path).stem)
    entrypoint = " ".join(
        [
            "attent",
            command,
            image_path(path),
            *overrides,
            f"ray.storage_path={STORAGE_PATH}",
            f"mlflow.tracking_uri={tracking_uri(namespace)}",
        ]
    )
    spec = {
        "entrypoint": entrypoint,
        "shutdownAfterJobFinishes": True,  # the cluster goes when the job ends ...
        "ttlSecondsAfterFinished": TTL_S,  # ... after its logs were kept this long
        "backoffLimit": 0,  # a failed run is not retried from scratch: `attent` resumes from its checkpoints
        "rayClusterSpec": cluster_spec(image, namespace, {**group, "template": template}, credentials),
    }
    metadata = {"name": dns_label(name or run_name), "namespace": namespace, "labels": labels}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata, "spec": spec}


def image_path(path: str) -> str:
    """Where the image holds ``path``, a file of this checkout (given relative to its top)."""
    file = Path(path)
    if file.is_absolute():
        try:
            file = file.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            raise ValueError(
                f"{path} is outside this checkout: give a file of the repository the image holds"
            ) from None
    if ".." in file.parts:
        raise ValueError(f"{path}: give the file relative to the top of the checkout the image was built from")
    return f"{IMAGE_ROOT}/{file.as_posix()}"


def header(argv: list[str] | None) -> str:
    command = " ".join(["attent", "kuberay", *(argv or [])])
    return (
        f"# {command}\n# Written by `attent kuberay` (docs/guides/kubernetes.md): regenerate it, rather than edit it.\n"
    )


def to_yaml(document: dict, argv: list[str] | None = None) -> str:
    import yaml

    return header(argv) + yaml.safe_dump(document, sort_keys=False, width=120)


def add_kuberay_command(sub) -> None:
    p = sub.add_parser(
        "kuberay",
        help="the KubeRay RayJob (or --cluster: RayCluster) of an experiment or sweep, sized from its ray: section",
    )
    p.add_argument("config", help="experiment or sweep YAML of this checkout, e.g. experiments/multimae_gpu.yaml")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, passed on to the job's `attent` command")
    p.add_argument("--image", required=True, help="the image deploy/kubernetes/Dockerfile built at the pinned commit")
    p.add_argument("--cluster", action="store_true", help="a RayCluster (autoscaled from zero pods), not a RayJob")
    p.add_argument("--name", default=None, help="default: the experiment's or sweep's name (RayCluster: attent)")
    p.add_argument("--namespace", default=NAMESPACE)
    p.add_argument("--workers-per-pod", type=int, default=1, help="Ray Train workers per pod (8: one 8-GPU node's)")
    p.add_argument("--max-pods", type=int, default=None, help="--cluster: the most worker pods (default: one run's)")
    p.add_argument("--memory-per-cpu", default="4Gi", help="pod memory per CPU (default 4Gi)")
    p.add_argument(
        "--credentials-secret",
        default=CREDENTIALS_SECRET,
        help=f"the Secret holding the MLflow user's credentials file, key credentials (default {CREDENTIALS_SECRET})",
    )
    p.add_argument("--out", default=None, help="write the manifest here (default: print it)")


def cmd_kuberay(args) -> int:
    document = manifest(
        args.config,
        args.overrides,
        image=args.image,
        cluster=args.cluster,
        name=args.name,
        namespace=args.namespace,
        workers_per_pod=args.workers_per_pod,
        max_pods=args.max_pods,
        memory_per_cpu=args.memory_per_cpu,
        credentials=args.credentials_secret,
    )
    argv = [args.config, *args.overrides, "--image", args.image]
    argv += ["--cluster"] if args.cluster else []
    argv += [f"--{key.replace('_', '-')}={value}" for key, value in option_values(args).items()]
    text = to_yaml(document, argv)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out} ({document['kind']} {document['metadata']['name']})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def option_values(args) -> dict[str, object]:
    """The options given away from their defaults, for the manifest's header line."""
    defaults = {
        "name": None,
        "namespace": NAMESPACE,
        "workers_per_pod": 1,
        "max_pods": None,
        "memory_per_cpu": "4Gi",
        "credentials_secret": CREDENTIALS_SECRET,
    }
    return {key: getattr(args, key) for key, default in defaults.items() if getattr(args, key) != default}
