"""How the results are judged: the paper's ablation and comparison tables, and the time-to-accuracy
verdicts, read from MLflow through the run contract (``attent.contract``) alone: no engine, no Ray.
Installed as ``attent.analysis`` (pyproject.toml maps this folder there).

``attent report`` (``attent.analysis.command``: its one parser and the dispatch) builds an
experiment's tables, a benchmark's time-to-accuracy report, or several benchmarks' runs joined.
The two reports, apart, over what they share:

- ``paper_tables/``: the paper's tables from a sweep's runs. ``experiment_runs`` (the runs, their
  histories and names), ``table_numbers`` (rows, numbers and how a table is built), ``layouts``
  (the paper's layouts), ``verdicts`` (each table's
  plateau verdict, seed intervals and verdicts), ``table_files`` (Markdown, CSV, LaTeX), ``figures``,
  ``report`` (``build_report``); ``epochs_pilot``: the tables' epoch count, read on validation.
- ``time_to_accuracy/``: an `attent bench` study's report. ``runs`` (its runs and curves),
  ``results`` (the per-run and per-method numbers, budgets, comparisons), ``verdict`` (the
  sentences), ``workload_tables`` (the tables as text), ``figures``, ``judge`` (a workload's result
  from MLflow or from saved tables), ``report`` (the method, in its docstring; ``benchmark_report``);
  ``data_size`` (the verdicts against the training-set size; ``data_size_trend``: whether the
  difference moves with it), ``data_size_joined`` (several
  benchmarks judged as one: ``attent report --with``), ``reanalyse`` (today's verdicts for an older
  report's saved runs).
- Beneath both: ``stats`` (the statistics every report judges with: the target and plateau rules,
  paired t-intervals, Holm steps, TOST, the verdicts; it imports neither report), ``mlflow_runs``
  (MLflow runs as one flat frame), ``cell_format`` (how a number is written in a cell).

Nothing is imported here, so that ``python -m attent.analysis.paper_tables.epochs_pilot`` and
``python -m attent.analysis.time_to_accuracy.reanalyse`` run without a double import.
"""


class ReportError(Exception):
    """A problem the user can fix (unknown experiment, no finished runs, bad kind): ``attent report``
    prints it in one line. Here, beneath every module of the package, so that the statistics raise it
    without importing a report."""
