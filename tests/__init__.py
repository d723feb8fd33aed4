"""The harness's own tests, laid out like the package: tests/<layer>/ tests day0/<layer>/.

Every folder is a package, so two test files may share a name (tests/stages/latency/test_cli.py,
tests/harness/test_cli.py) and a test imports the shared helpers as ``tests.support.<module>``.
"""
