"""Workloads the engine can train: each is a self-contained package registered in
``attent.tasks.registry``. Nothing heavy is imported here."""
from __future__ import annotations

from .registry import TASKS, build_task, config_classes
from .spec import TaskConfig

__all__ = ["TASKS", "TaskConfig", "build_task", "config_classes"]
