# The day0 plugin itself is registered through the pytest11 entry point (pyproject.toml).
# pytester must be enabled from the rootdir conftest, and the harness's own tests use it.
pytest_plugins = ["pytester"]
