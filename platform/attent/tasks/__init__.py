"""Workloads the engine can train: each is a ``Task`` built from its config section."""
from __future__ import annotations

from .base import Batch, Task


def build_task(task_config, seed: int) -> Task:
    """The Task for a validated ``task:`` config section (imports only what that task needs)."""
    if task_config.name == "vision":
        from .vision import VisionTask
        return VisionTask(task_config, seed=seed)
    if task_config.name == "llm":
        from .llm.task import LLMTask
        return LLMTask(task_config)  # seeded by the engine (torch.manual_seed) before building
    raise ValueError(f"unknown task {task_config.name!r}")


__all__ = ["Batch", "Task", "build_task"]
