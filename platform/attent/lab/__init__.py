"""The theory lab's runner: the gradient check and the teaching experiment of ``attent.theory``, logged
to MLflow (``experiment``), summarised in Markdown, JSON and figures (``report``).

    python -m attent.lab experiments/theory_teaching.yaml [key.path=value ...] [--out DIR]

(or `attent theory FILE`, the same).
"""
