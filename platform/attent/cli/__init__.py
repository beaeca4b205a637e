"""The `attent` command line: ``main`` (the parser, `attent train`, `sweep`, `bench`, ...), ``services``
(`report`, `ui`, `server`, `data`), ``validate``, ``demo``, ``doctor``, and what every command shares:
its one-line errors (``errors``) and the extras a missing package names (``extras``). Nothing is
imported here: `attent --help` parses without torch, Ray or MLflow."""
