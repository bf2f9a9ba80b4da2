"""Reading the project's Delta tables back in tests (through delta-rs, as the plugin does)."""

from __future__ import annotations

from deltalake import DeltaTable

from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import scan

DAG_ID = "falkirk_orders"
# table -> tier of the demo pipeline's regimes
TABLES = {
    "ingest/output": Tier.SCRATCH,
    "aggregate/output": Tier.DURABLE,
    "aggregate/state": Tier.DURABLE,
    "publish/output": Tier.DURABLE,
}


def table_rows(store: StoreConfig, name: str, dag_id: str = DAG_ID, tier: Tier | None = None) -> list[dict]:
    """Every row of the table ``name`` (``task/table``), in the demo pipeline's tier unless ``tier``."""
    task, table = name.split("/")
    uri = store.table_uri(tier or TABLES[name], dag_id, task, table)
    return scan(DeltaTable(uri, storage_options=store.options_for(uri))).to_pylist()


def snapshot(store: StoreConfig) -> dict[str, tuple[int, list[tuple]]]:
    """Every table's Delta version and exact content, the ledger included."""
    from tests.oracle import canonical

    uris = {name: store.table_uri(tier, DAG_ID, *name.split("/")) for name, tier in TABLES.items()}
    uris["ledger"] = store.ledger_uri
    out = {}
    for name, uri in uris.items():
        dt = DeltaTable(uri, storage_options=store.options_for(uri))
        out[name] = (dt.version(), canonical(scan(dt).to_pylist()))
    return out
