"""AtteNT sample selection, usable in any PyTorch loop (no Ray, MLflow or task imported here):

    strategies  select(scores, k, "hard" | "soft" | "random"), budget, weighted draws
    topk        the exact O(N) top-k and the noise streams behind them
    methods     one unit per method (AtteNT, full data, InfoBatch, ...), registered in METHODS
    teacher     Teacher: the score table, schedules and state around a method
    schedules   ratio and interval schedules over training progress
    sampler     SubsetSampler: a rank's shard of the teacher's subset
    config      SelectionConfig: the ``selection:`` section (pydantic only), METHOD_NAMES
    deprecation old spellings kept until the release REMOVED_IN, each with a FutureWarning

Users import the public names from one place, ``attent`` (``attent.Selector``,
``attent.SelectionConfig``, ``attent.select``, ...), which loads them on first access.
"""
