"""Result tables and figures for AtteNT experiments, read from MLflow.

Entry points live in ``analysis.report`` (``build_report``, ``main``; ``attent report`` on the
command line), which builds an experiment's report. The other modules:

- ``analysis.runs``: loads runs and metric histories from MLflow into the runs frame;
- ``analysis.tables``: the paper's table layouts (which rows and columns each table has);
- ``analysis.table_verdicts``: each table's plateau verdict, seed intervals and words;
- ``analysis.render``: cell formatting and the Markdown/CSV/LaTeX text of a table;
- ``analysis.figures``: the report's plots;
- ``analysis.time_to_accuracy``: the time-to-accuracy benchmark's report;
- ``analysis.tta_results``: the time-to-accuracy benchmark's numbers, read from MLflow.

Nothing is imported here, so ``python -m analysis.report`` runs without a double import.
"""
