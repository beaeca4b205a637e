"""Preflight of compute resources. Before a local Ray is started: the workers fit this machine.
Once connected to a cluster: the workers fit its nodes; if not, an autoscaler that can add nodes
makes it a visible wait, anything else a refusal."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ...config import PreflightError

# Set to wait for nodes that will join a cluster without an autoscaler (someone runs `ray start`).
WAIT_ENV = "ATTENT_WAIT_FOR_RESOURCES"
# The v1 autoscaler's monitor writes its status every few seconds; a cluster this young may not
# have one yet.
AUTOSCALER_STATUS_WAIT_S = 10.0
_EPS = 1e-9


def worker_bundle(cfg) -> dict[str, float]:
    """What one Train worker asks Ray for (the ScalingConfig engine.driver builds)."""
    bundle = {"CPU": cfg.ray.cpus_per_worker, **(cfg.ray.resources_per_worker or {})}
    if cfg.ray.use_gpu:
        bundle["GPU"] = 1
    return {k: float(v) for k, v in bundle.items() if v}


def fit_count(bundle: dict[str, float], resources: dict[str, float]) -> float:
    """How many ``bundle`` fit in one node's ``resources`` (math.inf for an empty bundle)."""
    count = math.inf
    for name, amount in bundle.items():
        count = min(count, math.floor(resources.get(name, 0.0) / amount + _EPS))
    return count


def _shapes(cfgs: Iterable) -> list[tuple[int, dict[str, float], str]]:
    """(num_workers, bundle, placement strategy) of each distinct trial shape, largest request first."""
    seen: dict[tuple, tuple[int, dict[str, float], str]] = {}
    for cfg in cfgs:
        # local mode (0 workers): the one rank runs in the trial's process, which asks for the bundle
        n, bundle, strategy = max(1, cfg.ray.num_workers), worker_bundle(cfg), cfg.ray.placement_strategy
        seen.setdefault((n, tuple(sorted(bundle.items())), strategy), (n, bundle, strategy))
    return sorted(seen.values(), key=lambda s: -s[0] * sum(s[1].values()))


def room(n: int, bundle: dict[str, float], nodes: list[dict[str, float]], strategy: str) -> float:
    """How many of n workers the nodes can host under Ray's placement strategy: STRICT_SPREAD
    puts at most one on a node, STRICT_PACK all on one node."""
    per_node = [min(fit_count(bundle, node), n) for node in nodes]
    if strategy == "STRICT_SPREAD":
        return sum(min(count, 1) for count in per_node)
    if strategy == "STRICT_PACK":
        return max(per_node, default=0)
    return sum(per_node)


def _fmt(resources: dict[str, float]) -> str:
    def num(v: float) -> str:
        return f"{v:g}" if v < 1e6 else f"{v / 1024 ** 3:.1f} GiB"
    return ", ".join(f"{num(v)} {k}" for k, v in resources.items()) or "nothing"


def _total(n: int, bundle: dict[str, float]) -> dict[str, float]:
    return {k: n * v for k, v in bundle.items()}


def will_start_local_ray(cfg) -> bool:
    """True when engine.driver.ensure_ray would start a fresh local Ray: none is connected, no
    ray.address / $RAY_ADDRESS, and no cluster recorded by `ray start` for ray.init to join."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return False
    address = cfg.ray.address
    if address == "local":
        return True
    if address or os.environ.get("RAY_ADDRESS"):
        return False
    try:
        from ray._private.utils import read_ray_address
        return not read_ray_address()
    except Exception:
        return True


def local_resources() -> dict[str, float]:
    """CPUs and GPUs a local Ray would get on this machine (cgroup limits and
    CUDA_VISIBLE_DEVICES respected, as Ray does); no CUDA context is created."""
    try:
        from ray._private.utils import get_num_cpus
        cpus = float(get_num_cpus())
    except Exception:
        cpus = float(os.cpu_count() or 1)
    gpus = 0
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource
        manager = get_accelerator_manager_for_resource("GPU")
        gpus = manager.get_current_node_num_accelerators()
        visible = manager.get_current_process_visible_accelerator_ids()
        if visible is not None:
            gpus = min(gpus, len(visible))
    except Exception:
        gpus = 0
    return {"CPU": cpus, "GPU": float(gpus)}


# Resources every local Ray has, sized from this machine's memory: not checked here.
_LOCAL_ANYWAY = ("memory", "object_store_memory")


RAY_PROBE_TIMEOUT_S = 5.0  # ray.init retries an unreachable address for ~14 minutes


def check_ray_address(*cfgs, timeout: float = RAY_PROBE_TIMEOUT_S) -> None:
    """Refuse a ray.address / $RAY_ADDRESS that no process answers (``probe_ray_address``)."""
    for address in dict.fromkeys(c.ray.address or os.environ.get("RAY_ADDRESS") for c in cfgs):
        probe_ray_address(address, timeout)


def probe_ray_address(address: str | None, timeout: float = RAY_PROBE_TIMEOUT_S) -> None:
    """A PreflightError, naming the fix, unless a process answers ``address`` (host:port, or
    ray://host:port) within ``timeout`` seconds: one line, instead of Ray's warnings for minutes.
    None, "auto" and "local" are not probed."""
    import socket
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise PreflightError(f"ray.address {address!r} is not host:port (or ray://host:port); fix ray.address "
                             "or $RAY_ADDRESS, or unset both to start a local Ray")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        why = "connection refused" if isinstance(exc, ConnectionRefusedError) else \
            f"no answer within {timeout:g}s" if isinstance(exc, TimeoutError) else str(exc.strerror or exc)
        raise PreflightError(
            f"the Ray cluster at {address} is unreachable ({why}); nothing was run or recorded. Fix: start it "
            f"(`ray start --head --port {port}` on {host}), point ray.address or $RAY_ADDRESS at a running "
            "cluster's GCS address, or unset both to start a local Ray") from None


def check_local_resources(*cfgs) -> None:
    """Before Ray starts: refuse workers that a local Ray on this machine can never host.
    Does nothing when the run will join a cluster (checked after connecting instead)."""
    cfgs = [c for c in cfgs if will_start_local_ray(c)]
    if not cfgs:
        return
    have = local_resources()
    for n, bundle, strategy in _shapes(cfgs):
        if strategy == "STRICT_SPREAD" and n > 1:
            raise PreflightError(
                f"ray.placement_strategy=STRICT_SPREAD puts each of the ray.num_workers={n} workers on its own "
                "node, but the local Ray this run would start (no ray.address or $RAY_ADDRESS is set) is one "
                "node; use SPREAD or PACK, or point ray.address at a Ray cluster with that many nodes")
        bundle = {k: v for k, v in bundle.items() if k not in _LOCAL_ANYWAY}
        fits = fit_count(bundle, have)
        if fits >= n:
            continue
        raise PreflightError(_local_refusal(n, bundle, have, fits))


def _local_refusal(n: int, bundle: dict[str, float], have: dict[str, float], fits: float) -> str:
    where = ("the local Ray this run would start (no ray.address or $RAY_ADDRESS is set) has "
             f"{_fmt(have)}")
    cluster = "or point ray.address (or $RAY_ADDRESS) at a Ray cluster with enough resources"
    custom = [k for k in bundle if k not in have and k not in _LOCAL_ANYWAY]
    if custom:
        return (f"ray.resources_per_worker asks for {', '.join(map(repr, custom))}, which {where} and "
                f"nothing else; drop it from ray.resources_per_worker, {cluster} (nodes declare custom "
                f"resources with `ray start --resources='{{\"{custom[0]}\": N}}'`)")
    short = min(bundle, key=lambda k: math.floor(have[k] / bundle[k] + _EPS))
    need, got = n * bundle[short], have[short]
    if short == "GPU":
        fix = (f"lower ray.num_workers to {int(fits)}, set ray.use_gpu=false" if fits >= 1
               else "set ray.use_gpu=false")
        return (f"ray.use_gpu with ray.num_workers={n} needs {need:g} GPU(s), one per worker, but {where}; "
                f"{fix}, {cluster}")
    if fits < 1:
        return (f"one worker needs {_fmt(bundle)} (ray.cpus_per_worker={bundle.get('CPU', 0):g}), but {where}; "
                f"lower ray.cpus_per_worker to at most {got:g}, {cluster}")
    return (f"ray.num_workers={n} × ray.cpus_per_worker={bundle['CPU']:g} needs {need:g} CPUs, but {where}, "
            f"room for {int(fits)} worker(s); lower ray.num_workers to at most {int(fits)} (or "
            f"ray.cpus_per_worker to at most {got / n:g}), {cluster}")


def check_cluster_resources(*cfgs, driver: Optional[dict[str, float]] = None, out=None) -> None:
    """After ray.init: refuse workers that the connected cluster can never host, unless an
    autoscaler can add the nodes (then say, visibly, what the run waits for). ``driver``: a
    resource bundle one more process needs besides the workers (a Tune trial's driver)."""
    import ray
    if not ray.is_initialized():
        raise RuntimeError("check_cluster_resources needs a connected Ray (engine.driver.ensure_ray)")
    out = out or sys.stderr
    nodes = [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]
    scaler, looked_up = None, False  # looked up once (it may wait for the monitor's status)
    for n, bundle, strategy in _shapes(cfgs):
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
            raise PreflightError(shortfall.refusal(
                "and no autoscaler that could add nodes (Ray's read-only monitor only mirrors the "
                "nodes started by hand)"))
        limit = scaler.max_workers(bundle)
        if limit is not None and limit < n:
            raise PreflightError(shortfall.refusal(
                f"and its autoscaler ({scaler.source}) can grow it to room for {int(limit)} such worker(s) "
                f"at most ({scaler.describe()})"))
        _announce_wait(shortfall, f"The autoscaler ({scaler.source}; node types {scaler.describe()}) "
                                  f"can add nodes", out)


@dataclass
class Shortfall:
    n: int
    bundle: dict[str, float]
    nodes: list[dict[str, float]]
    fits: int
    driver: Optional[dict[str, float]] = None

    def have(self) -> dict[str, float]:
        return {k: sum(node.get(k, 0.0) for node in self.nodes) for k in self.bundle}

    def what(self) -> str:
        if self.driver is not None:
            return f"the trial driver needs {_fmt(self.driver)} on one node"
        return (f"ray.num_workers={self.n} workers need {_fmt(_total(self.n, self.bundle))} in all "
                f"({_fmt(self.bundle)} each)")

    def cluster(self) -> str:
        import ray
        address = ray.get_runtime_context().gcs_address
        return (f"the Ray cluster at {address} has {_fmt(self.have())} on {len(self.nodes)} node(s), "
                f"room for {self.fits} such worker(s)")

    def fix(self) -> str:
        if self.driver is not None:
            return "add a node with that much memory, or lower the trial's memory reservation"
        if self.fits == 0:
            per = ("ray.cpus_per_worker" if "CPU" in self.bundle else "the per-worker resources")
            return (f"no single node can host one worker: lower {per} (or ray.resources_per_worker / "
                    f"ray.use_gpu) to what one node has, or add bigger nodes")
        return (f"lower ray.num_workers to at most {self.fits} (or the per-worker resources), or add nodes "
                f"to the cluster")

    def refusal(self, scaler: str) -> str:
        return (f"{self.what()}, but {self.cluster()}, {scaler}; nothing was started. Fix: {self.fix()}; "
                f"or, if nodes will join by hand, set {WAIT_ENV}=1 to wait for them")


def _announce_wait(shortfall: Shortfall, why: str, out) -> None:
    print(f"[attent] waiting for resources: {shortfall.what()}; {shortfall.cluster()} now. {why}, so the "
          f"run waits for them: Ray Train retries starting its workers every 60 s until the nodes join "
          f"(its timeout warnings meanwhile are expected). Ctrl-C stops the wait; {shortfall.fix()} to run "
          f"on what is there.", file=out, flush=True)


# --------------------------------------------------------------------------------------------
# Autoscaler detection (Ray 2.60)
# --------------------------------------------------------------------------------------------

@dataclass
class Autoscaler:
    """An autoscaler that can add nodes: where we learnt of it and, when the cluster published
    them, its node groups ((name, resources per node, max nodes; -1 = unbounded))."""
    source: str
    node_types: list[str] = field(default_factory=list)
    groups: Optional[list[tuple[str, dict[str, float], int]]] = None
    max_resources: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        if self.groups:
            return ", ".join(f"{name} ({_fmt(res)}) × {'unbounded' if count < 0 else count}"
                             for name, res, count in self.groups)
        return ", ".join(self.node_types) or "unknown"

    def max_workers(self, bundle: dict[str, float]) -> Optional[int | float]:
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
                total = min(total, math.floor(self.max_resources[name] / amount + _EPS))
        return total


def find_autoscaler(status_wait_s: float = AUTOSCALER_STATUS_WAIT_S) -> Optional[Autoscaler]:
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


def _published_cluster_config() -> Optional[Autoscaler]:
    try:
        from ray._private.state import state
        config = state.get_cluster_config()
    except Exception:
        return None
    if config is None or not config.node_group_configs:
        return None
    groups = [(g.name, {k: float(v) for k, v in g.resources.items()}, int(g.max_count))
              for g in config.node_group_configs]
    return Autoscaler("cluster config in the GCS", [g[0] for g in groups], groups,
                      {k: float(v) for k, v in config.max_resources.items()})


def readonly_types(mapping: dict[str, str]) -> bool:
    """True if every node's type is the read-only provider's ``node_<node id>`` (no autoscaler)."""
    return all(node_type == f"node_{node_id}" or not node_type for node_id, node_type in mapping.items())


def _autoscaler_v2() -> Optional[Autoscaler]:
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


def autoscaler_from_v1_status(raw: bytes | str | None) -> Optional[Autoscaler]:
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


def _autoscaler_v1(status_wait_s: float) -> Optional[Autoscaler]:
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
