"""What the tests share: the repository's paths (``paths``), the processes they start (``processes``, ``ranks``),
the runs several read (``shared_runs``), tiny models and data, and the suite's own tools (``suite_cpu``,
``reference_drift``). Imported by full name: ``from tests.helpers.paths import REPO``."""
