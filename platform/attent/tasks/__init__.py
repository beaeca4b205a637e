"""Workloads the engine can train: one self-contained package per task, registered in
``registry``; ``task.Task`` is the interface they implement, ``config.TaskConfig`` the base of
their ``task:`` config sections."""
