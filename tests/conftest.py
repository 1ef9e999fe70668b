pytest_plugins = ["tests.fixtures.infra"]
