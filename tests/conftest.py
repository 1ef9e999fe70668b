pytest_plugins = ["tests.fixtures.infra", "tests.fixtures.engine"]
