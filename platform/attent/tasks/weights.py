"""Saved weights a model starts from (``train.init_weights``, a downstream job's ``pretrained``
encoder), wherever they are:

    models:/<model_id>, models:/<name>/<version>   an MLflow logged model (every finished run logs one)
    runs:/<run_id>/model                           the same, named by its run
    runs:/<run_id>/<path>, mlflow-artifacts:/...   any other MLflow artifact: a folder or file as below
    a local folder or file                         an MLflow model folder, or a Ray checkpoint (state.pt)

A logged model loads through its flavour: PyTorch's (pt2, no pickle) gives back the module and so
its state dict; a transformers model holding a peft adapter gives the adapter's tensors.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attent import contract

MLFLOW_SCHEMES = ("runs:/", "models:/", "mlflow-artifacts:/")
MLMODEL_FILE = "MLmodel"  # what makes a folder an MLflow model
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class SavedWeights:
    state: dict[str, torch.Tensor]  # tensor name -> tensor, as the saved model names them
    metadata: dict[str, Any] = field(default_factory=dict)  # a logged model's metadata (MLmodel file)


def mlflow_pytorch():
    """``mlflow.pytorch``, imported without ``pytorch_lightning``. Where Lightning is installed
    (``attent[lightning]``), MLflow's PyTorch flavour imports it at its own import for an
    autologging checkpoint callback that no run uses: 2.2 s of torchmetrics and scipy in every
    worker that logs or loads a model (measured on 2 cores). The block lasts for this import only;
    a later ``import pytorch_lightning`` works as usual."""
    if "mlflow.pytorch" in sys.modules or "pytorch_lightning" in sys.modules:
        return importlib.import_module("mlflow.pytorch")
    sys.modules["pytorch_lightning"] = None  # an ImportError, which mlflow.pytorch expects and passes
    try:
        return importlib.import_module("mlflow.pytorch")
    finally:
        del sys.modules["pytorch_lightning"]


def is_mlflow_uri(source: str) -> bool:
    return source.startswith(MLFLOW_SCHEMES)


def local_copy(source: str) -> Path:
    """A local path holding ``source``: MLflow URIs are downloaded (from $MLFLOW_TRACKING_URI,
    which the engine sets in its workers), local paths are taken as they are."""
    if is_mlflow_uri(source):
        import mlflow.artifacts

        source = mlflow.artifacts.download_artifacts(
            artifact_uri=source, tracking_uri=os.environ.get("MLFLOW_TRACKING_URI")
        )
    return Path(source).expanduser()


def logged_model_weights(folder: Path) -> SavedWeights | None:
    """The weights of the MLflow model in ``folder``; None when the folder holds no MLflow model."""
    if not (folder / MLMODEL_FILE).is_file():
        return None
    from mlflow.models import Model

    model = Model.load(str(folder))
    metadata = dict(model.metadata or {})
    if "pytorch" in model.flavors:
        module = mlflow_pytorch().load_model(str(folder))
        return SavedWeights({k: v.detach().cpu() for k, v in module.state_dict().items()}, metadata)
    adapter = model.flavors.get("transformers", {}).get("peft_adaptor")
    if adapter:
        from safetensors.torch import load_file

        return SavedWeights(load_file(folder / adapter / PEFT_WEIGHTS_FILE), metadata)
    raise ValueError(
        f"{folder}: an MLflow model with flavours {sorted(model.flavors)}; weights load from a "
        "pytorch model or a transformers model holding a peft adapter"
    )


def load_weights(source: str) -> SavedWeights:
    """The weights at ``source``: a logged model's, or a Ray checkpoint's model (its trainable
    tensors and buffers)."""
    path = local_copy(source)
    logged = logged_model_weights(path) if path.is_dir() else None
    if logged is not None:
        return logged
    checkpoint = path / contract.CHECKPOINT_STATE_FILE if path.is_dir() else path
    if checkpoint.is_file():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if isinstance(saved, dict) and "model" in saved:
            return SavedWeights(saved["model"])
    raise FileNotFoundError(
        f"no weights at {source!r}: give a logged model (models:/<model_id>, "
        f"models:/<name>/<version>, runs:/<run_id>/{contract.MODEL_NAME}) or a Ray "
        f"checkpoint folder ({contract.CHECKPOINT_STATE_FILE})"
    )
