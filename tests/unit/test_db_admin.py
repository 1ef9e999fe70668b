"""The admin statements quote every identifier and never carry a password."""

import pytest

from projections.store.admin import (
    create_database_sql,
    drop_database_sql,
    quote_identifier,
    set_password_sql,
    timestamped_name,
    with_database,
)


def test_an_identifier_is_quoted_with_its_quotes_doubled():
    assert quote_identifier("plain") == '"plain"'
    assert quote_identifier('a"; DROP DATABASE x; --') == '"a""; DROP DATABASE x; --"'


@pytest.mark.parametrize("name", ["", "nul\x00byte"])
def test_an_empty_or_nul_identifier_is_refused(name):
    with pytest.raises(ValueError):
        quote_identifier(name)


def test_database_statements_name_the_database_quoted():
    assert create_database_sql('we"ird') == 'CREATE DATABASE "we""ird"'
    assert create_database_sql("db", owner="own") == 'CREATE DATABASE "db" OWNER "own"'
    assert drop_database_sql("db") == 'DROP DATABASE IF EXISTS "db" WITH (FORCE)'


def test_setting_a_password_sends_a_scram_verifier_not_the_password():
    statement = set_password_sql("app", "s3cret-password")
    assert "s3cret-password" not in statement
    assert statement.startswith("ALTER ROLE \"app\" PASSWORD 'SCRAM-SHA-256$4096:")


def test_a_url_is_pointed_at_another_database_keeping_credentials_and_options():
    assert (with_database("postgresql://u:p@h:5/old?sslmode=require", "new")
            == "postgresql://u:p@h:5/new?sslmode=require")


def test_a_timestamped_name_starts_with_its_prefix_and_differs_each_time():
    first, second = timestamped_name("ce_replay"), timestamped_name("ce_replay")
    assert first.startswith("ce_replay_") and first != second
