"""Fixtures for the PostgreSQL HA cluster tests: a fresh etcd + two Patroni nodes on loopback per test
(atmostonce_sql.hacluster), and databases on it. Nothing in libpq, Patroni or PostgreSQL is mocked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from atmostonce_sql.hacluster import HaCluster


def create_database(ha: HaCluster, name: str) -> None:
    import psycopg

    with psycopg.connect(ha.node_dsn(ha.wait_primary()), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


@pytest.fixture
def ha_cluster() -> Iterator[HaCluster]:
    """Two nodes under Patroni's synchronous_mode, cluster-wide synchronous_commit = on."""
    with HaCluster(synchronous=True) as ha:
        yield ha
