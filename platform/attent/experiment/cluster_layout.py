"""The cluster's layout, in one place: the shared file system every node mounts, what lies on it
(checkpoints, data, the Hugging Face cache, MLflow's artifacts, the tracking server's certificate),
the tracking server's scheme and port, and the environment a job there gets.

`attent kuberay` builds its pods from these names. ``cluster.yaml``, ``cluster-local.yaml``,
``deploy/kubernetes/*.yaml`` and the guides cannot import Python: tests/experiment/test_cluster_layout.py
checks them against this module (``text_problems``), and the GPU experiment and sweep files (and the
bases they name) with ``file_problems``:

    problems = file_problems("experiments/multimae_gpu.yaml")  # [] when every path is the cluster's

Standard library only at import (PyYAML where a file is read): no Ray, MLflow or torch, so the command line reads it
at once.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

SHARED = "/shared"  # EFS on AWS, your NFS on-prem, the ReadWriteMany claim on Kubernetes
STORAGE_PATH = f"{SHARED}/ray_results"  # ray.storage_path: a restarted worker on another node reads it back
DATA_ROOT = f"{SHARED}/data"  # every task.data_path of the GPU files, and the LLM task's offline mirror
HF_HOME = f"{SHARED}/hf"  # the Hugging Face cache: models downloaded once for every node
ATTENT_DATA_DIR = DATA_ROOT  # $ATTENT_DATA_DIR/<dataset>/{train,test}.* before the hub (attent.tasks.llm.sources)
ARTIFACTS = f"{SHARED}/mlflow-artifacts"  # the head's `attent server --artifacts-destination`
TLS_DIR = f"{SHARED}/attent-tls"
TLS_CERT = f"{TLS_DIR}/tls.crt"  # the head's certificate (never its key), which every node trusts
RUNS_DUMP = f"{SHARED}/mlflow.sql"  # the guide's `pg_dump` of the runs before the head is terminated
POD_TLS_CERT = "/etc/attent/tls/tls.crt"  # Kubernetes: the certificate from Secret attent-tracking-tls

TRACKING_SCHEME, TRACKING_PORT = "https", 5000  # the server requires users: never plain HTTP
TRAIN_POLL_S = "0.25"  # Ray Train's worker poll (docs/guides/ray.md)
CERT_ENV = "MLFLOW_TRACKING_SERVER_CERT_PATH"

# What the start commands (cluster.yaml) export for everything `ray start` starts, beside MLFLOW_TRACKING_URI
NODE_ENV = {CERT_ENV: TLS_CERT, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": TRAIN_POLL_S}
# A job's caches on the shared storage (`ray job submit --runtime-env-json`), and, once its models and data
# are there, no network (the milestone's submit line)
JOB_ENV = {"HF_HOME": HF_HOME, "ATTENT_DATA_DIR": ATTENT_DATA_DIR}
OFFLINE_ENV = {**JOB_ENV, "HF_HUB_OFFLINE": "1"}

KNOWN = (STORAGE_PATH, DATA_ROOT, HF_HOME, ARTIFACTS, TLS_DIR, RUNS_DUMP)
# A node's own disk under these, not the shared storage: the roots earlier files used
FOREIGN = ("/mnt", "/data")

PATH = re.compile(r"(?<![\w.~$}>)\]:/*-])/[\w.-][\w./-]*")
URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://([^\s/'\"`)]+)")
WHOLE_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"`)]*")
ENV = re.compile(r"\b([A-Z][A-Z0-9_]*)\b[\"']?\s*[:=]\s*[\"']?([^\s\"'`,}]*)")
COMMENT = re.compile(r"(?:^|\s)#(.*)$")
DATA_KEYS = {"data_path", "data_dir", "cache_path"}


def tracking_uri(host: str) -> str:
    """The tracking server's URI at ``host`` (the head's address, or a Kubernetes Service's name)."""
    return f"{TRACKING_SCHEME}://{host}:{TRACKING_PORT}"


def under(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies in it (``/shared/data2`` does not lie in ``/shared/data``)."""
    path = posixpath.normpath(path)
    return path == root or path.startswith(root + "/")


def is_cluster_path(path: str) -> bool:
    """Whether ``path`` is the shared mount or lies under one of the places this layout names."""
    return posixpath.normpath(path) == SHARED or any(under(path, root) for root in KNOWN)


def path_problem(path: str, strict: bool) -> str | None:
    """Why ``path`` is not the cluster's, or None. ``strict``: every absolute path must be one (the GPU
    files); otherwise only paths on /shared and the foreign roots are judged (the launcher files, guides)."""
    if is_cluster_path(path):
        return None
    if under(path, SHARED):
        return f"{path} is on {SHARED} but none of the cluster's places ({', '.join(KNOWN)})"
    if strict or any(under(path, root) for root in FOREIGN):
        return f"{path} is not on the cluster's shared storage: use {DATA_ROOT}/..., {STORAGE_PATH} or {HF_HOME}"
    return None


def url_problem(scheme: str, netloc: str) -> str | None:
    """A URL of the tracking server's port spoken in another scheme than the server's."""
    port = netloc.rpartition(":")[2]
    if port == str(TRACKING_PORT) and scheme != TRACKING_SCHEME:
        return (
            f"{scheme}://{netloc}: the cluster's tracking server speaks {TRACKING_SCHEME} with users "
            f"(the preflight refuses anything else against it)"
        )
    return None


def text_problems(text: str, *, strict: bool = False) -> list[tuple[int, str]]:
    """(line, problem) for each path, tracking URL or job variable of ``text`` that is not the cluster's.

    Args:
        text: a launcher file, manifest or guide (or a YAML file's comments).
        strict: judge every absolute path (a GPU file's), not only those on /shared and the foreign roots.

    Returns:
        (1-based line number, what is wrong and what the cluster's is), in the text's order.
    """
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        problems = [url_problem(*m.groups()) for m in URL.finditer(line)]
        bare = WHOLE_URL.sub(" ", line)  # a URL's path is no file path
        problems += [path_problem(m.group().rstrip("."), strict) for m in PATH.finditer(bare)]  # a sentence's stop
        problems += [
            f"{name}={value}: the cluster's is {OFFLINE_ENV[name]}"
            for name, value in ENV.findall(line)
            if name in OFFLINE_ENV and value and value != OFFLINE_ENV[name]
        ]
        found += [(number, problem) for problem in problems if problem]
    return found


def flat(value: Any, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, value) of every scalar in ``value``; list items keyed ``key[i]``."""
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in flat(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, list):
        return [item for i, v in enumerate(value) for item in flat(v, f"{prefix}[{i}]")]
    return [(prefix, value)]


def settings(data: dict) -> list[tuple[str, Any]]:
    """(dotted key, value) of every setting of an experiment file, or of a sweep's overrides, grid and trials
    (its base is a file of its own)."""
    if set(data) != {"sweep"} or not isinstance(data["sweep"], dict):
        return flat(data, "")
    sweep = data["sweep"]
    found = flat(sweep.get("overrides") or {}, "sweep.overrides")
    for key, values in (sweep.get("grid") or {}).items():
        found += flat(values if isinstance(values, list) else [values], f"sweep.grid.{key}")
    return found + flat(sweep.get("trials") or [], "sweep.trials")


def setting_problem(key: str, value: Any) -> str | None:
    """Why one setting of a GPU file does not fit the cluster, or None."""
    leaf = re.sub(r"\[\d+\]", "", key).rpartition(".")[2]
    if leaf == "tracking_uri" and value is not None:
        return (
            f"{value}: leave it unset: on the cluster `ray start` gives every process MLFLOW_TRACKING_URI, "
            f"{tracking_uri('<head address>')}"
        )
    if not isinstance(value, str):
        return None
    if leaf == "storage_path" and not under(value, STORAGE_PATH):
        return f"{value}: give {STORAGE_PATH}, the shared storage where a restarted worker finds its checkpoints"
    if leaf in DATA_KEYS and (leaf != "cache_path" or value.startswith("/")) and not under(value, DATA_ROOT):
        return f"{value}: name the data under {DATA_ROOT}, the cluster's shared data root"
    return path_problem(value, strict=True) if value.startswith("/") else None


def comment_problems(text: str) -> list[tuple[int, str]]:
    """(line, problem) of the comments of a YAML file: its paths, tracking URLs and job variables, all strictly."""
    lines = [(match.group(1) if (match := COMMENT.search(line)) else "") for line in text.splitlines()]
    found = text_problems("\n".join(lines), strict=True)
    found += [
        (number, "names a tracking URI: on the cluster `ray start` already gives every process MLFLOW_TRACKING_URI")
        for number, line in enumerate(lines, 1)
        if "mlflow.tracking_uri=" in line or re.search(r"\bMLFLOW_TRACKING_URI\b[\"']?\s*[:=]", line)
    ]
    return sorted(found)


def file_problems(path: str | Path) -> list[str]:
    """``"FILE: KEY: problem"`` for each path, tracking URI or job variable of the experiment or sweep file at
    ``path`` (and the base file a sweep names) that is not the cluster's. Empty when the file fits the cluster.

    Args:
        path: an experiment or sweep YAML file, e.g. ``experiments/sweeps/ablation_multimae_gpu.yaml``.

    Returns:
        One line per problem, naming the file, the key (or the comment's line) and the fix.
    """
    path = Path(posixpath.normpath(Path(path).as_posix()))
    text = path.read_text()
    import yaml  # the platform's: `attent kuberay` and the CLI import this module without it

    data = yaml.safe_load(text) or {}
    found = [f"{path}: {key}: {problem}" for key, value in settings(data) if (problem := setting_problem(key, value))]
    ray = data.get("ray") if isinstance(data.get("ray"), dict) else {}
    if ray.get("use_gpu") and "storage_path" not in ray:
        found.append(f"{path}: ray.storage_path: unset (a relative ray_results): give {STORAGE_PATH}")
    found += [f"{path}: line {number} (comment): {problem}" for number, problem in comment_problems(text)]
    sweep = data.get("sweep") if set(data) == {"sweep"} else None
    if isinstance(sweep, dict) and sweep.get("base"):
        found += file_problems(path.parent / sweep["base"])
    return found
