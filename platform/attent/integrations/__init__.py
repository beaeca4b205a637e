"""AtteNT in the training code users already have. Each integration sits on
``attent.selection`` only (never on the engine) and imports its framework when it is imported.
A plain PyTorch loop needs none: ``attent.selection.selector.Selector`` is three lines in it
(sampler, scoring pass, weighted loss), and the engine's recipe and every integration here train
through it.

    huggingface      AtteNTTrainer: Hugging Face's Trainer, drop-in (and AtteNTTrainerMixin for its
                     subclasses): owns the train sampler, per-sample loss, LR schedule sized by the
                     planned subsets, selection state in checkpoints; on an IterableDataset, a
                     StreamSelector's batches (huggingface_stream)
    huggingface_trl  AtteNTSFTTrainer: TRL's SFTTrainer, the same (``pip install -e '.[trl]'`` in a clone)
    lightning        AtteNTCallback: a Lightning Trainer callback on Selector (``pip install -e '.[lightning]'``)
    lightning_stream AtteNTStreamCallback: the same on a stream, on StreamSelector (each pool scored at
                     the step that trains it)
    packed           per-sample losses of packed and padding-free rows (position_ids / cu_seq_lens
                     segments; no framework imported)
    loaders          draws_from: the check every integration makes that a train loader draws from
                     the selection's sampler; rank_share: a rank's share of a stream (no framework imported)

Under Ray Train, AtteNTTrainer runs as it is through ``prepare_trainer`` (``examples/ray_hf_trainer.py``);
nothing here imports Ray.
"""
