"""The set-up hook of every Ray worker process of a driver's job (``runtime_env.worker_process_setup_hook``).
Ray imports this module in each of them — Train's controller and helper actors, Tune's trials, the
training workers — so it imports nothing but Ray: the engine's modules (torch, MLflow) there cost
every such process seconds of CPU per run."""

from __future__ import annotations

import os
import secrets

import ray


def own_cluster() -> None:
    """$RAY_ADDRESS is this job's cluster: a local Ray's processes find "their" cluster through
    the state API, which looks for every Ray on the machine and fails when two local runs
    coexist (Train's placement-group cleaner printed "Found multiple active Ray instances")."""
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


class WorkerSetup:
    """The hook as a callable, when the workers need the driver's MLflow credentials: Ray pickles it
    into its control store (GCS) for this job alone and drops it when the job ends. Not the
    runtime env's ``env_vars``: Ray's runtime-env agent writes those, values and all, into
    ``runtime_env_agent.log`` on every node. The nonce keeps the hook's key in that log (a hash of
    the pickled hook) from being a hash of the password alone."""

    __name__ = "attent_worker_setup"  # what Ray shows as the runtime env's hook

    def __init__(self, env: dict[str, str], local: bool):
        self.env, self.local, self.nonce = dict(env), local, secrets.token_hex(16)

    def __call__(self) -> None:
        if self.local:
            own_cluster()
        os.environ.update(self.env)

    def __repr__(self) -> str:  # the values stay out of any message that shows the hook
        return f"{self.__name__}({', '.join(sorted(self.env))})"


def setup_hook(env: dict[str, str], local: bool) -> WorkerSetup | str | None:
    """The job's worker set-up hook: the MLflow client's settings ``env`` for every worker, and
    for a local Ray its own cluster's address (alone: by module path, nothing pickled); None
    when there is nothing to set up."""
    if env:
        return WorkerSetup(env, local)
    return f"{__name__}.{own_cluster.__name__}" if local else None
