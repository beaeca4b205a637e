"""Preflight of compute resources before Ray starts: what a worker asks Ray for and how many fit
a node, a Ray address that answers, and workers that fit this machine when a local Ray is about to
start. Once connected to a cluster, ``cluster`` checks its nodes with the same sizing."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable

from ...experiment.schema import PreflightError

FIT_EPS = 1e-9  # float slack in counting how many bundles fit


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
        count = min(count, math.floor(resources.get(name, 0.0) / amount + FIT_EPS))
    return count


def trial_shapes(cfgs: Iterable) -> list[tuple[int, dict[str, float], str]]:
    """(num_workers, bundle, placement strategy) of each distinct trial shape, largest request first."""
    seen: dict[tuple, tuple[int, dict[str, float], str]] = {}
    for cfg in cfgs:
        # local mode (0 workers): the one rank runs in the trial's process, which asks for the bundle
        n, bundle, strategy = max(1, cfg.ray.min_workers), worker_bundle(cfg), cfg.ray.placement_strategy
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


def fmt_resources(resources: dict[str, float]) -> str:
    def num(v: float) -> str:
        return f"{v:g}" if v < 1e6 else f"{v / 1024**3:.1f} GiB"

    return ", ".join(f"{num(v)} {k}" for k, v in resources.items()) or "nothing"


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
        raise PreflightError(
            f"ray.address {address!r} is not host:port (or ray://host:port); fix ray.address "
            "or $RAY_ADDRESS, or unset both to start a local Ray"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        why = (
            "connection refused"
            if isinstance(exc, ConnectionRefusedError)
            else f"no answer within {timeout:g}s"
            if isinstance(exc, TimeoutError)
            else str(exc.strerror or exc)
        )
        raise PreflightError(
            f"the Ray cluster at {address} is unreachable ({why}); nothing was run or recorded. Fix: start it "
            f"(`ray start --head --port {port}` on {host}), point ray.address or $RAY_ADDRESS at a running "
            "cluster's GCS address, or unset both to start a local Ray"
        ) from None


def check_local_resources(*cfgs) -> None:
    """Before Ray starts: refuse workers that a local Ray on this machine can never host.
    Does nothing when the run will join a cluster (checked after connecting instead)."""
    cfgs = [c for c in cfgs if will_start_local_ray(c)]
    if not cfgs:
        return
    have = local_resources()
    for n, bundle, strategy in trial_shapes(cfgs):
        if strategy == "STRICT_SPREAD" and n > 1:
            raise PreflightError(
                f"ray.placement_strategy=STRICT_SPREAD puts each of the ray.num_workers={n} workers on its own "
                "node, but the local Ray this run would start (no ray.address or $RAY_ADDRESS is set) is one "
                "node; use SPREAD or PACK, or point ray.address at a Ray cluster with that many nodes"
            )
        bundle = {k: v for k, v in bundle.items() if k not in _LOCAL_ANYWAY}
        fits = fit_count(bundle, have)
        if fits >= n:
            continue
        raise PreflightError(_local_refusal(n, bundle, have, fits))


def _local_refusal(n: int, bundle: dict[str, float], have: dict[str, float], fits: float) -> str:
    where = f"the local Ray this run would start (no ray.address or $RAY_ADDRESS is set) has {fmt_resources(have)}"
    cluster = "or point ray.address (or $RAY_ADDRESS) at a Ray cluster with enough resources"
    custom = [k for k in bundle if k not in have and k not in _LOCAL_ANYWAY]
    if custom:
        return (
            f"ray.resources_per_worker asks for {', '.join(map(repr, custom))}, which {where} and "
            f"nothing else; drop it from ray.resources_per_worker, {cluster} (nodes declare custom "
            f"resources with `ray start --resources='{{\"{custom[0]}\": N}}'`)"
        )
    short = min(bundle, key=lambda k: math.floor(have[k] / bundle[k] + FIT_EPS))
    need, got = n * bundle[short], have[short]
    if short == "GPU":
        fix = f"lower ray.num_workers to {int(fits)}, set ray.use_gpu=false" if fits >= 1 else "set ray.use_gpu=false"
        return (
            f"ray.use_gpu with ray.num_workers={n} needs {need:g} GPU(s), one per worker, but {where}; {fix}, {cluster}"
        )
    if fits < 1:
        return (
            f"one worker needs {fmt_resources(bundle)} (ray.cpus_per_worker={bundle.get('CPU', 0):g}), but {where}; "
            f"lower ray.cpus_per_worker to at most {got:g}, {cluster}"
        )
    return (
        f"ray.num_workers={n} × ray.cpus_per_worker={bundle['CPU']:g} needs {need:g} CPUs, but {where}, "
        f"room for {int(fits)} worker(s); lower ray.num_workers to at most {int(fits)} (or "
        f"ray.cpus_per_worker to at most {got / n:g}), {cluster}"
    )
