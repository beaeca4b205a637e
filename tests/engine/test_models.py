"""The trained model in MLflow: what each task logs (``engine/logged_models.py``: the PyTorch
flavour's pt2 format for the ViT, the MAE encoder and the downstream model, the transformers
flavour for the LLM's LoRA adapter), that the flavour's ``load_model`` gives back the same predictions, and
that a run starts from a logged model (``train.init_weights``, a downstream job's ``pretrained``).

The fast tests log models of in-process recipes into a scratch SQLite store; the slow ones read
the session's reference runs (Ray Train, as ``attent train`` runs them) and train one run from a
logged model."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import torch
from attent import contract
from attent.engine import checkpoint
from attent.engine.logged_models import log_trained_model
from attent.engine.preflight import check_init_weights
from attent.engine.recipe import TrainingRecipe, WorkerContext
from attent.experiment.schema import PreflightError, build_experiment
from attent.tasks import weights
from attent.tasks.mae import scenes
from attent.tasks.mae.task import LoggedEncoder
from mlflow import MlflowClient
from mlflow.entities import LoggedModelStatus

from tests.helpers.llm_tiny import EXAMPLES, make_task, save_tiny_llama, tiny_tokenizer
from tests.helpers.paths import SHARED

DIGITS_TASK = {
    "name": "vision",
    "dataset": "digits",
    "img_size": 8,
    "model": {"preset": "vit_tiny_cpu", "patch_size": 2},
}


@pytest.fixture
def store(tmp_path, monkeypatch) -> MlflowClient:
    """A scratch tracking store, the process's tracking URI (as the engine sets it in its workers)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    client.create_experiment("models", artifact_location=(tmp_path / "mlartifacts").as_uri())
    return client


def new_run(client: MlflowClient) -> str:
    run = client.create_run(client.get_experiment_by_name("models").experiment_id)
    client.log_param(run.info.run_id, "seed", "0")
    return run.info.run_id


def recipe(task: dict, seed: int = 0, **train) -> TrainingRecipe:
    r = TrainingRecipe(
        build_experiment({"name": "m", "seed": seed, "task": task, "train": {"epochs": 1, "batch_size": 16, **train}}),
        WorkerContext(),
    )
    r.setup()
    return r


def specs(schema) -> list[tuple[str | None, str, tuple[int, ...]]]:
    """A signature's tensors as (name, dtype, shape)."""
    return [(spec.name, str(spec.type), tuple(spec.shape)) for spec in schema.inputs]


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- fast: logged in-process ---------------------------------------------------------------------


def test_a_vit_is_logged_linked_to_its_run_and_loads_back_with_the_same_predictions(store):
    run_id = new_run(store)
    store.log_metric(run_id, "eval_test_accuracy", 0.5, step=1)  # the final step's metric
    store.log_metric(run_id, "train_loss", 2.0, step=0)  # an earlier epoch's
    store.set_tag(run_id, "mlflow.source.name", "attent train experiments/digits_vit.yaml")  # the driver's
    trained = recipe(DIGITS_TASK)
    trained.run_epoch(0)
    trained.raw_model.train()
    model_id = log_trained_model(trained.task, trained.raw_model, run_id=run_id, step=1)

    logged = store.get_logged_model(model_id)
    assert (logged.name, logged.status, logged.source_run_id) == ("model", LoggedModelStatus.READY, run_id)
    assert logged.params["seed"] == "0" and logged.tags[contract.TAG_TASK] == "vision"
    assert (
        logged.tags["mlflow.source.name"] == "attent train experiments/digits_vit.yaml"
    )  # the run's, not this process's
    assert [(m.key, m.value) for m in logged.metrics] == [("eval_test_accuracy", 0.5)]
    assert [o.model_id for o in store.get_run(run_id).outputs.model_outputs] == [model_id]
    info = mlflow.models.get_model_info(f"models:/{model_id}")
    assert specs(info.signature.inputs) == [(None, "float32", (-1, 1, 8, 8))]  # images, any batch
    assert specs(info.signature.outputs) == [(None, "float32", (-1, 10))]  # logits
    assert info.saved_input_example_info["type"] == "ndarray"
    assert trained.raw_model.training  # the model keeps its mode: a copy in eval mode is exported

    images = torch.stack([trained.task.splits.test[i]["image"] for i in range(5)])  # another batch size
    with torch.no_grad():
        expected = trained.raw_model.eval()(images)
        torch.testing.assert_close(mlflow.pytorch.load_model(f"models:/{model_id}")(images), expected)
    served = mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(images.numpy())  # the run's name for it
    torch.testing.assert_close(torch.from_numpy(served), expected)


def test_a_run_starts_from_a_logged_model_or_a_checkpoint(store, tmp_path):
    trained = recipe(DIGITS_TASK)
    trained.run_epoch(0)
    model_id = log_trained_model(trained.task, trained.raw_model, run_id=new_run(store), step=1)
    saved = trained.raw_model.state_dict()
    fresh = recipe(DIGITS_TASK, seed=1)
    assert not same_tensors(fresh.raw_model.state_dict(), saved)  # another seed, other weights
    assert same_tensors(recipe(DIGITS_TASK, seed=1, init_weights=f"models:/{model_id}").raw_model.state_dict(), saved)
    ray_checkpoint = checkpoint.save({"model": checkpoint.trainable_state(trained.raw_model)})
    started = recipe(DIGITS_TASK, seed=1, init_weights=ray_checkpoint.name)
    assert same_tensors(started.raw_model.state_dict(), saved)
    ray_checkpoint.cleanup()
    wider = {**DIGITS_TASK, "model": {**DIGITS_TASK["model"], "embed_dim": 32}}
    with pytest.raises(RuntimeError, match="size mismatch"):  # weights of another shape are refused
        recipe(wider, init_weights=f"models:/{model_id}")


@pytest.fixture(scope="module")
def scene_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scenes")
    scenes.write_dataset(root, train=24, test=8, size=32, seed=0, workers=1)
    return root


def test_an_mae_encoder_is_logged_over_its_modalities_and_downstream_jobs_start_from_it(store, scene_root):
    pretraining = recipe({"name": "multimae", "data_path": str(scene_root), "visible_tokens": 32})
    pretraining.run_epoch(0)
    model_id = log_trained_model(pretraining.task, pretraining.raw_model, run_id=new_run(store), step=1)
    info = mlflow.models.get_model_info(f"models:/{model_id}")
    assert specs(info.signature.inputs) == [
        ("rgb", "float32", (-1, 3, 32, 32)),
        ("depth", "float32", (-1, 1, 32, 32)),
        ("semseg", "int64", (-1, 32, 32)),
    ]
    assert info.metadata == {"modalities": ["rgb", "depth", "semseg"]}

    task = pretraining.task
    batch = task.collate([task.splits.test[i] for i in range(3)])
    inputs = [batch[m] for m in task.modalities]
    with torch.no_grad():
        expected = LoggedEncoder(pretraining.raw_model.encoder, task.modalities).eval()(*inputs)
        assert expected.shape == (3, 3 * task.spec.patches, task.spec.embed_dim)
        torch.testing.assert_close(mlflow.pytorch.load_model(f"models:/{model_id}")(*inputs), expected)

    job = recipe(
        {"name": "mae_downstream", "data_path": str(scene_root), "target": "depth", "pretrained": f"models:/{model_id}"}
    )
    encoder = pretraining.raw_model.encoder
    assert torch.equal(job.raw_model.encoder.embeds["rgb"].proj.weight, encoder.embeds["rgb"].proj.weight)
    assert torch.equal(job.raw_model.encoder.blocks[-1].mlp.fc2.weight, encoder.blocks[-1].mlp.fc2.weight)
    assert torch.equal(job.raw_model.encoder.modality_embed[0], encoder.modality_embed[0])  # RGB's row

    # the downstream job's own model: RGB in, dense depth out
    job_model_id = log_trained_model(job.task, job.raw_model, run_id=new_run(store), step=1)
    with torch.no_grad():
        torch.testing.assert_close(
            mlflow.pytorch.load_model(f"models:/{job_model_id}")(batch["rgb"]), job.raw_model.eval()(batch["rgb"])
        )


@pytest.fixture
def tiny_llm(tmp_path) -> tuple[Path, Path]:
    """(a random 2-layer Llama checkpoint folder, a training file): an LLM task without the hub."""
    base, data = tmp_path / "tiny-llama", tmp_path / "train.jsonl"
    save_tiny_llama(base, tiny_tokenizer())
    data.write_text("\n".join(json.dumps(e) for e in EXAMPLES))
    return base, data


def test_an_llm_run_logs_its_lora_adapter_with_the_transformers_flavour(store, tiny_llm):
    base, data = tiny_llm
    task = make_task(base, data)
    model = task.build_model()
    with torch.no_grad():  # LoRA's B starts at zero: give the adapter weight, so it changes the logits
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.02)
    model_id = log_trained_model(task, model, run_id=new_run(store), step=1)

    info = mlflow.models.get_model_info(f"models:/{model_id}")
    flavour = info.flavors["transformers"]
    assert flavour["peft_adaptor"] == "peft" and flavour["local_base_model_path"] == str(base)
    assert [s["type"] for s in info.signature.inputs.to_dict()] == ["string"]  # text generation
    loaded = mlflow.transformers.load_model(f"models:/{model_id}", return_type="components")
    ids = task.tokenizer("What is 2 + 3?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(loaded["model"](input_ids=ids).logits, model.eval()(input_ids=ids).logits)

    adapter = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    other = make_task(base, data).build_model()
    task.load_weights(other, weights.load_weights(f"models:/{model_id}").state)  # as train.init_weights
    assert same_tensors({k: v for k, v in other.state_dict().items() if "lora_" in k}, adapter)


def test_the_pytorch_flavour_is_imported_without_lightning_which_stays_importable():
    """Lightning is installed (attent[lightning]); MLflow's PyTorch flavour would import it (2 s)."""
    import subprocess
    import sys

    probe = (
        "import sys; from attent.tasks.weights import mlflow_pytorch; flavour = mlflow_pytorch(); "
        "print(hasattr(flavour, 'log_model'), 'pytorch_lightning' in sys.modules); "
        "import pytorch_lightning; print('pytorch_lightning' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False", "True"]


def test_init_weights_paths_resolve_and_a_missing_one_is_refused(tmp_path):
    cfg = build_experiment(
        {
            "name": "m",
            "task": DIGITS_TASK,
            "train": {"epochs": 1, "init_weights": "ckpt"},
            "mlflow": {"registered_model": "digits-vit"},
        }
    )
    resolved = cfg.resolved(tmp_path)
    assert resolved.train.init_weights == str(tmp_path / "ckpt")
    with pytest.raises(PreflightError, match="does not exist"):
        check_init_weights(resolved.train.init_weights)
    check_init_weights("models:/m-0123")  # URIs are the workers' to read
    uri = build_experiment({"name": "m", "task": DIGITS_TASK, "train": {"epochs": 1, "init_weights": "models:/m-0123"}})
    assert uri.resolved(tmp_path).train.init_weights == "models:/m-0123"


def test_downstream_jobs_do_not_register_under_the_pretrainings_name(scene_root):
    cfg = build_experiment(
        {
            "name": "pre",
            "task": {"name": "multimae", "data_path": str(scene_root)},
            "train": {"epochs": 1},
            "mlflow": {"registered_model": "encoders"},
            "downstream": [{"name": "depth", "task": {"target": "depth"}, "train": {"epochs": 1}}],
        }
    )
    assert cfg.downstream_experiment(cfg.downstream[0], pretrained=None).mlflow.registered_model is None


# --- slow: the session's Ray runs ----------------------------------------------------------------


def run_model_id(client: MlflowClient, run_id: str) -> str:
    """The model a finished run logged (MLflow's link from the run to its outputs)."""
    [output] = client.get_run(run_id).outputs.model_outputs
    return output.model_id


def last_checkpoint_model(cfg) -> dict[str, torch.Tensor]:
    """The model state in a run's newest Ray checkpoint (the last epoch's)."""
    newest = sorted(p for p in Path(cfg.ray.storage_path, cfg.name).glob("checkpoint_*") if p.is_dir())[-1]
    return checkpoint.load(newest)["model"]


def test_a_finished_run_logs_its_model_which_predicts_as_its_last_checkpoint(reference_runs, monkeypatch):
    trained = reference_runs("digits-soft")
    cfg, client = trained.cfg, MlflowClient(trained.tracking_uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", trained.tracking_uri)
    run = client.get_run(trained.run_id)
    model_id = run_model_id(client, trained.run_id)
    assert run.outputs.model_outputs[0].step == cfg.train.epochs
    assert run.data.metrics[contract.TIME_MODEL_LOG] > 0
    linked = {m.key: m.value for m in client.get_logged_model(model_id).metrics}
    assert linked["eval_test_accuracy"] == run.data.metrics["eval_test_accuracy"]  # the final metrics

    # the model as a resumed run restores it: built by the task, loaded from the checkpoint
    restored = TrainingRecipe(cfg, WorkerContext())
    restored.setup()
    checkpoint.load_trainable_state(restored.raw_model, last_checkpoint_model(cfg))
    test = restored.task.splits.test
    images = torch.stack([test[i]["image"] for i in range(len(test))])
    with torch.no_grad():
        expected = restored.raw_model.eval()(images)
        logged = mlflow.pytorch.load_model(f"runs:/{trained.run_id}/model")(images)
    torch.testing.assert_close(logged, expected)
    accuracy = (logged.argmax(dim=1) == test.labels).float().mean().item()
    assert accuracy == pytest.approx(run.data.metrics["eval_test_accuracy"])


def test_a_run_starts_from_a_logged_model_and_registers_its_own(reference_runs, tmp_path, monkeypatch):
    """A vision run from the reference run's model at a learning rate too small to move it: its
    first evaluation is the reference run's last; its own model is version 1 of a registered name."""
    from attent.engine.driver import train
    from attent.selection.config import deep_merge

    from tests.helpers import shared_runs

    reference = reference_runs("digits-soft")
    client = MlflowClient(reference.tracking_uri)
    source = f"models:/{run_model_id(client, reference.run_id)}"
    cfg = build_experiment(
        deep_merge(
            shared_runs.DIGITS,
            {
                "name": "from-model",
                "selection": {"method": "full"},
                "train": {"epochs": 1, "lr": 1e-9, "init_weights": source},
                "ray": {"num_workers": 0, "storage_path": str(tmp_path / "ray_results")},
                "mlflow": {
                    "tracking_uri": reference.tracking_uri,
                    "experiment": "from-model",
                    "registered_model": "digits-vit",
                },
            },
        )
    )
    result = train(cfg)
    reference_metrics = client.get_run(reference.run_id).data.metrics
    assert result.metrics["eval_test_accuracy"] == reference_metrics["eval_test_accuracy"]
    assert result.metrics["eval_test_loss"] == pytest.approx(reference_metrics["eval_test_loss"], rel=1e-5)

    [version] = client.search_model_versions("name = 'digits-vit'")
    assert (int(version.version), version.source) == (1, f"models:/{run_model_id(client, result.run_id)}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reference.tracking_uri)
    images = torch.rand(4, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(
            mlflow.pytorch.load_model("models:/digits-vit/1")(images),
            mlflow.pytorch.load_model(source)(images),
            rtol=1e-4,
            atol=1e-5,
        )


@pytest.mark.skipif(not (SHARED / "datasets/gsm8k/train.jsonl").exists(), reason="needs ../shared/datasets")
def test_the_llm_run_logs_its_adapter_which_predicts_as_its_last_checkpoint(reference_runs, monkeypatch):
    trained = reference_runs("llm")
    client = MlflowClient(trained.tracking_uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", trained.tracking_uri)
    model_id = run_model_id(client, trained.run_id)
    info = mlflow.models.get_model_info(f"models:/{model_id}")
    assert info.flavors["transformers"]["peft_adaptor"] == "peft"
    assert client.get_run(trained.run_id).data.metrics[contract.TIME_MODEL_LOG] > 0

    from attent.tasks.llm.task import LLMTask

    task = LLMTask(trained.cfg.task, seed=trained.cfg.seed)
    restored = task.build_model()
    checkpoint.load_trainable_state(restored, last_checkpoint_model(trained.cfg))
    logged = mlflow.transformers.load_model(f"models:/{model_id}", return_type="components")["model"]
    ids = torch.tensor([task.encode_prompt(["Natalia sold clips to 48 of her friends. How many?"])])
    with torch.no_grad():
        torch.testing.assert_close(logged.eval()(input_ids=ids).logits, restored.eval()(input_ids=ids).logits)
