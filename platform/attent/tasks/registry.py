"""The one place tasks are registered. Adding a task: a package under ``attent.tasks`` with a
light config module (pydantic only) and a task module, plus one line here; no engine or config
code changes."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from .config import TaskConfig

if TYPE_CHECKING:
    from .task import Task


@dataclass(frozen=True)
class TaskEntry:
    config: str  # "module:Class" of the task's config (imported to validate any experiment)
    task: str  # "module:Class" of the Task (imported only inside the workers that train it)


TASKS: dict[str, TaskEntry] = {
    "vision": TaskEntry("attent.tasks.vision.config:VisionTaskConfig", "attent.tasks.vision.task:VisionTask"),
    "llm": TaskEntry("attent.tasks.llm.config:LLMTaskConfig", "attent.tasks.llm.task:LLMTask"),
    "mae": TaskEntry("attent.tasks.mae.config:MAETaskConfig", "attent.tasks.mae.task:MaskedPretrainingTask"),
    "multimae": TaskEntry("attent.tasks.mae.config:MultiMAETaskConfig", "attent.tasks.mae.task:MaskedPretrainingTask"),
    "mae_downstream": TaskEntry(
        "attent.tasks.mae.config:DownstreamTaskConfig", "attent.tasks.mae.downstream:DownstreamTask"
    ),
}


def _load(target: str):
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


@cache
def config_classes() -> tuple[type[TaskConfig], ...]:
    classes = tuple(_load(entry.config) for entry in TASKS.values())
    for name, cls in zip(TASKS, classes):
        if cls.model_fields["name"].default != name:
            raise TypeError(f"{cls.__name__}.name must default to {name!r}, its registry key")
    return classes


def task_class(name: str) -> type[Task]:
    """The Task class registered as ``name`` (imports only what that task needs)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; registered: {', '.join(TASKS)}")
    return _load(TASKS[name].task)


def build_task(task_config: TaskConfig, seed: int) -> Task:
    """The Task for a validated ``task:`` section."""
    return task_class(task_config.name)(task_config, seed=seed)
