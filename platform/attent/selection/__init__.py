"""AtteNT sample selection, usable in any PyTorch loop (no Ray, MLflow or task imported here):

    strategies  select(scores, k, "hard" | "soft" | "random"), budget, weighted draws
    topk        the exact O(N) top-k and the noise streams behind them
    methods     one unit per method (AtteNT, full data, InfoBatch, ...), registered in METHODS
    schedules   the ratio and interval schedules, and the released code's cycles, as functions
    plan        build_plan: every epoch of a run decided once (the only walk of the schedules)
                and the training progress, the one clock of selection and learning rate
    scoring     ScoringPolicy: which samples a pass scores, which losses become scores
    selector    Selector: the selection's one stateful object (score table, plan, method, generator,
                position in the run), the core every integration and the engine use
    observations, records, epoch_metrics, state
                what the Selector does at a merge, a pick, an epoch's end and a checkpoint
    resume      a state taken inside an epoch, for a run that resumes there (a preempted one)
    scoring_pass ScoringPass: the Selector's own scoring pass and its loader
    stream      StreamSelector: selection from a stream, B of each pool of B / r (no scoring pass)
    sampler     SubsetSampler: a rank's shard of the Selector's subset; the Selector's recording one
    distributed the collectives: observations all-gathered, sums, the subsets' agreement
    config      SelectionConfig: the ``selection:`` section (pydantic only), METHOD_NAMES

Users import the public names from one place, ``attent`` (``attent.Selector``,
``attent.SelectionConfig``, ``attent.select``, ...), which loads them on first access.
"""
