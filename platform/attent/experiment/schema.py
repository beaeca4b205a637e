"""The experiment's schema: the typed, validated sections of an experiment file (``task``, ``train``,
``selection``, ``ray``, ``mlflow``, ``fault``, ``antk``, ``downstream``) and the errors a config that
cannot run raises. Reading the files is ``attent.experiment.files``.

Unknown keys, wrong types and impossible values are refused with a message naming the key and
what to change; missing data files are refused by ``check_experiment`` before Ray starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..selection.config import SelectionConfig, check_streamable
from ..selection.plan import Plan, build_plan
from ..tasks.registry import config_classes
from ..tasks.vision.files import IMAGE_SUFFIXES
from .uris import resolve_tracking_uri

# The `task:` section: one of the registered tasks' configs, chosen by its `name`.
# Union over the registered tasks' config classes (a tuple), which no `|` spelling can build
TaskConfig = Annotated[Union[config_classes()], Field(discriminator="name")]  # noqa: UP007


class ConfigError(ValueError):
    """A config that cannot run, with a message saying what to change."""


class PreflightError(ValueError):
    """A run that cannot succeed here (the tracking store, the resources), refused before any
    worker or MLflow run exists, with a message naming the fix (``engine.preflight``)."""


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    epochs: int = Field(..., ge=1)  # passes over the (selected) data
    batch_size: int = Field(64, ge=1)  # per worker, per micro-step
    global_batch_size: int | None = Field(None, ge=1)  # reached by gradient accumulation across workers
    lr: float | None = Field(None, gt=0)  # None: the task's default (or from base_lr)
    # MAE's convention: lr = base_lr x global batch / 256 (the global batch: global_batch_size, else
    # batch_size x workers); give lr or base_lr, not both
    base_lr: float | None = Field(None, gt=0)
    min_lr: float = Field(0.0, ge=0)  # the floor the cosine or linear schedule decays to
    weight_decay: float | None = Field(None, ge=0)  # None: the task's default (not on norms, biases, embeddings)
    betas: tuple[float, float] | None = None  # AdamW betas; None: the task's default
    schedule: Literal["cosine", "linear", "constant"] | None = None  # over epochs of progress
    warmup_ratio: float | None = Field(None, ge=0, lt=1)  # fraction of training progress
    grad_clip: float | None = Field(1.0, gt=0)  # max global grad norm; None: no clipping
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16 autocast (GPU)
    scoring_batch_size: int | None = Field(None, ge=1)  # re-scoring pass; None: 2 x batch_size (4 x on GPU)
    scoring_precision: Literal["fp32", "bf16"] | None = None  # re-scoring pass; None: `precision`
    eval_every: int = Field(1, ge=1)  # evaluate every n epochs (and at the end)
    # DataLoader worker processes per Ray worker; None: on a GPU the worker's CPUs but one
    # (ray.cpus_per_worker - 1), on the CPU none (they would compete with training for its cores)
    loader_workers: int | None = Field(None, ge=0)
    # start the model from these weights: a logged model (models:/<model_id>, models:/<name>/<version>,
    # runs:/<run_id>/model) or a Ray checkpoint folder of a run of the same task and shape; None: fresh
    init_weights: str | None = None
    compile: bool = False  # torch.compile the model (changes kernels, so numerics: opt-in)
    fused_optimizer: bool | None = None  # fused AdamW; None: on CUDA
    tf32: bool = False  # TF32 matmuls for fp32 on GPUs that have them (changes numerics: opt-in)

    @model_validator(mode="after")
    def _one_learning_rate(self) -> TrainConfig:
        if self.lr is not None and self.base_lr is not None:
            raise ValueError("train: set lr (absolute) or base_lr (per 256 samples of the global batch), not both")
        return self

    def evaluation_epochs(self) -> list[int]:
        """The epochs (from 0) after which a run evaluates: every ``eval_every``-th, and the last."""
        every = list(range(self.eval_every - 1, self.epochs, self.eval_every))
        return every if every and every[-1] == self.epochs - 1 else [*every, self.epochs - 1]


class RayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    address: str | None = None  # None: $RAY_ADDRESS, else a local Ray started on demand
    # Ray Train workers (DDP ranks); 0: Ray Train's local mode (this process); [min, max]: elastic
    # training (Ray Train V2): it starts once min are up, goes on with fewer when one is lost (a
    # restart counted against max_failures) and grows back to max when capacity returns
    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False  # one GPU per worker
    cpus_per_worker: float = Field(1, gt=0)
    resources_per_worker: dict[str, float] | None = None  # extra custom resources
    storage_path: str = "ray_results"  # checkpoints; a run resumes from <storage_path>/<name>
    max_failures: int = Field(1, ge=-1)  # worker-group restarts from the latest checkpoint
    checkpoints_to_keep: int = Field(2, ge=1)
    # epochs between checkpoints (the last epoch always saves); None: at the first epoch end
    # checkpoint_minutes after the last checkpoint (or the start): a long run saves every few
    # minutes, not after each of its 800 epochs, a short one at its end
    checkpoint_every: int | None = Field(None, ge=1)
    checkpoint_minutes: float = Field(10.0, gt=0)
    # how Ray places the workers: PACK fills a node first; SPREAD/STRICT_SPREAD put them on different nodes
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"

    @field_validator("num_workers")
    @classmethod
    def _workers(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"ray.num_workers must be >= 0, got {value}")
        if isinstance(value, tuple) and not 1 <= value[0] <= value[1]:
            raise ValueError(f"ray.num_workers [min, max] needs 1 <= min <= max, got {list(value)}")
        return value

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, tuple)

    @property
    def max_workers(self) -> int:
        """The most workers the run trains on (0: local mode); what resources are sized for."""
        return self.num_workers[1] if self.elastic else self.num_workers

    @property
    def min_workers(self) -> int:
        """The fewest workers it starts or goes on with."""
        return self.num_workers[0] if self.elastic else self.num_workers


# the files a stream of each format reads (read_images', read_json's, read_parquet's)
STREAM_SUFFIXES = {
    "image_folder": tuple(suffix.lstrip(".") for suffix in IMAGE_SUFFIXES),  # those the image folders read
    "jsonl": ("jsonl", "json"),
    "parquet": ("parquet",),
}


def json_records(path: Path) -> int:
    """The rows Ray Data's ``read_json`` makes of a file: a JSON array's items (read whole, as
    Ray Data falls back to), else its lines holding anything (JSON lines)."""
    with path.open(encoding="utf-8") as text:
        first = next((char for line in text for char in line if not char.isspace()), "")
        text.seek(0)
        return len(json.load(text)) if first == "[" else sum(1 for line in text if line.strip())


class StreamConfig(BaseModel):
    """The ``stream:`` section: the training set read as a stream, selected pool by pool
    (``attent.selection.stream``) instead of scored whole and indexed: a Ray Data dataset, or the
    task's own training set read in a seeded order (the same samples as the indexed run's)."""

    model_config = ConfigDict(extra="forbid")
    # image_folder: Ray Data's read_images of ``path``, labels from class subfolders; jsonl, parquet:
    # read_json, read_parquet, a record a row; task: the task's own training set, each pass in an
    # order drawn by the run's seed and the pass
    format: Literal["image_folder", "jsonl", "parquet", "task"] = "image_folder"
    path: str | None = Field(None, min_length=1)  # the files or folder Ray Data reads (a local path, s3://, gs://)
    # the files read in an order drawn by the run's seed (a folder lists one class after another); false: as listed
    shuffle_files: bool = True

    @model_validator(mode="after")
    def _path_is_the_formats(self) -> StreamConfig:
        if (self.path is None) != (self.format == "task"):
            raise ValueError(
                "stream.format task reads the task's own training set: drop stream.path"
                if self.path
                else f"stream.format {self.format} reads files: give stream.path"
            )
        return self

    @property
    def ray_data(self) -> bool:
        """Whether Ray Data reads the stream (Ray Train's shards), not the task."""
        return self.format != "task"

    def local_files(self) -> list[Path] | None:
        """The files of the format under a local ``path``, sorted (None: not a local path here)."""
        if self.path is None or "://" in self.path or not Path(self.path).expanduser().exists():
            return None
        path = Path(self.path).expanduser()
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        return [file for file in files if file.suffix.lower().lstrip(".") in STREAM_SUFFIXES[self.format]]

    def local_rows(self) -> int | None:
        """The rows of a pass where ``path`` is local: its images, JSON records or Parquet rows."""
        files = self.local_files()
        if files is None or self.format == "image_folder":
            return None if files is None else len(files)
        if self.format == "jsonl":
            return sum(json_records(file) for file in files)
        import pyarrow.parquet as pq  # Ray Data's dependency: only where a Parquet stream is counted

        return sum(pq.ParquetFile(file).metadata.num_rows for file in files)


class MLflowConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here
    experiment: str = "attent"  # MLflow experiment name
    log_selected_indices: bool = True  # selection history artifact keeps the chosen indices
    registered_model: str | None = None  # register each run's logged model as a new version of this name


class FaultConfig(BaseModel):
    """Deliberate failure injection, to exercise restarts (tests, chaos drills)."""

    model_config = ConfigDict(extra="forbid")
    fail_once_after_epoch: int | None = Field(None, ge=0)  # a worker dies once after this epoch's checkpoint
    fail_rank: int = Field(0, ge=0)


class AntkConfig(BaseModel):
    """Empirical ANTK tracking: the kernel K_ij = <grad f(x_i), grad f(x_j)> over the trainable
    parameters on a fixed probe set, at chosen epochs, on rank 0, timed apart from training
    (``attent/engine/antk.py``; f is the task's ``kernel_output``). Changes nothing trained."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False  # compute kernels at the chosen epochs
    probe_size: int = Field(10, ge=2)  # training samples in the probe set (fixed for the run)
    every: int = Field(1, ge=1)  # epochs between kernels (the first and last epoch always)
    heatmap_epochs: list[int] | None = (
        None  # epochs (1-based, as the log counts) drawn as heatmaps; None: first, middle, last
    )
    sample_chunk: int = Field(4, ge=1)  # probe samples per vmap call: bounds activation memory
    param_chunk: int = Field(4_000_000, ge=1)  # parameters per Jacobian block: memory ~ probe x block, not probe x all
    seed: int = 0  # picks the probe samples (the same for every run seed)


class DownstreamJob(BaseModel):
    """A job run on the pretraining run's exported weights once it finishes: its own Ray Train
    run and MLflow run, linked to the pretraining run, which receives its final metrics as
    ``downstream.<name>.<metric>``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[A-Za-z0-9_\-]+$")  # e.g. classification; names its run and metrics
    task: dict[str, Any] = {}  # the downstream task's fields on top of what the pretraining passes on
    train: TrainConfig  # the job's own epochs, lr, batch size, ...
    # the job's Ray Train workers (None: the pretraining's; 0: Ray Train's local mode, in the driver's process)
    num_workers: int | None = Field(None, ge=0)


class ExperimentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")  # run name; same name = resume
    seed: int = 0
    task: TaskConfig
    train: TrainConfig
    selection: SelectionConfig = SelectionConfig(method="full")
    stream: StreamConfig | None = None  # the training set as a Ray Data stream; None: the task's own, indexed
    ray: RayConfig = RayConfig()
    mlflow: MLflowConfig = MLflowConfig()
    fault: FaultConfig = FaultConfig()
    antk: AntkConfig = AntkConfig()  # empirical-kernel tracking on a probe set (no effect on training)
    downstream: list[DownstreamJob] = []  # jobs run on the trained weights afterwards (pretraining tasks)

    @model_validator(mode="after")
    def _plan_runs(self) -> ExperimentConfig:
        build_plan(self.selection, self.train.epochs)  # an impossible plan is refused here, before any worker starts
        return self

    @property
    def plan(self) -> Plan:
        """The run's selection plan: every epoch's share of the data, re-selection and scoring pass."""
        return build_plan(self.selection, self.train.epochs)

    @model_validator(mode="after")
    def _stream_readable(self) -> ExperimentConfig:
        if self.stream is None:
            return self
        if self.stream.ray_data and self.stream.format not in self.task.stream_formats:
            readable = ", ".join(self.task.stream_formats) or "none"
            raise ValueError(
                f"task {self.task.name} reads no {self.stream.format} stream (it reads: {readable}): drop stream: "
                "to train on the task's own data"
            )
        check_streamable(self.selection)
        if self.antk.enabled:
            raise ValueError("antk tracks a probe of the indexed training set: drop antk.enabled under stream:")
        return self

    @model_validator(mode="after")
    def _fault_rank_exists(self) -> ExperimentConfig:
        if self.fault.fail_rank >= max(1, self.ray.min_workers):  # local mode: one rank, 0
            raise ValueError(f"fault.fail_rank={self.fault.fail_rank} but ray.num_workers={self.ray.num_workers}")
        return self

    @model_validator(mode="after")
    def _elastic_keeps_the_global_batch(self) -> ExperimentConfig:
        if self.ray.elastic and self.train.global_batch_size is None:
            raise ValueError(
                f"ray.num_workers {list(self.ray.num_workers)} trains on a changing number of workers: set "
                "train.global_batch_size, which gradient accumulation keeps whatever their number"
            )
        train, ray = self.train, self.ray
        if train.global_batch_size is None:
            return self
        widest = train.batch_size * max(1, ray.max_workers)
        if train.global_batch_size < widest:
            raise ValueError(
                f"train.global_batch_size={train.global_batch_size} is less than one step of train.batch_size="
                f"{train.batch_size} on {max(1, ray.max_workers)} worker(s) ({widest}): lower train.batch_size to "
                f"{max(1, train.global_batch_size // max(1, ray.max_workers))} or raise the global batch"
            )
        # a fixed world size must reach it exactly; an elastic one rounds the accumulation up at
        # the sizes that do not divide it (the run logs its ranks and accumulation at each start)
        if not ray.elastic and train.global_batch_size % widest:
            raise ValueError(
                f"train.global_batch_size={train.global_batch_size} is not a multiple of train.batch_size="
                f"{train.batch_size} x {max(1, ray.max_workers)} worker(s) = {widest}: gradient accumulation "
                "cannot reach it; choose a batch size that divides it"
            )
        return self

    @model_validator(mode="after")
    def _antk_heatmap_epochs_exist(self) -> ExperimentConfig:
        wrong = [e for e in self.antk.heatmap_epochs or [] if not 1 <= e <= self.train.epochs]
        if wrong:
            raise ValueError(f"antk.heatmap_epochs {wrong} outside the run's epochs 1..{self.train.epochs}")
        return self

    @model_validator(mode="after")
    def _downstream_jobs_build(self) -> ExperimentConfig:
        names = [job.name for job in self.downstream]
        if len(set(names)) != len(names):
            raise ValueError(f"downstream job names must be distinct, got {names}")
        for job in self.downstream:
            try:
                self.downstream_experiment(job, pretrained=None)
            except ValidationError as exc:
                raise ValueError(format_validation_error(exc, f"downstream job {job.name!r}")) from None
        return self

    def downstream_experiment(self, job: DownstreamJob, pretrained: str | None) -> ExperimentConfig:
        """The experiment a downstream job runs: the task's downstream section, the job's
        training, all data, the same seed, cluster and MLflow experiment."""
        return ExperimentConfig.model_validate(
            {
                "name": f"{self.name}-{job.name}",
                "seed": self.seed,
                "task": self.task.downstream_task(job.task, pretrained=pretrained),
                "train": job.train.model_dump(),
                "selection": {"method": "full"},
                # the registered name holds the pretraining's models, not its downstream jobs'
                "ray": self.ray.model_dump() | ({} if job.num_workers is None else {"num_workers": job.num_workers}),
                "mlflow": self.mlflow.model_dump(exclude={"registered_model"}),
            }
        )

    def resolved(self, base: Path | None = None) -> ExperimentConfig:
        """Paths made absolute and defaults filled from the environment, so Ray workers (other
        processes, other working directories) see the same storage and MLflow store."""
        base = Path(base or os.getcwd())
        tracking = resolve_tracking_uri(self.mlflow.tracking_uri, base)
        storage = self.ray.storage_path
        if "://" not in storage:
            storage = str((base / storage).resolve())
        stream = self.stream
        if stream and stream.path and "://" not in stream.path:
            stream = stream.model_copy(update={"path": str((base / Path(stream.path).expanduser()).resolve())})
        init = self.train.init_weights
        if init and ":/" not in init:  # a local checkpoint folder, not an MLflow URI
            init = str((base / Path(init).expanduser()).resolve())
        return self.model_copy(
            update={
                "train": self.train.model_copy(update={"init_weights": init}),
                "task": self.task.with_absolute_paths(base),
                "stream": stream,
                "mlflow": self.mlflow.model_copy(update={"tracking_uri": tracking}),
                "ray": self.ray.model_copy(update={"storage_path": storage}),
            }
        )


def build_experiment(data: dict[str, Any], source: str = "config") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: {exc.error_count()} problem(s):"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling, or remove it)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"  - {loc or '<top level>'}: {msg}" + _got(err))
    return "\n".join(lines)


def _got(err: dict) -> str:
    if err["type"] in ("missing", "extra_forbidden") or isinstance(err.get("input"), dict):
        return ""
    return f" (got {err.get('input')!r})"
