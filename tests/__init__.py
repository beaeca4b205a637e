"""The test suite, laid out as the package: tests/<part>/ tests attent's part of that name (selection/,
integrations/, engine/, ...; analysis/ the report), tests/system/ holds the system tier, tests/helpers/ what the
tests share, and the top level the tests of the whole (layout, packaging, docs, the one import). A package tree, so
that each test module has a name of its own (``tests.engine.test_faults``, ``tests.system.test_faults``)."""
