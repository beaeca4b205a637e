"""The experiment file: its schema (``schema``: the pydantic models, ``ConfigError``), its reading and
overrides (``files``: ``load_experiment``, ``parse_overrides``, ``read_yaml``) and the tracking-store
URIs it resolves (``uris``)."""
