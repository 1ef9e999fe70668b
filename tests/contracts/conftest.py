"""The contract suites' backends (tests/contracts/backends.py), for every module here."""

from tests.contracts.backends import (  # noqa: F401 - fixtures
    _contract_embedded_broker,
    _contract_embedded_postgres,
    conn,
    embedded_database,
    external_database,
)
