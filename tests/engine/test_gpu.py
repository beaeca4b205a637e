"""The CUDA paths, for a GPU node: `pytest -m gpu`. Skipped, saying why, where no CUDA device is
visible (CI runs none of them; the precision plumbing runs on the CPU in test_precision.py).

- bf16 training and scoring on a GPU through the recipe;
- the fused loss kernel (cut-cross-entropy) equal to the chunked loss;
- two-worker NCCL DDP through Ray Train, both ranks training on the same subsets, and MLflow's GPU
  system metrics logged for a GPU run (the system tier's: tests/system/test_gpu.py);
- AtteNTTrainer and the Lightning callback choosing on CUDA what they choose on the CPU;
- AtteNTTrainer under the Trainer's FSDP choosing what it chooses unsharded.
"""

from __future__ import annotations

import pytest
import torch
from attent.experiment.schema import build_experiment
from attent.selection.config import SelectionConfig, deep_merge

from tests.helpers.hf_tiny import CONFIGS, RecordingTrainer, collate, samples, selection_rows, tiny_llama, training_args

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU (none visible here): run `pytest -m gpu` on a GPU node"),
]


def digits(**sections):
    base = {
        "name": "gpu",
        "seed": 0,
        "task": {
            "name": "vision",
            "dataset": "digits",
            "train_limit": 512,
            "test_limit": 128,
            "model": {"preset": "vit_tiny_cpu"},
        },
        "train": {"epochs": 2, "batch_size": 64, "precision": "bf16"},
        "selection": {"preset": "vit"},
    }
    return build_experiment(deep_merge(base, sections))


def test_bf16_training_and_scoring_on_cuda():
    from attent.engine.recipe import TrainingRecipe, WorkerContext

    recipe = TrainingRecipe(digits(), WorkerContext(device=torch.device("cuda")))
    recipe.setup(wrap_model=lambda model: model.to("cuda"))
    seen = []
    recipe.raw_model.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    rows = [recipe.run_epoch(epoch) for epoch in range(2)]
    assert torch.bfloat16 in seen  # autocast ran the model in bf16
    assert all(torch.isfinite(torch.tensor(row["train_loss"])) for row in rows)
    assert torch.isfinite(recipe.selector.scores).all()  # the bf16 scoring pass scored every sample
    assert recipe.counters.seconds["scoring"] > 0


def test_the_fused_loss_equals_the_chunked_loss():
    pytest.importorskip("cut_cross_entropy", reason="the fused kernel's package is not installed")
    from attent.tasks.llm.loss import IGNORE_INDEX, response_token_losses

    torch.manual_seed(0)
    head = torch.nn.Linear(64, 1000, bias=False).to("cuda", torch.bfloat16)
    hidden = torch.randn(4, 32, 64, device="cuda", dtype=torch.bfloat16)
    labels = torch.randint(0, 1000, (4, 32), device="cuda")
    labels[:, :10] = IGNORE_INDEX  # the prompt
    fused, rows = response_token_losses(hidden, labels, head, fused="auto")
    chunked, rows_chunked = response_token_losses(hidden, labels, head, fused="off", chunk_tokens=16)
    assert torch.equal(rows, rows_chunked)
    torch.testing.assert_close(fused, chunked, rtol=2e-2, atol=2e-2)  # bf16 logits


# --- the integrations on a GPU (issue 28) ------------------------------------------------------------------
def test_the_trainer_chooses_on_cuda_what_it_chooses_on_the_cpu(tmp_path):
    """AtteNTTrainer on CUDA, fp32, learning rate 0: every sample keeps the loss the initial model
    gives it, and CUDA's kernels move those losses by float rounding only, far below the gaps
    between them, so the subsets equal the CPU's at every re-selection; in bf16 it trains."""
    picks = {}
    for device in ("cpu", "cuda"):
        trainer = RecordingTrainer(
            model=tiny_llama(),
            train_dataset=samples(),
            data_collator=collate,
            args=training_args(tmp_path / device, learning_rate=0.0, num_train_epochs=4, use_cpu=device == "cpu"),
            selection=SelectionConfig(**CONFIGS["vit"]),
            seed=3,
        )
        trainer.train()
        assert next(trainer.model.parameters()).device.type == device
        picks[device] = [row["subset_checksum"] for row in selection_rows(trainer)], trainer.subsets
    assert picks["cuda"] == picks["cpu"]
    bf16 = RecordingTrainer(
        model=tiny_llama(),
        train_dataset=samples(),
        args=training_args(tmp_path / "bf16", bf16=True, use_cpu=False),
        data_collator=collate,
        selection=SelectionConfig(**CONFIGS["llm"]),
        seed=3,
    )
    bf16.train()
    losses = [row["loss"] for row in bf16.state.log_history if "loss" in row]
    assert losses and all(torch.isfinite(torch.tensor(losses)))


def test_the_lightning_callback_chooses_on_cuda_what_it_chooses_on_the_cpu():
    """The Lightning callback on one GPU against the CPU: the same model, optimiser and seed; the
    per-sample losses of this model are exact in fp32 on either device (squared differences)."""
    pytest.importorskip("lightning")  # lightning_sample imports it

    from tests.helpers.lightning_sample import CONFIGS, fit

    runs = {device: fit(SelectionConfig(**CONFIGS["vit"]), 4, 0, accelerator=device)[0] for device in ("cpu", "gpu")}
    assert runs["gpu"]["checksums"] == runs["cpu"]["checksums"]
    torch.testing.assert_close(runs["gpu"]["value"].cpu(), runs["cpu"]["value"], rtol=1e-6, atol=1e-6)


def test_the_trainer_under_fsdp_chooses_what_it_chooses_unsharded(tmp_path, monkeypatch):
    """AtteNTTrainer under the Trainer's FSDP (accelerate's FSDP2, ``fully_shard`` per decoder
    layer; a process group of one GPU, as torchrun starts it): at learning rate 0 its scoring passes
    through the sharded model pick the unsharded run's subsets at every re-selection. Accelerate and
    Ray Train shard on GPUs only; on the CPU the invariant that keeps sharded ranks from hanging
    (as many forwards on every rank) is tested under DDP (test_integration_agreement.py)."""
    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    from tests.helpers.processes import free_port

    def picks(folder: str, **sharding):
        trainer = RecordingTrainer(
            model=tiny_llama(),
            train_dataset=samples(),
            data_collator=collate,
            args=training_args(tmp_path / folder, learning_rate=0.0, num_train_epochs=4, use_cpu=False, **sharding),
            selection=SelectionConfig(**CONFIGS["vit"]),
            seed=3,
        )
        trainer.train()
        return [row["subset_checksum"] for row in selection_rows(trainer)], trainer.subsets, trainer.is_fsdp_enabled

    unsharded = picks("unsharded")
    for name, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                            WORLD_SIZE="1", LOCAL_WORLD_SIZE="1").items():  # fmt: skip
        monkeypatch.setenv(name, value)
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        sharded = picks("fsdp", fsdp=True, fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        if dist.is_initialized():
            dist.destroy_process_group()
    assert sharded[2] and not unsharded[2]  # the Trainer sharded the one run only
    assert sharded[:2] == unsharded[:2]
