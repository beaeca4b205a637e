"""The integrations' arms of benchmarks/speed/phase_costs.py: each trains a workload (phase_costs_workloads)
for a few epochs through one integration (the engine's recipe, a plain loop on ``attent.Selector``,
``AtteNTTrainer``, ``AtteNTSFTTrainer``, Lightning's ``AtteNTCallback``) and measures each phase from
inside that integration's own loop.

Every arm returns the same sums (``Phases``): training-step seconds (forward, backward, clipping,
optimiser step; the batch already loaded) and the samples trained, the scoring passes' seconds as the
Selector clocks them, the samples they scored and each pass's largest batch, the batch the Selector
reports, the selection's seconds and re-selections, and one pass of the integration's own training
loader, iterated alone."""

from __future__ import annotations

import logging
import tempfile
import time
from typing import Any

import torch
from phase_costs_workloads import EPOCHS, GRAD_CLIP, SELECTION, Clock, Phases, VitWorkload, Workload, word_tokenizer
from torch.utils.data import DataLoader


# --- what every arm shares --------------------------------------------------------------------------------
def spy_scoring(selector, phases: Phases) -> None:
    """Count the samples each scoring pass scores and its largest batch (``begin_epoch`` reads the
    selector's ``scoring_pass`` when it runs one)."""
    original = selector.scoring_pass

    def scoring_pass(indices):
        phases.scoring_batches.append(0)
        for batch_indices, losses in original(indices):
            phases.scored += len(batch_indices)
            phases.scoring_batches[-1] = max(phases.scoring_batches[-1], len(batch_indices))
            yield batch_indices, losses

    selector.scoring_pass = scoring_pass


def rows_of(batch) -> int:
    first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return len(first)


def finish(phases: Phases, selector, loader, device: torch.device) -> Phases:
    """The Selector's clocks and counts after the fit, and one pass of the training loader alone."""
    phases.score_s, phases.selection_s = selector.seconds["scoring"], selector.seconds["selection"]
    phases.reselections = sum(planned.selects for planned in selector.plan)
    phases.pool, phases.trained = len(selector.dataset), selector.samples_backpropagated
    scoring_batch = selector.scoring.batch_size_for(selector.train_batch_size)
    phases.reported_scoring_batch = scoring_batch
    phases.load_s, phases.loaded = iterate(loader, device)
    # the scoring pass's own loader (as Selector.scoring_pass builds it), alone: its share of the pass
    scoring = selector.scoring.loader
    everything = DataLoader(
        scoring.dataset,
        batch_size=scoring_batch,
        sampler=range(len(scoring.dataset)),
        collate_fn=scoring.collate_fn,
        num_workers=scoring.num_workers,
    )
    phases.score_load_s, phases.score_loaded = iterate(everything, device)
    return phases


def iterate(loader, device: torch.device) -> tuple[float, int]:
    """Seconds of one pass over ``loader`` doing nothing with its batches, and the samples it held."""
    clock, samples = Clock(device), 0
    with clock:
        for batch in loader:
            samples += rows_of(batch)
    return clock.seconds, samples


class TimedLoader:
    """A loader whose ``next`` is clocked: the engine's epoch minus its waits on the loader is its steps."""

    def __init__(self, loader):
        self.loader, self.seconds = loader, 0.0

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        batches = iter(self.loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - start
            yield batch


# --- the arms ---------------------------------------------------------------------------------------------
def run_engine(work: Workload, device: torch.device) -> Phases:
    """The engine's TrainingRecipe (as a Ray worker runs it, without Ray): select, then train_one_epoch."""
    from attent.engine.recipe import TrainingRecipe, WorkerContext

    recipe = TrainingRecipe(work.config, WorkerContext(device=device))
    recipe.setup(wrap_model=lambda model: model.to(device))
    phases = Phases(train_batch=work.batch)
    spy_scoring(recipe.selector, phases)
    loader, recipe.loader = recipe.loader, TimedLoader(recipe.loader)
    clock = Clock(device)
    for epoch in range(EPOCHS):
        recipe.select(epoch)
        with clock:
            recipe.train_one_epoch(epoch)
    phases.train_s = clock.seconds - recipe.loader.seconds
    return finish(phases, recipe.selector, loader, device)


def run_selector(work: Workload, device: torch.device) -> Phases:
    """The three-line loop of ``attent.Selector``'s docstring."""
    from attent import SelectionConfig, Selector

    model = work.build_model()
    selector = Selector(
        work.dataset,
        selection=SelectionConfig(**SELECTION),
        epochs=EPOCHS,
        seed=0,
        model=model,
        loss_fn=work.per_sample_loss,
        collate_fn=work.collate,
    )
    loader = selector.loader(batch_size=work.batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=work.lr)
    phases, clock = Phases(train_batch=work.batch), Clock(device)
    spy_scoring(selector, phases)
    for epoch in range(EPOCHS):
        selector.begin_epoch(epoch)
        model.train()
        for batch in loader:
            with clock:
                loss = selector.update(work.per_sample_loss(model, batch)).mean()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        selector.end_epoch()
    phases.train_s = clock.seconds
    return finish(phases, selector, loader, device)


def trainer_class(base):
    """``base`` (AtteNTTrainer, AtteNTSFTTrainer) keeping its training loader and spying on its
    Selector's scoring passes, and a callback clocking each optimiser step (on_step_begin, after the
    step's batches are loaded, to on_step_end)."""
    from transformers import PrinterCallback, TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self, clock: Clock):
            self.clock = clock

        def on_step_begin(self, args, state, control, **kwargs):
            self.clock.__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            self.clock.__exit__()

    class Measured(base):
        def __init__(self, *args, phases: Phases, clock: Clock, **kwargs):
            super().__init__(*args, **kwargs)
            self.phases = phases
            self.remove_callback(PrinterCallback)  # the selection's metrics, printed each epoch
            self.add_callback(StepClock(clock))

        def get_train_dataloader(self):
            self.kept_loader = super().get_train_dataloader()
            spy_scoring(self.selector, self.phases)
            return self.kept_loader

    return Measured


def trainer_args(work: Workload, device: torch.device, out: str) -> dict[str, Any]:
    return dict(
        output_dir=out,
        per_device_train_batch_size=work.batch,
        num_train_epochs=EPOCHS,
        learning_rate=work.lr,
        max_grad_norm=GRAD_CLIP,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        use_cpu=device.type != "cuda",
        bf16=device.type == "cuda",
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


class ImageClassifier(torch.nn.Module):
    """The ViT as Trainer calls models: keyword inputs, a dict out (its loss per sample comes from
    ``compute_per_sample_loss``)."""

    def __init__(self, vit: torch.nn.Module):
        super().__init__()
        self.vit = vit

    def forward(self, image, label=None):
        return {"logits": self.vit(image)}


def run_trainer(work: Workload, device: torch.device) -> Phases:
    """AtteNTTrainer: the LM through its own loss split, the ViT through compute_per_sample_loss."""
    from attent import SelectionConfig
    from attent.integrations.huggingface import AtteNTTrainer
    from transformers import TrainingArguments

    phases, clock = Phases(train_batch=work.batch), Clock(device)
    extra: dict[str, Any] = {}
    args = trainer_args(work, device, "")
    if isinstance(work, VitWorkload):
        model = ImageClassifier(work.build_model())
        extra["compute_per_sample_loss"] = lambda model, inputs: work.per_sample_loss(model.vit, inputs)
        args["remove_unused_columns"] = False  # the task's collate reads each item's index
    else:
        model = work.build_model()
    with tempfile.TemporaryDirectory() as out:
        trainer = trainer_class(AtteNTTrainer)(
            model=model,
            args=TrainingArguments(**{**args, "output_dir": out}),
            train_dataset=work.dataset,
            data_collator=work.collate,
            selection=SelectionConfig(**SELECTION),
            phases=phases,
            clock=clock,
            **extra,
        )
        trainer.train()
    phases.train_s = clock.seconds
    return finish(phases, trainer.selector, trainer.kept_loader, device)


def run_sft(work: Workload, device: torch.device) -> Phases:
    """AtteNTSFTTrainer on the LM's rows as prompt-completion text (completion-only loss)."""
    import datasets
    from attent import SelectionConfig
    from attent.integrations.huggingface_trl import AtteNTSFTTrainer
    from trl import SFTConfig

    phases, clock = Phases(train_batch=work.batch), Clock(device)
    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(
            **trainer_args(work, device, out),
            max_length=work.spec["seq"],
            packing=False,
            gradient_checkpointing=False,  # TRL's default; off, as in every other arm
        )
        trainer = trainer_class(AtteNTSFTTrainer)(
            model=work.build_model(),
            args=config,
            train_dataset=datasets.Dataset.from_list(work.sft_rows()),
            processing_class=word_tokenizer(work.spec["vocab"]),
            selection=SelectionConfig(**SELECTION),
            phases=phases,
            clock=clock,
        )
        trainer.train()
    phases.train_s = clock.seconds
    return finish(phases, trainer.selector, trainer.kept_loader, device)


def lightning_trainer(device: torch.device, callbacks: list, out: str):
    """Lightning's Trainer as the other arms train: one device (bf16 autocast on CUDA), the
    gradient clipping, the loader rebuilt each epoch (the selection's), and nothing logged or saved."""
    import lightning as L

    return L.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        precision="bf16-mixed" if device.type == "cuda" else "32-true",
        max_epochs=EPOCHS,
        gradient_clip_val=GRAD_CLIP,
        reload_dataloaders_every_n_epochs=1,
        callbacks=callbacks,
        default_root_dir=out,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def run_lightning(work: Workload, device: torch.device) -> Phases:
    """A LightningModule whose training_step hands its per-sample losses to AtteNTCallback.update;
    each batch clocked from on_train_batch_start to on_train_batch_end."""
    import lightning as L
    from attent import SelectionConfig
    from attent.integrations.lightning import AtteNTCallback

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # its device lines and tips, each fit

    phases, clock = Phases(train_batch=work.batch), Clock(device)

    class Module(L.LightningModule):
        def __init__(self, net, selection):
            super().__init__()
            self.net, self.selection = net, selection

        def training_step(self, batch, batch_idx):
            return self.selection.update(work.per_sample_loss(self.net, batch)).mean()

        def train_dataloader(self):
            return self.selection.loader(work.batch)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=work.lr)

    class BatchClock(L.Callback):
        def setup(self, trainer, module, stage):  # after AtteNTCallback's, which builds the Selector
            spy_scoring(selection.selector, phases)

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            clock.__enter__()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            clock.__exit__()

    selection = AtteNTCallback(
        work.dataset,
        selection=SelectionConfig(**SELECTION),
        seed=0,
        loss_fn=lambda module, batch: work.per_sample_loss(module.net, batch),
        collate_fn=work.collate,
    )
    module = Module(work.build_model(), selection)
    with tempfile.TemporaryDirectory() as out:
        lightning_trainer(device, [selection, BatchClock()], out).fit(module)
    phases.train_s = clock.seconds
    return finish(phases, selection.selector, module.train_dataloader(), device)


ARMS = {
    "engine": run_engine,
    "Selector": run_selector,
    "AtteNTTrainer": run_trainer,
    "AtteNTSFTTrainer": run_sft,
    "Lightning": run_lightning,
}
