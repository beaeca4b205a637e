"""AtteNT in the training code users already have. Each integration sits on
``attent.selection`` only (never on the engine) and imports its framework when it is imported:

    pytorch          Selector: a plain PyTorch loop in three lines (sampler, scoring pass, weighted loss);
                     the engine's recipe trains through it too
    huggingface      AtteNTTrainer: Hugging Face's Trainer, drop-in (and AtteNTTrainerMixin for its
                     subclasses): owns the train sampler, per-sample loss, LR schedule sized by the
                     planned subsets, selection state in checkpoints
    huggingface_trl  AtteNTSFTTrainer: TRL's SFTTrainer, the same (``pip install attent[trl]``)
    lightning        AtteNTCallback: a Lightning Trainer callback on Selector (``attent[lightning]``)

Under Ray Train, AtteNTTrainer runs as it is through ``prepare_trainer`` (``examples/ray_hf_trainer.py``);
nothing here imports Ray.
"""
