"""What `attent kuberay` writes beside a run's RayJob or RayCluster:

* ``--shared``: deploy/kubernetes/'s namespace, shared volume and tracking server, moved into
  ``--namespace`` (every document's namespace and every in-cluster name of the server), with the
  image and the storage class filled in where given;
* ``--data-job``: a Job that fills the shared volume as the pods' user (a command of yours, e.g. a
  download, then `attent data cache` of the experiment), so that its files belong to the uid every
  Ray pod runs as, whatever the storage class does with ``fsGroup``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from . import kuberay

SHARED_FILES = ("namespace.yaml", "storage.yaml", "tracking-server.yaml")
PLACEHOLDER_IMAGE = "registry.example/attent:SET-ME"  # what the shipped files name until the guide's sed
PLACEHOLDER_CLASS = "SET-ME"


def deploy_folder() -> Path:
    """deploy/kubernetes/ of the checkout attent runs from (the image is built from the same)."""
    for top in Path(__file__).resolve().parents:
        if (top / kuberay.DOCKERFILE).is_file():
            return top / "deploy" / "kubernetes"
    raise ValueError(f"--shared reads {kuberay.DOCKERFILE}'s folder: run attent from a clone of its repository")


def shared_documents(namespace: str, image: str | None = None, storage_class: str | None = None) -> list[dict]:
    """The shipped namespace, shared volume and tracking server, in ``namespace``."""
    import yaml

    documents = []
    for name in SHARED_FILES:
        for document in yaml.safe_load_all((deploy_folder() / name).read_text()):
            if document is None:
                continue
            if document["kind"] == "Namespace":
                document["metadata"]["name"] = namespace
            else:
                document["metadata"]["namespace"] = namespace
            documents.append(renamed(document, namespace, image or PLACEHOLDER_IMAGE))
    for document in documents:
        if document["kind"] == "PersistentVolumeClaim" and storage_class:
            if document["spec"].get("storageClassName") == PLACEHOLDER_CLASS:
                document["spec"]["storageClassName"] = storage_class
    return documents


def renamed(value, namespace: str, image: str):
    """``value`` with the server's in-cluster names in ``namespace`` and the image filled in."""
    if isinstance(value, dict):
        return {key: renamed(item, namespace, image) for key, item in value.items()}
    if isinstance(value, list):
        return [renamed(item, namespace, image) for item in value]
    if isinstance(value, str):
        value = value.replace(f".{kuberay.NAMESPACE}.svc", f".{namespace}.svc")
        return image if value == PLACEHOLDER_IMAGE else value
    return value


def data_job(path: str, overrides: list[str], *, image: str, pods: kuberay.PodSettings, command: str | None) -> dict:
    """A Job that runs ``command`` (then `attent data cache` of the experiment at ``path``) on the
    shared volume as the Ray pods' user, after checking that user may write there."""
    file = kuberay.image_path(path)
    cache = shlex.join(["attent", "data", "cache", file, *overrides])
    check = (
        f"test -w {kuberay.SHARED} || {{ echo '{kuberay.SHARED} is not writable by uid {kuberay.UID}: its storage "
        f"class ignores fsGroup; chown {kuberay.UID}:{kuberay.UID} its top once (docs/guides/kubernetes.md)' >&2; "
        "exit 1; }"
    )
    script = " && ".join([check, *([command] if command else []), cache])
    container = kuberay.container("data", image, {"cpu": "8", "memory": "32Gi"}, pods)
    container["command"] = ["sh", "-c", script]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] in ("shared", "dshm")]
    container.pop("ports", None)
    spec = {
        "securityContext": dict(kuberay.SECURITY_CONTEXT),
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [
            {"name": "shared", "persistentVolumeClaim": {"claimName": kuberay.SHARED_CLAIM}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    name = kuberay.dns_label(f"{kuberay.run_name(path, 'train')}-data", 63)
    labels = {"app.kubernetes.io/part-of": "attent"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": pods.namespace, "labels": labels},
        "spec": {
            "backoffLimit": 2,  # a transient failure (a node lost, a read timed out) is tried again
            "ttlSecondsAfterFinished": 86400,
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }
