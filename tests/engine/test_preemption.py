"""Preemption's pieces without Ray (the runs: tests/system/test_preemption.py): the SIGTERM flag the
ranks agree on, and the driver's line of a restore from inside an epoch."""

from __future__ import annotations

import os
import signal

import mlflow


def test_sigterm_only_sets_the_flag_the_ranks_agree_on_a_step_later_and_a_second_one_is_the_old_handlers():
    """The handler sets a flag and nothing else; the ranks' agreement (here one rank) reads each step's
    flags after the next step, and at an epoch's end at once; a second SIGTERM reaches the handler ours
    replaced (Ray's: the process exits)."""
    from attent.engine import preemption

    replaced = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: replaced.append(signum))
    try:
        preemption.install_sigterm_flag()
        flag = preemption.StopFlag(distributed=False)
        assert [flag.after_step(), flag.after_step()] == [preemption.GO_ON, preemption.GO_ON]
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.SIGTERM_RECEIVED.is_set() and replaced == []
        assert flag.after_step() == preemption.GO_ON  # the step before the signal's
        assert flag.after_step() == preemption.EXIT
        assert flag.at_epoch_end() == preemption.EXIT
        os.kill(os.getpid(), signal.SIGTERM)
        assert replaced == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
        preemption.SIGTERM_RECEIVED.clear()


def test_the_drivers_line_names_the_step_a_restore_from_inside_an_epoch_goes_on_at(mlflow_uri):
    """A restore between epochs logs its first epoch; one from inside an epoch, in the same call, the
    steps it had: the driver's line pairs them (the console read "from its epoch-3 checkpoint" either way)."""
    from attent.engine.progress import restores

    client = mlflow.MlflowClient(mlflow_uri)
    run_id = client.create_run(client.create_experiment("restores")).info.run_id
    from mlflow.entities import Metric

    client.log_batch(run_id, metrics=[Metric("restored_at_epoch", 2, 1000, 2)])  # as RunLogger.log_metrics: one
    client.log_batch(run_id, metrics=[Metric("restored_at_epoch", 3, 2000, 3), Metric("restored_at_step", 7, 2000, 3)])
    assert restores(client, client.get_run(run_id)) == [(2, None), (3, 7)]
