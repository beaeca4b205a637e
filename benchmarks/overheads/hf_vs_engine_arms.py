"""The arms of benchmarks/overheads/hf_vs_engine.py: one run of the job through Trainer, AtteNTTrainer or
the engine, with what it measured (that script's docstring says what is timed and how), and the held-out
loss every arm's final model is scored with."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path


def heldout_loss(task, model) -> float:
    """The held-out response loss of ``model``: the one function every arm is scored with."""
    was_training = model.training
    model.eval()
    try:
        return float(task.evaluate_response_loss(model)["gsm8k_test_response_loss"])
    finally:
        model.train(was_training)


def data_identity(task) -> dict:
    from attent.tasks.llm.data import fingerprint

    train, heldout = task.train_dataset().examples, task.gsm8k_test_answers().examples
    return {
        "train_problems": len(train),
        "heldout_problems": len(heldout),
        "train_fingerprint": fingerprint(train)[:12],
        "heldout_fingerprint": fingerprint(heldout)[:12],
    }


# --- the Trainer arms ----------------------------------------------------------------------------------------
def trainer_classes():
    from attent.integrations.huggingface import AtteNTTrainer
    from transformers import Trainer

    class Counting:
        """Counts the rows (samples) of every training micro-batch."""

        rows = 0

        def training_step(self, model, inputs, num_items_in_batch=None):
            self.rows += int(inputs["input_ids"].shape[0])
            return super().training_step(model, inputs, num_items_in_batch)

    class CountingTrainer(Counting, Trainer):
        pass

    class CountingAtteNTTrainer(Counting, AtteNTTrainer):
        pass

    return CountingTrainer, CountingAtteNTTrainer


def training_arguments(cfg, optim, accumulation: int, workdir: Path):
    """Trainer's settings for the engine's job: its optimiser, schedule, clipping, batch and seed, on
    the CPU, with no evaluation, checkpoints or reporting."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(workdir / f"{cfg.name}"),
        num_train_epochs=cfg.train.epochs,
        per_device_train_batch_size=cfg.train.batch_size,
        gradient_accumulation_steps=accumulation,
        learning_rate=optim.lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        adam_epsilon=optim.eps,
        lr_scheduler_type=optim.schedule,
        warmup_steps=optim.warmup_ratio,
        max_grad_norm=cfg.train.grad_clip or 0.0,
        seed=cfg.seed,
        use_cpu=True,
        dataloader_num_workers=cfg.train.loader_workers,
        remove_unused_columns=False,
        logging_strategy="epoch",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )


def run_trainer(args, cfg, arm: str, workdir: Path, clock) -> tuple[dict, object, object]:
    """One Trainer arm on the engine task's data, model and optimiser settings, timed by ``clock``
    (``harness.epoch_clock``); (row, task, model)."""
    from attent.engine.lr import resolve_optimizer
    from attent.selection.config import SelectionConfig
    from attent.tasks.registry import build_task

    CountingTrainer, CountingAtteNTTrainer = trainer_classes()
    started = time.perf_counter()
    task = build_task(cfg.task, seed=cfg.seed)
    optim = resolve_optimizer(task.optimizer_spec(), cfg)
    accumulation = max(1, math.ceil(optim.global_batch_size / cfg.train.batch_size))

    def collate(items):  # the task's right-padding collate; Trainer's model takes no index
        batch = task.collate(items)
        batch.pop("index")
        return batch

    training = training_arguments(cfg, optim, accumulation, workdir)
    kwargs = dict(
        model=task.build_model(),
        args=training,
        train_dataset=task.train_dataset(),
        data_collator=collate,
        callbacks=[clock],
    )
    if arm == "trainer_attent":
        trainer = CountingAtteNTTrainer(**kwargs, selection=SelectionConfig(preset="llm"), seed=cfg.seed)
    else:
        trainer = CountingTrainer(**kwargs)
    trainer.train()
    wall = time.perf_counter() - started
    method = sum(clock.epochs)
    if arm == "trainer_attent":
        seconds, backpropagated = trainer.selector.seconds, trainer.selector.samples_backpropagated
        if backpropagated != trainer.rows:
            raise RuntimeError(f"AtteNTTrainer trained {trainer.rows} rows but its Selector counts {backpropagated}")
    else:
        seconds, backpropagated = {"scoring": 0.0, "selection": 0.0}, trainer.rows
    row = {
        "method_s": method,
        "scoring_s": seconds["scoring"],
        "selection_s": seconds["selection"],
        "train_s": method - seconds["scoring"] - seconds["selection"],
        "steps_s": clock.steps,
        "samples_backpropagated": backpropagated,
        "optimizer_steps": trainer.state.global_step,
        "wall_s": wall,
        "run_id": "",
    }
    return row, task, trainer.model


# --- the engine arms -----------------------------------------------------------------------------------------
def run_engine(cfg) -> tuple[dict, object, object]:
    """The engine's run of the job on Ray Train; its counters from MLflow, its final adapter read
    back from the run's logged model; (row, task, model)."""
    import ray
    from attent import contract
    from attent.engine.driver import train
    from attent.tasks import weights
    from attent.tasks.registry import build_task
    from mlflow import MlflowClient

    try:
        result = train(cfg)
    finally:  # the next arms run without Ray's processes beside them; the next engine run starts it anew
        ray.shutdown()
    m = MlflowClient(cfg.mlflow.tracking_uri).get_run(result.run_id).data.metrics
    os.environ["MLFLOW_TRACKING_URI"] = cfg.mlflow.tracking_uri
    task = build_task(cfg.task, seed=cfg.seed)
    model = task.build_model()
    task.load_weights(model, weights.load_weights(f"runs:/{result.run_id}/{contract.MODEL_NAME}").state)
    row = {
        "method_s": m[contract.TIME_METHOD],
        "train_s": m[contract.time_metric("train")],
        "scoring_s": m[contract.time_metric("scoring")],
        "selection_s": m[contract.time_metric("selection")],
        "steps_s": math.nan,
        "samples_backpropagated": int(m[contract.SAMPLES_BACKPROPAGATED]),
        "optimizer_steps": int(m[contract.OPTIMIZER_STEPS]),
        "wall_s": result.wallclock_s,
        "engine_own_heldout_loss": m.get(contract.EVAL_PREFIX + "gsm8k_test_response_loss", math.nan),
        "run_id": result.run_id,
    }
    return row, task, model
