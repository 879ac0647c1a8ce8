"""The store's HA mode in the URL and libpq's multi-host form (docs/design.md, "Failover and synchronous
replication"; docs/deployment.md, "Connection strings"). No server: these check what reaches libpq."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from atmostonce_sql import make_engine, normalize_url, open_store, split_ha_mode

MULTI = "postgresql://app@/outbox?host=10.0.0.1:5432,10.0.0.2:5433&target_session_attrs=read-write"


def _connect_args(url):
    engine = make_engine(url)
    try:
        return engine.dialect.create_connect_args(engine.url)[1]
    finally:
        engine.dispose()


def test_hosts_with_their_ports_reach_libpq_as_host_and_port_lists():
    args = _connect_args(MULTI)
    assert (args["host"], args["port"]) == ("10.0.0.1,10.0.0.2", "5432,5433")
    assert args["target_session_attrs"] == "read-write"


def test_host_and_port_lists_pass_through_unchanged():
    args = _connect_args("postgresql://app@/outbox?host=a,b&port=1,2")
    assert (args["host"], args["port"]) == ("a,b", "1,2")


def test_a_socket_folder_host_is_left_alone():
    assert normalize_url("postgresql://u@/d?host=/tmp/s,/tmp/t") == "postgresql+psycopg://u@/d?host=/tmp/s,/tmp/t"


def test_the_ha_mode_is_taken_out_of_the_url_before_libpq_sees_it():
    url, mode = split_ha_mode(MULTI + "&atmostonce_ha=sync")
    assert mode == "sync"
    assert "atmostonce_ha" not in url
    assert _connect_args(url)["host"] == "10.0.0.1,10.0.0.2"
    assert split_ha_mode(MULTI) == (MULTI, None)


@pytest.mark.parametrize(
    "url",
    [
        MULTI + "&atmostonce_ha=maybe",
        MULTI + "&atmostonce_ha=sync&atmostonce_ha=async",
        "sqlite:///x.sqlite3?atmostonce_ha=sync",
    ],
)
def test_an_ha_mode_that_is_not_one_given_once_on_postgresql_is_bad_input(url):
    with pytest.raises(ValueError):
        split_ha_mode(url)


def test_an_sqlite_store_refuses_an_ha_mode(tmp_path):
    with pytest.raises(ValueError):
        open_store(f"sqlite:///{tmp_path / 'x.sqlite3'}", ha="sync")
    from atmostonce_sql import SqlStore

    with pytest.raises(ValueError):
        SqlStore(sa.create_engine(f"sqlite:///{tmp_path / 'y.sqlite3'}"), ha="sync")
