"""Result tables and figures for AtteNT experiments, read from MLflow.

Entry points live in ``analysis.report`` (``build_report``, ``main``; ``attent report`` on the
command line). ``analysis.runs`` loads runs from MLflow, ``analysis.tables`` holds the paper's
table layouts and their Markdown/CSV/LaTeX renderers, ``analysis.figures`` the plots. Nothing
is imported here, so ``python -m analysis.report`` runs without a double import.
"""
