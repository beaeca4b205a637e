"""What every task's ``task:`` config section has in common (pydantic only: the CLI validates
configs without importing torch, Ray or any task's libraries)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class StandIn:
    """The size a rehearsal runs at: a few batches of each stage, on a model of the file's
    architecture family that any CPU trains in seconds. One source for every task's
    ``rehearsal_fields`` and the rehearsal's training settings."""

    train_samples: int = 32  # training samples (each task's train_limit)
    test_samples: int = 16  # test / validation samples each evaluation reads
    width: int = 64  # token width of a transformer (embed_dim, hidden_size)
    depth: int = 2  # transformer blocks
    heads: int = 2  # attention heads
    channels: int = 8  # per-pixel channels: a dense head's hidden width, a semseg class embedding
    tokens: int = 128  # longest token sequence of a language task
    new_tokens: int = 8  # greedy-decoded tokens per generated answer


STAND_IN = StandIn()


def at_most(value: int | None, limit: int) -> int:
    """``value`` capped at ``limit`` (None, which means all, becomes ``limit``)."""
    return limit if value is None else min(value, limit)


class DataError(ValueError):
    """A data file that cannot be read. Deterministic: reading it again fails again, so the
    engine records it and does not restart the workers for it. The message names the file."""


def unreadable(path: Path | str, what: str, cause: BaseException) -> DataError:
    """The error for a file that does not decode, naming it and the fix."""
    return DataError(
        f"{path}: cannot read this {what} ({type(cause).__name__}: {cause}). Fix: replace or "
        "delete the file; `attent validate <experiment> --decode` lists every unreadable one"
    )


def is_relative_path(value: object) -> bool:
    """A local path that is not absolute yet (URLs and non-strings are not)."""
    return isinstance(value, str) and "://" not in value and not Path(value).expanduser().is_absolute()


class TaskConfig(BaseModel):
    """Base of each task's config. A subclass declares ``name: Literal["<task>"]`` (the
    discriminator), its own fields, the fields holding local paths, and its data checks."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    name: str
    # The training set's size (after its limits) where the data is not on this machine: what
    # `attent plan` prices the run's work by. A run that reads another size says so in its log.
    expected_train_samples: int | None = Field(None, ge=1)
    # Fields holding local paths: made absolute against the submitting directory, so Ray workers
    # (other processes, other working directories) read the same files.
    path_fields: ClassVar[tuple[str, ...]] = ()
    # The Ray Data stream formats (``stream.format``) the task's ``stream_item`` reads as training items
    stream_formats: ClassVar[tuple[str, ...]] = ()

    def check_data(self) -> None:
        """Raise FileNotFoundError / ValueError, naming the fix, when the data cannot be read.
        Runs on the driver before Ray starts; keep it fast and light on imports."""

    def stream_read_options(self) -> dict[str, Any]:
        """Keyword arguments of Ray Data's reader of this task's stream (``stream:``)."""
        return {}

    def data_files(self) -> list[tuple[Path, str]]:
        """(path, what it holds) of every data file a run decodes, for ``attent validate --decode``
        to open each (empty: nothing stored as files, e.g. a packed or hub data set)."""
        return []

    def with_absolute_paths(self, base: Path) -> TaskConfig:
        local = {
            key: str((base / value).resolve())
            for key in self.path_fields
            if is_relative_path(value := getattr(self, key, None))
        }
        return self.model_copy(update=local)

    def rehearsal_fields(self) -> dict[str, Any]:
        """The ``task:`` fields a rehearsal (``attent rehearse``) sets on top of this section: the same
        data sources, loaders and architecture family at a stand-in size (``STAND_IN``). A task
        without a size to shrink returns none.

        Returns:
            key -> value, merged into the section as a ``key.path=value`` override would be.
        """
        return {}

    def downstream_task(self, job: dict[str, Any], *, pretrained: str | None) -> dict[str, Any]:
        """The ``task:`` section of a downstream job run on this task's exported weights
        (``pretrained``: where they are; None while only validating): a pretraining task passes
        on its data and architecture, the job's own fields go on top."""
        raise ValueError(f"task {self.name!r} has no downstream jobs: drop the downstream section")
