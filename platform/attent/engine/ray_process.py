"""The set-up hook of every Ray worker process of a local Ray that a driver started
(``runtime_env.worker_process_setup_hook``). Ray imports this module in each of them — Train's
controller and helper actors as well as the training workers — so it imports nothing but Ray:
the engine's modules (torch, MLflow) there cost every such process seconds of CPU per run."""

from __future__ import annotations

import os

import ray


def own_cluster() -> None:
    """$RAY_ADDRESS is this job's cluster: a local Ray's processes find "their" cluster through
    the state API, which looks for every Ray on the machine and fails when two local runs
    coexist (Train's placement-group cleaner printed "Found multiple active Ray instances")."""
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
