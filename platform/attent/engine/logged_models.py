"""A finished run's trained model as an MLflow 3 logged model (rank 0 at the end of the run,
``driver.log_final``), what each task hands over through ``Task.model_to_log``:

* a ``TorchModel`` (ViT classifier, MAE encoder, downstream model): MLflow's PyTorch flavour in its
  pt2 format (``torch.export``), which loads back with torch alone, without pickle or attent's
  code; the task's inputs give its input example and a signature naming each input;
* an ``AdapterModel`` (the LLM's LoRA): the transformers flavour, which stores the peft adapter
  and the tokenizer and references the frozen base model (a local folder, so it works offline,
  or a hub name).

The model is named ``model`` (``runs:/<run_id>/model``), belongs to the run's experiment, carries
the run's params, and MLflow links it to the run and to the run's metrics of the final step.
``mlflow.registered_model`` registers it as a new version of that name. The logging uses
MLflow's fluent API: the process's tracking URI ($MLFLOW_TRACKING_URI in the workers).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from .. import contract
from ..tasks.task import AdapterModel, Task, TorchModel
from ..tasks.weights import mlflow_pytorch

if TYPE_CHECKING:
    import mlflow


def log_trained_model(
    task: Task,
    model: torch.nn.Module,
    *,
    run_id: str,
    step: int,
    registered_model: str | None = None,
    client: mlflow.MlflowClient | None = None,
) -> str | None:
    """Log ``task``'s model of ``model`` as run ``run_id``'s model, linked to its metrics at
    ``step``; its model id, or None when the task logs no model. ``client``: rank 0's, of the
    run's store (else one of the process's tracking URI)."""
    import mlflow

    exported = task.model_to_log(model)
    if exported is None:
        return None
    client = client or mlflow.MlflowClient()
    logged = create_logged_model(client, client.get_run(run_id), task.name)
    # No run_id to the flavour: MLflow's Model.log would link the run's metrics by fetching the
    # history of every metric key, one request each (a minute per run through a remote server with
    # users, measured by `attent rehearse`); link_to_run does it in three.
    options = dict(model_id=logged.model_id, step=step, registered_model_name=registered_model)
    if isinstance(exported, TorchModel):
        log_torch_model(exported, **options)
    elif isinstance(exported, AdapterModel):
        log_adapter(exported, **options)
    else:
        raise TypeError(
            f"{type(task).__name__}.model_to_log returned a {type(exported).__name__}, "
            "not a TorchModel or an AdapterModel"
        )
    link_to_run(client, logged.model_id, run_id, step)
    return logged.model_id


def create_logged_model(client: mlflow.MlflowClient, run, task_name: str):
    """The MLflow logged model of ``run`` (its params, and its source tags: the driver's command,
    user and commit, which the fluent initialize_logged_model would resolve in this Ray worker
    as Ray's worker script and no commit)."""
    from mlflow.utils.mlflow_tags import (
        MLFLOW_GIT_BRANCH,
        MLFLOW_GIT_COMMIT,
        MLFLOW_GIT_REPO_URL,
        MLFLOW_SOURCE_NAME,
        MLFLOW_SOURCE_TYPE,
        MLFLOW_USER,
    )

    kept = (
        MLFLOW_USER,
        MLFLOW_SOURCE_NAME,
        MLFLOW_SOURCE_TYPE,
        MLFLOW_GIT_COMMIT,
        MLFLOW_GIT_BRANCH,
        MLFLOW_GIT_REPO_URL,
    )
    source = {key: value for key, value in run.data.tags.items() if key in kept}
    return client.create_logged_model(
        experiment_id=run.info.experiment_id,
        name=contract.MODEL_NAME,
        source_run_id=run.info.run_id,
        params=run.data.params,
        tags={**source, contract.TAG_TASK: task_name},
    )


def link_to_run(client: mlflow.MlflowClient, model_id: str, run_id: str, step: int) -> None:
    """Model ``model_id`` as an output of run ``run_id`` at ``step``, with the run's metrics whose
    latest value is at ``step`` linked to it, as MLflow's Model.log links them given a run."""
    from mlflow.entities import LoggedModelOutput, Metric

    client.log_outputs(run_id=run_id, models=[LoggedModelOutput(model_id, step=step)])
    latest = client.get_run(run_id).data._metric_objs  # each key's latest value, with its step
    linked = [
        Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id, run_id=run_id)
        for m in latest
        if m.step == step and m.model_id is None
    ]
    if linked:
        client.log_batch(run_id=run_id, metrics=linked)


def log_torch_model(exported: TorchModel, **options):
    """MLflow's PyTorch flavour, pt2 format, of a CPU copy of the module in eval mode (the
    training model keeps its device and mode)."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    module = copy.deepcopy(exported.module).cpu().eval()
    inputs = [tensor.detach().cpu().numpy() for tensor in exported.inputs.values()]
    with torch.no_grad():
        output = module(*(torch.from_numpy(a) for a in inputs)).numpy()
    any_batch = -1  # torch.export keeps the batch dimension dynamic (the example holds two samples)
    # Several inputs are named (the MAE encoder's modalities); a single one stays unnamed, as the
    # pyfunc flavour then takes a plain array (a named one reaches the model as a dict it refuses).
    names = list(exported.inputs) if len(inputs) > 1 else [None]
    signature = ModelSignature(
        inputs=Schema([TensorSpec(a.dtype, (any_batch, *a.shape[1:]), name) for name, a in zip(names, inputs)]),
        outputs=Schema([TensorSpec(output.dtype, (any_batch, *output.shape[1:]))]),
    )
    # validate_serving_input=False: MLflow would load the model back and predict on the example,
    # seconds per run that the tests do once (tests/engine/test_models.py).
    pytorch_flavour = mlflow_pytorch()
    return pytorch_flavour.log_model(
        module,
        serialization_format="pt2",
        signature=signature,
        # one input is stored as the input example (MLflow stores an array, not a tuple of them)
        input_example=inputs[0] if len(inputs) == 1 else tuple(inputs),
        metadata=exported.metadata or None,
        pip_requirements=pytorch_flavour.get_default_pip_requirements(),
        validate_serving_input=False,
        **options,
    )


def log_adapter(exported: AdapterModel, **options):
    """MLflow's transformers flavour of the peft model: adapter and tokenizer stored, the base
    referenced. Its signature is the text-generation default (text in, text out); no input
    example, as MLflow would validate one by loading the base model again and generating."""
    import mlflow.transformers

    return mlflow.transformers.log_model(
        {"model": exported.model, "tokenizer": exported.tokenizer},
        task="text-generation",
        base_model_path=exported.base_model_path,
        pip_requirements=mlflow.transformers.get_default_pip_requirements(exported.model),
        **options,
    )
