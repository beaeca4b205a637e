"""Preflight of a connected Ray cluster's resources, after ``ray.init``: the workers fit its nodes;
if not, an autoscaler that can add nodes makes it a visible wait, anything else a refusal. Which
autoscaler, if any, can add nodes is read from what the cluster publishes in its GCS."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

from ...experiment.schema import PreflightError
from .resources import FIT_EPS, fit_count, fmt_resources, room, trial_shapes

# Set to wait for nodes that will join a cluster without an autoscaler (someone runs `ray start`).
WAIT_ENV = "ATTENT_WAIT_FOR_RESOURCES"
# The v1 autoscaler's monitor writes its status every few seconds; a cluster this young may not
# have one yet.
AUTOSCALER_STATUS_WAIT_S = 10.0


def _total(n: int, bundle: dict[str, float]) -> dict[str, float]:
    return {k: n * v for k, v in bundle.items()}


def check_cluster_resources(*cfgs, driver: dict[str, float] | None = None, out=None) -> None:
    """After ray.init: refuse workers that the connected cluster can never host, unless an
    autoscaler can add the nodes (then say, visibly, what the run waits for). ``driver``: a
    resource bundle one more process needs besides the workers (a Tune trial's driver)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("check_cluster_resources needs a connected Ray (engine.driver.ensure_ray)")
    out = out or sys.stderr
    nodes = [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]
    scaler, looked_up = None, False  # looked up once (it may wait for the monitor's status)
    for n, bundle, strategy in trial_shapes(cfgs):
        fits = room(n, bundle, nodes, strategy)
        driver_fits = driver is None or any(fit_count(driver, node) >= 1 for node in nodes)
        if fits >= n and driver_fits:
            continue
        shortfall = Shortfall(n, bundle, nodes, int(fits), driver if not driver_fits else None)
        if os.environ.get(WAIT_ENV, "").strip().lower() in ("1", "true", "yes"):
            _announce_wait(shortfall, f"{WAIT_ENV} is set", out)  # nodes joining by hand
            continue
        if not looked_up:
            scaler, looked_up = find_autoscaler(), True
        if scaler is None:
            raise PreflightError(
                shortfall.refusal(
                    "and no autoscaler that could add nodes (Ray's read-only monitor only mirrors the "
                    "nodes started by hand)"
                )
            )
        limit = scaler.max_workers(bundle)
        if limit is not None and limit < n:
            raise PreflightError(
                shortfall.refusal(
                    f"and its autoscaler ({scaler.source}) can grow it to room for {int(limit)} such worker(s) "
                    f"at most ({scaler.describe()})"
                )
            )
        _announce_wait(
            shortfall, f"The autoscaler ({scaler.source}; node types {scaler.describe()}) can add nodes", out
        )


@dataclass
class Shortfall:
    n: int
    bundle: dict[str, float]
    nodes: list[dict[str, float]]
    fits: int
    driver: dict[str, float] | None = None

    def have(self) -> dict[str, float]:
        return {k: sum(node.get(k, 0.0) for node in self.nodes) for k in self.bundle}

    def what(self) -> str:
        if self.driver is not None:
            return f"the trial driver needs {fmt_resources(self.driver)} on one node"
        return (
            f"ray.num_workers={self.n} workers need {fmt_resources(_total(self.n, self.bundle))} in all "
            f"({fmt_resources(self.bundle)} each)"
        )

    def cluster(self) -> str:
        import ray

        address = ray.get_runtime_context().gcs_address
        return (
            f"the Ray cluster at {address} has {fmt_resources(self.have())} on {len(self.nodes)} node(s), "
            f"room for {self.fits} such worker(s)"
        )

    def fix(self) -> str:
        if self.driver is not None:
            return "add a node with that much memory, or lower the trial's memory reservation"
        if self.fits == 0:
            per = "ray.cpus_per_worker" if "CPU" in self.bundle else "the per-worker resources"
            return (
                f"no single node can host one worker: lower {per} (or ray.resources_per_worker / "
                f"ray.use_gpu) to what one node has, or add bigger nodes"
            )
        return (
            f"lower ray.num_workers to at most {self.fits} (or the per-worker resources), or add nodes to the cluster"
        )

    def refusal(self, scaler: str) -> str:
        return (
            f"{self.what()}, but {self.cluster()}, {scaler}; nothing was started. Fix: {self.fix()}; "
            f"or, if nodes will join by hand, set {WAIT_ENV}=1 to wait for them"
        )


def _announce_wait(shortfall: Shortfall, why: str, out) -> None:
    print(
        f"[attent] waiting for resources: {shortfall.what()}; {shortfall.cluster()} now. {why}, so the "
        f"run waits for them: Ray Train retries starting its workers every 60 s until the nodes join "
        f"(its timeout warnings meanwhile are expected). Ctrl-C stops the wait; {shortfall.fix()} to run "
        f"on what is there.",
        file=out,
        flush=True,
    )


# --------------------------------------------------------------------------------------------
# Autoscaler detection (Ray 2.60)
# --------------------------------------------------------------------------------------------


@dataclass
class Autoscaler:
    """An autoscaler that can add nodes: where we learnt of it and, when the cluster published
    them, its node groups ((name, resources per node, max nodes; -1 = unbounded))."""

    source: str
    node_types: list[str] = field(default_factory=list)
    groups: list[tuple[str, dict[str, float], int]] | None = None
    max_resources: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        if self.groups:
            return ", ".join(
                f"{name} ({fmt_resources(res)}) × {'unbounded' if count < 0 else count}"
                for name, res, count in self.groups
            )
        return ", ".join(self.node_types) or "unknown"

    def max_workers(self, bundle: dict[str, float]) -> int | float | None:
        """Workers of ``bundle`` the fully grown cluster can host; None when unknown."""
        if self.groups is None:
            return None
        total = 0.0
        for _, resources, count in self.groups:
            per_node = fit_count(bundle, resources)
            if per_node >= 1 and count != 0:
                total += math.inf if count < 0 else per_node * count
        for name, amount in bundle.items():
            if name in self.max_resources:
                total = min(total, math.floor(self.max_resources[name] / amount + FIT_EPS))
        return total


def find_autoscaler(status_wait_s: float = AUTOSCALER_STATUS_WAIT_S) -> Autoscaler | None:
    """The connected cluster's autoscaler if one can add nodes, else None. In order:

    1. The cluster config the autoscaler publishes in the GCS (``ray._private.state.state.
       get_cluster_config()``, node groups with ``max_count``), what Ray Train V2's worker group
       and Ray Data's autoscaler read. Ray 2.60's open-source autoscalers do not publish one yet.
    2. Autoscaler v2 (``ray up``'s default since 2.50, KubeRay optional), known by the GCS flag
       ``is_autoscaler_v2(fetch_from_server=True)``: its status names node types from the
       cluster config; the read-only monitor of a hand-started cluster names them ``node_<id>``.
    3. Autoscaler v1 (KubeRay, older ``ray up``): the monitor's status JSON in the GCS KV
       (``__autoscaling_status``); the read-only provider, used when `ray start --head` had no
       ``--autoscaling-config``, again names every node ``node_<node id>``.
    """
    config = _published_cluster_config()
    if config is not None:
        return config
    try:
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        v2 = is_autoscaler_v2(fetch_from_server=True)
    except Exception:
        v2 = False
    if v2:
        return _autoscaler_v2()
    return _autoscaler_v1(status_wait_s)


def _published_cluster_config() -> Autoscaler | None:
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:
        return None
    if config is None or not config.node_group_configs:
        return None
    groups = [
        (g.name, {k: float(v) for k, v in g.resources.items()}, int(g.max_count)) for g in config.node_group_configs
    ]
    return Autoscaler(
        "cluster config in the GCS",
        [g[0] for g in groups],
        groups,
        {k: float(v) for k, v in config.max_resources.items()},
    )


def readonly_types(mapping: dict[str, str]) -> bool:
    """True if every node's type is the read-only provider's ``node_<node id>`` (no autoscaler)."""
    return all(node_type == f"node_{node_id}" or not node_type for node_id, node_type in mapping.items())


def _autoscaler_v2() -> Autoscaler | None:
    import ray
    from ray.autoscaler.v2.sdk import get_cluster_status

    try:
        status = get_cluster_status(ray.get_runtime_context().gcs_address, timeout=10)
    except Exception:
        return None
    if str(status.stats.autoscaler_version or "0") == "0":
        return None  # no v2 autoscaler has reported to the GCS
    nodes = list(status.active_nodes) + list(status.idle_nodes) + list(status.pending_nodes)
    mapping = {n.node_id or n.instance_id: n.ray_node_type_name for n in nodes}
    if status.pending_launches or status.pending_nodes or not readonly_types(mapping):
        return Autoscaler("autoscaler v2", sorted({t for t in mapping.values() if t}))
    return None


def autoscaler_from_v1_status(raw: bytes | str | None) -> Autoscaler | None:
    """The v1 monitor's status JSON -> an Autoscaler, or None (no status, or read-only)."""
    if not raw:
        return None
    try:
        report = json.loads(raw).get("autoscaler_report") or {}
    except (ValueError, AttributeError):
        return None
    mapping = report.get("node_type_mapping") or {}
    if not mapping:
        return None
    if report.get("pending_launches") or report.get("pending_nodes") or not readonly_types(mapping):
        types = set(mapping.values()) | set(report.get("active_nodes") or {})
        return Autoscaler("autoscaler v1", sorted(types))
    return None


def _autoscaler_v1(status_wait_s: float) -> Autoscaler | None:
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get
    except ImportError:
        return None
    deadline = time.monotonic() + status_wait_s
    while True:
        try:
            raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        except Exception:
            raw = None
        if raw or time.monotonic() >= deadline:
            return autoscaler_from_v1_status(raw)
        time.sleep(1.0)
