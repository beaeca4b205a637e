"""The paper's tables (ablation, fixed ratio, comparison, with/without AtteNT) from a sweep's runs,
each with its plateau verdict, seed intervals and verdicts, as Markdown, CSV and LaTeX, and their
figures: ``report.build_report``. ``attent.analysis`` lists the modules.
"""

# The layouts by the name `attent report --kinds` takes (``layouts.TABLE_BUILDERS`` builds each);
# here, where the command's parser reads them without importing pandas.
TABLE_KINDS = ("ablation", "ratio", "comparison", "with_without", "summary")
