"""The store as an Airflow connection: :class:`FalkirkStoreHook` gives the operator, the API,
the maintenance DAG and the CLI one :class:`~falkirk.policies.store.StoreConfig`.

A connection of type ``falkirk_store`` holds the durable store, its credentials and the
scratch root::

    AIRFLOW_CONN_FALKIRK_DEFAULT='{"conn_type": "falkirk_store", "login": "KEY", "password": "SECRET",
        "extra": {"store_uri": "s3://lake/falkirk", "scratch_uri": "/mnt/scratch/falkirk",
                  "endpoint_url": "http://minio:9000", "region_name": "eu-west-1"}}'

An ``aws`` connection with the same extra fields works too. Without a connection named
``falkirk_default``, the ``FALKIRK_*`` and ``AWS_*`` environment variables are the store (the
embedded default, see :meth:`StoreConfig.from_env`).

>>> from airflow.sdk import Connection
>>> conn = Connection(conn_id="lake", conn_type="falkirk_store", login="key", password="secret",
...                   extra='{"store_uri": "s3://lake/falkirk", "scratch_uri": "/mnt/scratch", '
...                         '"endpoint_url": "http://127.0.0.1:9000"}')
>>> store = StoreConfig.from_env(store_env_from_connection(conn))
>>> store.durable_uri, store.scratch_uri, store.storage_options["AWS_ENDPOINT_URL"]
('s3://lake/falkirk', '/mnt/scratch', 'http://127.0.0.1:9000')
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.bases.hook import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from falkirk.policies.store import SCRATCH_ENV, STORE_ENV, StoreConfig, StoreError

DEFAULT_CONN_ID = "falkirk_default"
CONN_TYPE = "falkirk_store"


class FalkirkStoreHook(BaseHook):
    """The Falkirk store of connection ``conn_id`` (type ``falkirk_store`` or ``aws``).

    ``FalkirkStoreHook().get_store()`` is the store every part of a deployment uses: the
    connection ``falkirk_default`` when it is defined, else the environment variables. The
    connection form's fields are declared with the provider (:mod:`falkirk.plugins.provider_info`).
    """

    conn_name_attr = "conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "Falkirk store"

    def __init__(self, conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id

    def store_env(self) -> dict[str, str]:
        """The ``FALKIRK_*`` and ``AWS_*`` variables that give a job this store; empty when the
        default connection is not defined (the job then keeps its own environment)."""
        try:
            conn = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            if self.conn_id == DEFAULT_CONN_ID:
                return {}
            raise StoreError(f"connection {self.conn_id!r} is not defined: create it (type {CONN_TYPE!r}, extra "
                             f"store_uri and scratch_uri) or leave store_conn_id out to use {STORE_ENV}") from None
        return store_env_from_connection(conn)

    def get_store(self) -> StoreConfig:
        """The store: the connection's, or ``StoreConfig.from_env()`` without a default connection."""
        env = self.store_env()
        return StoreConfig.from_env(env) if env else StoreConfig.from_env()



def store_env_from_connection(conn: Any) -> dict[str, str]:
    """The store's environment variables (see :meth:`StoreConfig.from_env`) from an Airflow
    connection of type ``falkirk_store`` or ``aws``.

    >>> from airflow.sdk import Connection
    >>> conn = Connection(conn_id="store", conn_type="aws", login="key", password="secret",
    ...                   extra='{"endpoint_url": "http://127.0.0.1:9000", "store_uri": "s3://lake/falkirk"}')
    >>> sorted(store_env_from_connection(conn).items())  # doctest: +NORMALIZE_WHITESPACE
    [('AWS_ACCESS_KEY_ID', 'key'), ('AWS_ALLOW_HTTP', 'true'), ('AWS_ENDPOINT_URL', 'http://127.0.0.1:9000'),
     ('AWS_SECRET_ACCESS_KEY', 'secret'), ('FALKIRK_STORE_URI', 's3://lake/falkirk')]
    """
    if conn.conn_type not in (CONN_TYPE, "aws", "s3"):
        raise ValueError(f"connection {conn.conn_id!r}: type {conn.conn_type!r} cannot hold store credentials; "
                         f"use a {CONN_TYPE!r} or an 'aws' connection (login = access key id, password = secret key)")
    extra = conn.extra_dejson or {}
    env = {"AWS_ACCESS_KEY_ID": conn.login, "AWS_SECRET_ACCESS_KEY": conn.password,
           "AWS_REGION": extra.get("region_name"), "AWS_ENDPOINT_URL": extra.get("endpoint_url"),
           STORE_ENV: extra.get("store_uri"), SCRATCH_ENV: extra.get("scratch_uri")}
    if str(extra.get("endpoint_url", "")).startswith("http://"):
        env["AWS_ALLOW_HTTP"] = "true"
    return {k: str(v) for k, v in env.items() if v}
