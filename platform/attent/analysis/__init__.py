"""Result tables and figures for AtteNT experiments, read from MLflow through the run contract
(``attent.contract``) alone: no engine, no Ray.

Entry points live in ``attent.analysis.report`` (``build_report``, ``benchmark_report``, ``main``;
``attent report`` on the command line), which builds an experiment's report, a benchmark's, or
several benchmarks' joined. The other modules, from the bottom up:

- ``attent.analysis.stats``: the statistics every report judges with (paired t-intervals, Holm
  steps, TOST, the words, the plateau rule); it imports no other module of the package;
- ``attent.analysis.runs``, ``attent.analysis.tta_runs``: runs, metric histories and a benchmark's
  curves, loaded from MLflow;
- ``attent.analysis.cells``: how a number is written in a cell;
- ``attent.analysis.tables``, ``attent.analysis.table_verdicts``, ``attent.analysis.render``: the
  paper's table layouts, each table's plateau verdict, seed intervals and words, and their
  Markdown/CSV/LaTeX text;
- ``attent.analysis.tta_results``: the time-to-accuracy benchmark's numbers (target, per-run and
  per-method tables, comparisons);
- ``attent.analysis.tta_text``, ``attent.analysis.figures``: that report's words and tables, and
  the plots of both reports;
- ``attent.analysis.time_to_accuracy``: the time-to-accuracy report (its method, in its
  docstring), from MLflow or from the tables it saved;
- ``attent.analysis.data_size``: the verdicts against the training-set size;
- ``attent.analysis.joined``: several benchmarks' runs judged as one (``attent report --with``);
- ``attent.analysis.reanalyse``, ``attent.analysis.epochs_pilot``: today's words for an older
  report's saved runs; the paper tables' epoch count, read on validation.

Nothing is imported here, so ``python -m attent.analysis.report`` runs without a double import.
"""
