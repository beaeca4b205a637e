"""AtteNT in the training code users already have (issue 28). Each integration sits on
``attent.selection`` only (never on the engine) and imports its framework when it is imported:

    pytorch    Selector: a plain PyTorch loop in three lines (sampler, scoring pass, weighted loss)
    lightning  AtteNTCallback: a Lightning Trainer callback on Selector (extra ``attent[lightning]``)

Planned, not built yet: ``AtteNTTrainer`` (Hugging Face Trainer / TRL), and the Hugging Face
path under Ray Train.
"""
