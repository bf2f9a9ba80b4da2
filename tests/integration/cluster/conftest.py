"""The servers the distributed shape's tests share: PostgreSQL (the session's), Redis,
``moto_server``, a Spark standalone cluster and the Spark Connect server on it, started once
for this package and stopped after its last test. Each module starts its own Airflow with its
own Celery workers, databases, Redis database, bucket and worker disks on them
(:class:`devstack.cluster.Cluster` with ``servers=``): a test kills its workers, never these."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.cluster import ClusterServers


@pytest.fixture(scope="package")
def cluster_servers(tmp_path_factory: pytest.TempPathFactory, postgres) -> Iterator[ClusterServers]:  # noqa: ANN001
    with ClusterServers(tmp_path_factory.mktemp("cluster-servers"), postgres=postgres) as servers:
        yield servers
