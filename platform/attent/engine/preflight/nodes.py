"""Preflight of what every node of a multi-node Ray cluster must share, after ``ray.init`` and before
any worker starts:

* the MLflow tracking store: the workers (and a sweep's trials) log to it from every node, so a SQLite
  file or an MLflow file store, which lives on one machine, is refused for every multi-node run, whatever
  the command (``check_store_reaches_nodes``, the one rule);
* ``ray.storage_path``: Ray Train's workers write their checkpoints there and the driver reads them, so
  a folder that is not the same on every node fails at the first checkpoint, up to
  ``ray.checkpoint_minutes`` into the run. A small task on every alive node writes a marker file
  there and looks for the driver's; the driver reads every node's back; the markers are removed
  (``check_storage_shared``). A URI (s3://, gs://: pyarrow's file systems) is not checked.

A one-node cluster needs neither. ``check_shared_across_nodes`` makes both, once per process for a
storage path and set of nodes (a benchmark's runs, a run's downstream jobs).
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from ...experiment.schema import PreflightError

MARKER = ".attent-shared-check-"  # + token + "-driver" or "-<node id>": the markers' names
NODE_TIMEOUT_S = 120.0  # a node whose task has not answered by then is left unchecked, with a warning
_CHECKED: set[tuple[str, frozenset[str]]] = set()  # (storage path, node ids) found shared in this process


def check_shared_across_nodes(*cfgs, out=None) -> None:
    """On a connected Ray cluster of several nodes: refuse a tracking store on one machine and a
    ``ray.storage_path`` the nodes do not share, in one line naming each fix. Nothing on one node,
    without Ray, through Ray Client (the driver's files are then on another machine), or in a process
    that is itself a Ray actor (a sweep's trial: the sweep's driver checked)."""
    import ray

    if not ray.is_initialized() or _in_ray_client() or ray.get_runtime_context().get_actor_id() is not None:
        return
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    if len(nodes) < 2:
        return
    uris = dict.fromkeys(cfg.mlflow.tracking_uri for cfg in cfgs)
    paths = dict.fromkeys(cfg.ray.storage_path for cfg in cfgs)
    checks = [partial(check_store_reaches_nodes, uri, len(nodes)) for uri in uris]
    checks += [partial(check_storage_shared, path, nodes, out=out) for path in paths]
    problems = []
    for check in checks:  # every problem at once: a fix of one does not wait for a rerun to meet the next
        try:
            check()
        except PreflightError as problem:
            problems.append(str(problem))
    if problems:
        raise PreflightError(". Also: ".join(problems))


def check_store_reaches_nodes(uri: str | None, nodes: int) -> None:
    """The one rule for a tracking store and a cluster: a SQLite file or an MLflow file store lies on
    one machine, and the workers of a run on ``nodes`` > 1 nodes log from all of them (on another node
    they would write a store of their own, or fail). Refused for every command."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri or nodes < 2 or uri.startswith("databricks"):  # MLflow's one scheme-less URI that is no folder
        return
    scheme = urlsplit(uri).scheme.lower()
    if scheme == "sqlite":
        what, serve = "a SQLite file on this machine", f" --backend-store-uri {uri}"
    elif scheme in ("", "file"):
        what, serve = "an MLflow file store (a folder on this machine)", ""
    else:
        return
    raise PreflightError(
        f"mlflow.tracking_uri {uri} is {what}, but the Ray cluster has {nodes} nodes, and the workers on every "
        f"one of them log to the store; nothing was run or recorded. Fix: run `attent server --host <this "
        f"node's private IP>{serve}` here (a PostgreSQL --backend-store-uri for a lasting store) and set "
        f"mlflow.tracking_uri (or $MLFLOW_TRACKING_URI) to the URL it prints"
    )


def local_storage(storage_path: str) -> Path | None:
    """The folder of a local ``ray.storage_path`` (a path, or a file:// URI); None for another URI."""
    if storage_path.startswith("file://"):
        return Path(urlsplit(storage_path).path)
    return None if "://" in storage_path else Path(storage_path)


def check_storage_shared(storage_path: str, nodes: list[dict], *, out=None, timeout: float = NODE_TIMEOUT_S) -> None:
    """Refuse a local ``storage_path`` that is not the same folder on every node of ``nodes`` (``ray.nodes()``'s,
    alive): the driver writes a marker there, a task pinned to each node (zero CPUs) reads it and writes
    its own, and the driver reads every node's back. The markers are removed, on every node."""
    folder = local_storage(storage_path)
    ids = frozenset(node["NodeID"] for node in nodes)
    if folder is None or (storage_path, ids) in _CHECKED:
        return
    token = uuid.uuid4().hex[:16]
    mine = folder / f"{MARKER}{token}-driver"
    try:
        folder.mkdir(parents=True, exist_ok=True)  # as Ray Train would: the driver's side must hold it
        mine.write_text(token)
    except OSError as error:
        raise PreflightError(
            f"ray.storage_path={storage_path} cannot be written by this driver ({error.strerror or error}); nothing "
            "was run or recorded. Fix: point ray.storage_path at a folder this user may write, on a file system "
            "every node mounts at the same path, or at a cloud URI (s3://…, gs://…)"
        ) from None
    try:
        problems, unchecked = _ask_nodes(folder, token, nodes, timeout)
    finally:
        _remove_markers(folder, token, nodes, mine)
    if unchecked:
        print(
            f"[attent] warning: whether ray.storage_path={storage_path} is shared was not checked on "
            f"{len(unchecked)} node(s) ({'; '.join(unchecked)}): the run goes on",
            file=out or sys.stderr,
            flush=True,
        )
    if problems:
        more = f", and {len(problems) - 1} more node(s)" if len(problems) > 1 else ""
        raise PreflightError(
            f"ray.storage_path={storage_path} is not shared between the Ray cluster's {len(nodes)} nodes "
            f"({problems[0]}{more}): Ray Train's workers write their checkpoints there and the driver reads "
            "them, so the run would fail at its first checkpoint; nothing was run or recorded. Fix: point "
            "ray.storage_path at a file system every node mounts at the same path (NFS, EFS, the pods' "
            "/shared: ray.storage_path=/shared/ray_results) or at a cloud URI (s3://…, gs://…)"
        )
    if not unchecked:
        _CHECKED.add((storage_path, ids))


def _ask_nodes(folder: Path, token: str, nodes: list[dict], timeout: float) -> tuple[list[str], list[str]]:
    """Each node's task (``_node_probe``), then the driver's look for each node's marker: (what each node
    whose view differs sees, the nodes whose task did not answer and why)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_node_probe)
    pending = {}
    for node in nodes:
        pin = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        pending[probe.options(scheduling_strategy=pin).remote(str(folder), token, node["NodeID"])] = node
    ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout)
    problems, unchecked = [], [f"{_name(pending[ref])}: no answer within {timeout:g}s" for ref in late]
    for ref in late:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    for ref in ready:
        node = pending[ref]
        try:
            seen = ray.get(ref)
        except Exception as error:  # the node died or could not start a worker: not a verdict on the path
            unchecked.append(f"{_name(node)}: {type(error).__name__}")
            continue
        if seen is None and not _holds(folder / f"{MARKER}{token}-{node['NodeID']}", token):
            seen = "wrote a file there that the driver cannot see"
        if seen is not None:
            problems.append(f"node {_name(node)} {seen}")
    return problems, unchecked


def _node_probe(folder: str, token: str, node_id: str) -> str | None:
    """On one node: None when the driver's marker is there and this node's could be written beside it,
    else what the node sees instead."""
    path = Path(folder)
    if not path.is_dir():
        return f"has no folder {folder}"
    if not _holds(path / f"{MARKER}{token}-driver", token):
        return f"cannot see the file the driver wrote in {folder}"
    try:
        (path / f"{MARKER}{token}-{node_id}").write_text(token)
    except OSError as error:
        return f"cannot write in {folder} ({error.strerror or error})"
    return None


def _remove_node_marker(folder: str, token: str, node_id: str) -> None:
    Path(folder, f"{MARKER}{token}-{node_id}").unlink(missing_ok=True)


def _holds(marker: Path, token: str) -> bool:
    try:
        return marker.read_text() == token
    except OSError:
        return False


def _remove_markers(folder: Path, token: str, nodes: list[dict], mine: Path) -> None:
    """The driver's marker and every node's it sees; a node's own view is cleaned by a task there
    (where the folder is not shared, its marker is only there)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    mine.unlink(missing_ok=True)
    left = []
    for node in nodes:
        marker = folder / f"{MARKER}{token}-{node['NodeID']}"
        if _holds(marker, token):
            marker.unlink(missing_ok=True)
        else:
            left.append(node)
    remove = ray.remote(num_cpus=0, max_retries=0)(_remove_node_marker)
    refs = [
        remove.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
            str(folder), token, node["NodeID"]
        )
        for node in left
    ]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=30)


def _name(node: dict) -> str:
    return f"{node.get('NodeManagerAddress', '?')} (id {node['NodeID'][:8]})"


def _in_ray_client() -> bool:
    try:
        from ray.util.client import ray as client

        return client.is_connected()
    except Exception:
        return False
