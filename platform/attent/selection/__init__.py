"""AtteNT sample selection, usable in any PyTorch loop (no Ray, MLflow or task imported here):

    strategies  select(scores, k, "hard" | "soft" | "random"), budget, weighted draws
    topk        the exact O(N) top-k and the noise streams behind them
    methods     one unit per method (AtteNT, full data, InfoBatch, ...), registered in METHODS
    schedules   the ratio and interval schedules, and the released code's cycles, as functions
    plan        build_plan: every epoch of a run decided once (the only walk of the schedules)
                and the training progress, the one clock of selection and learning rate
    scoring     ScoringPolicy: which samples a pass scores, which losses become scores
    teacher     Teacher: the score table and state around a method, reading the plan
    sampler     SubsetSampler: a rank's shard of the teacher's subset; the Selector's recording one
    selector    Selector: AtteNT in any PyTorch loop, the core every integration and the engine use
    distributed the collectives: observations all-gathered, sums, the subsets' agreement
    config      SelectionConfig: the ``selection:`` section (pydantic only), METHOD_NAMES

Users import the public names from one place, ``attent`` (``attent.Selector``,
``attent.SelectionConfig``, ``attent.select``, ...), which loads them on first access.
"""
