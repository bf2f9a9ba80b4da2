from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from falkirk.policies import (CommitKey, EpochTableError, Ledger, LedgerEntry, LedgerError, OutputRef, StoreConfig,
    StoreError, Tier, commit_epoch, read_epoch)
from falkirk.policies.store.commits import open_table, scan


def test_store_config_from_env(tmp_path: Path) -> None:
    store = StoreConfig.from_env({"FALKIRK_STORE_URI": str(tmp_path / "store")})
    assert store.scratch_uri == str(tmp_path / "scratch") and store.storage_options == {}
    s3 = StoreConfig.from_env({"FALKIRK_STORE_URI": "s3://b/p/", "FALKIRK_SCRATCH_URI": str(tmp_path),
                               "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_REGION": "x", "HOME": "/"})
    assert s3.durable_uri == "s3://b/p" and s3.storage_options == {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_REGION": "x"}
    assert s3.table_uri(Tier.DURABLE, "d", "t", "state") == "s3://b/p/d/t/state"
    assert s3.options_for(s3.table_uri(Tier.SCRATCH, "d", "t", "output")) is None
    assert StoreConfig.from_env(s3.env()) == s3


@pytest.mark.parametrize("env, message", [
    ({}, "FALKIRK_STORE_URI is not set"),
    ({"FALKIRK_STORE_URI": "s3://b"}, "FALKIRK_SCRATCH_URI is not set"),
    ({"FALKIRK_STORE_URI": "gs://b", "FALKIRK_SCRATCH_URI": "/tmp"}, "only local paths and s3:// URIs"),
])
def test_store_config_errors_name_the_setting(env: dict, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        StoreConfig.from_env(env)


def test_table_names_are_checked(tmp_path: Path) -> None:
    store = StoreConfig(str(tmp_path / "a"), str(tmp_path / "b"))
    with pytest.raises(StoreError, match="task_id='../x' cannot name a table"):
        store.table_uri(Tier.DURABLE, "d", "../x", "output")


def test_commit_epoch_replaces_one_epoch_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    first = commit_epoch(uri, pa.table({"epoch": [1, 1], "v": [1, 2]}), CommitKey(dag_id="d", task_id="t", epoch=1))
    second = commit_epoch(uri, pa.table({"epoch": [2], "v": [3]}), CommitKey(dag_id="d", task_id="t", epoch=2))
    again = commit_epoch(uri, pa.table({"epoch": [1], "v": [99]}), CommitKey(dag_id="d", task_id="t", epoch=1))
    assert (first.applied, second.applied, again.applied) == (True, True, False)
    assert (again.version, again.rows) == (1, 2)
    assert DeltaTable(uri).version() == 1
    assert read_epoch(uri, 1).column("v").to_pylist() == [1, 2]
    # A new incarnation (after a rollback) replaces exactly that epoch's rows, atomically.
    redo = commit_epoch(uri, pa.table({"epoch": [1], "v": [7]}), CommitKey(dag_id="d", task_id="t", epoch=1, incarnation=1))
    assert redo.applied and redo.version == 2
    assert sorted(scan(DeltaTable(uri)).column("v").to_pylist()) == [3, 7]


@pytest.mark.parametrize("rows, message", [
    (pa.table({"v": [1]}), "rows have no 'epoch' column"),
    (pa.table({"epoch": [1, 2], "v": [1, 2]}), "must be 1 in every row; found [1, 2]"),
    (pa.table({"epoch": ["1"], "v": [1]}), "it must be an integer type"),
])
def test_bad_rows_are_rejected_and_change_nothing(tmp_path: Path, rows: pa.Table, message: str) -> None:
    uri = str(tmp_path / "t")
    commit_epoch(uri, pa.table({"epoch": [1], "v": [5]}), CommitKey(dag_id="d", task_id="t", epoch=1, incarnation=0))
    with pytest.raises(EpochTableError) as err:
        commit_epoch(uri, rows, CommitKey(dag_id="d", task_id="t", epoch=1, incarnation=1))
    assert message in str(err.value)
    assert DeltaTable(uri).version() == 0 and read_epoch(uri, 1).column("v").to_pylist() == [5]


def test_ledger_appends_once_per_key_and_finds_checkpoints(tmp_path: Path) -> None:
    ledger = Ledger(StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch")))
    out = (OutputRef("output", "/x", "durable", 0, 3),)
    entries = [LedgerEntry(dag_id="d", task_id="agg", epoch=e, regime="eager_checkpoint", run_id=f"r{e}",
                           try_number=1, state_uri="/s", state_tier="durable", state_version=e, state_rows=2,
                           outputs=out) for e in (1, 2, 4)]
    assert [ledger.append(e) for e in entries] == [True, True, True]
    assert ledger.append(entries[1]) is False
    got = ledger.entries("d")
    assert got == entries and got[0].output_rows == 3 and got[0].frontier == {"through": 1}
    assert ledger.latest("d", "agg", before_epoch=4) == entries[1]
    assert ledger.latest("d", "agg", before_epoch=1) is None
    assert ledger.find("d", "agg", 4) == entries[2] and ledger.find("d", "agg", 3) is None
    assert ledger.entries("other") == []


@pytest.mark.parametrize("kwargs, message", [
    ({"regime": "eager"}, "ledger entry: regime: unknown regime 'eager'"),
    ({"epoch": -1}, "epoch=-1 must be a whole number >= 0"),
    ({"run_id": ""}, "run_id is empty"),
])
def test_malformed_ledger_entries_are_refused(kwargs: dict, message: str) -> None:
    base = dict(dag_id="d", task_id="t", epoch=1, regime="batch", run_id="r", try_number=1)
    with pytest.raises(LedgerError, match=message):
        LedgerEntry(**{**base, **kwargs})


def test_reading_tables_never_aborts_the_process_at_exit(tmp_path: Path) -> None:
    """pyarrow's dataset scanner aborted about half of such processes at exit; reads must not."""
    import subprocess
    import sys

    store = StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch"))
    Ledger(store).append(LedgerEntry(dag_id="d", task_id="t", epoch=1, regime="batch", run_id="r", try_number=1))
    commit_epoch(str(tmp_path / "t"), pa.table({"epoch": [1] * 50, "v": list(range(50))}), CommitKey(dag_id="d", task_id="t", epoch=1))
    code = (
        "import sys; from falkirk.policies import Ledger, StoreConfig, read_epoch\n"
        f"assert len(Ledger(StoreConfig({store.durable_uri!r}, {store.scratch_uri!r})).entries('d')) == 1\n"
        f"assert read_epoch({str(tmp_path / 't')!r}, 1).num_rows == 50\n"
    )
    codes = [subprocess.run([sys.executable, "-c", code], capture_output=True).returncode for _ in range(6)]
    assert codes == [0] * 6


def test_reads_return_plain_arrow_types(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    commit_epoch(uri, pa.table({"epoch": [1], "s": ["x"], "b": [b"y"]}), CommitKey(dag_id="d", task_id="t", epoch=1))
    assert read_epoch(uri, 1).schema.types == [pa.int64(), pa.string(), pa.binary()]


def test_the_ledger_compacts_itself_and_stays_idempotent(tmp_path: Path, monkeypatch) -> None:
    import falkirk.policies.store.ledger as ledger_module

    monkeypatch.setattr(ledger_module, "COMPACT_EVERY", 4)
    ledger = Ledger(StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch")))
    for epoch in range(1, 8):
        assert ledger.append(LedgerEntry(dag_id="d", task_id="a", epoch=epoch, regime="batch", run_id=f"epoch-{epoch}", try_number=1))
    table = DeltaTable(ledger.uri)
    # appends are versions 0-4 and 6-7; the append of version 4 compacted its 5 files (version 5)
    assert table.version() == 7 and len(table.file_uris()) == 3
    assert [h["operation"] for h in table.history() if h["version"] == 5] == ["OPTIMIZE"]
    assert [e.epoch for e in ledger.entries("d")] == list(range(1, 8))
    assert not ledger.append(LedgerEntry(dag_id="d", task_id="a", epoch=2, regime="batch", run_id="epoch-2", try_number=1))  # still recorded once


def test_the_ledger_checkpoints_its_log_so_an_open_reads_at_most_five_commit_files(tmp_path: Path) -> None:
    ledger = Ledger(StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch")))
    for epoch in range(1, 24):
        assert ledger.append(LedgerEntry(dag_id="d", task_id="a", epoch=epoch, regime="batch", run_id=f"epoch-{epoch}", try_number=1))
    log = Path(ledger.uri) / "_delta_log"
    table = DeltaTable(ledger.uri)
    assert table.metadata().configuration == {"delta.checkpointInterval": "5"}
    checkpoints = sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet"))
    assert checkpoints == [v for v in range(table.version() + 1) if v % 5 == 4]
    assert table.version() - checkpoints[-1] <= 5
    assert [e.epoch for e in ledger.entries("d")] == list(range(1, 24))


def test_a_ledger_append_that_loses_the_commit_race_is_retried_once_applied(tmp_path: Path, monkeypatch) -> None:
    """Two tasks create the ledger at the same moment: the loser's commit fails (injected
    here, after the winner's real commit) and its retry appends its row, exactly once."""
    from deltalake.exceptions import CommitFailedError

    import falkirk.policies.store.commits as tables

    ledger = Ledger(StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch")))
    winner = LedgerEntry(dag_id="d", task_id="a", epoch=1, regime="ephemeral", run_id="epoch-1", try_number=1)
    loser = LedgerEntry(dag_id="d", task_id="b", epoch=1, regime="ephemeral", run_id="epoch-1", try_number=1)
    real = tables.write_deltalake
    calls = []

    def race(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            monkeypatch.setattr(tables, "write_deltalake", real)
            ledger.append(winner)  # the other task gets there first
            raise CommitFailedError("Failed to commit transaction: Metadata changed since last commit.")
        return real(*args, **kwargs)

    monkeypatch.setattr(tables, "write_deltalake", race)
    assert ledger.append(loser) is True
    assert [(e.task_id, e.epoch) for e in ledger.entries("d")] == [("a", 1), ("b", 1)]
    assert ledger.append(loser) is False and len(ledger.entries("d")) == 2


def test_the_dag_version_of_a_snapshot_equals_the_ledgers_whatever_the_other_dags_do(tmp_path: Path) -> None:
    """Plans record ``Ledger.dag_version`` and the API compares it with ``LedgerSnapshot.dag_version``:
    the two count the same rows (the DAG's ledger rows and its rollbacks), however commits,
    re-runs and rollbacks of this DAG and another interleave."""
    import random

    from falkirk.policies.store.ledger import LedgerSnapshot

    ledger = Ledger(StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch")))
    rng = random.Random(35)
    rows: dict[str, list[LedgerEntry]] = {"a": [], "b": []}
    seen, rollbacks = [], 0
    for step in range(12):
        dag = rng.choice("ab")
        if rows[dag] and rng.random() < 0.3:
            rollbacks += ledger.invalidations.record(rng.sample(rows[dag], 1), f"plan-{step}")
        else:
            entry = LedgerEntry(dag_id=dag, task_id=rng.choice(["t", "u"]), epoch=step, regime="ephemeral", run_id=f"r{step}", try_number=1)
            ledger.append(entry)
            rows[dag].append(entry)
        versions = {d: (ledger.dag_version(d), LedgerSnapshot(ledger, d).dag_version) for d in "ab"}
        assert all(mine == snapped for mine, snapped in versions.values()), (step, versions)
        seen.append(versions["a"][0])
    assert rollbacks > 0 and seen == sorted(seen) and seen[-1] > 0  # rollbacks happened; it only grows


@pytest.mark.parametrize("seed", range(6))
def test_a_refreshed_snapshot_equals_a_fresh_one_and_reads_only_the_new_commits(tmp_path: Path, seed: int) -> None:
    """A held snapshot brought forward by ``refresh`` holds exactly what a snapshot read afresh
    holds, through appends of this DAG and another, rollbacks, compactions and a rewrite of the
    ledger; it scans a table again only after the rewrite (the change feed shows a delete)."""
    import random

    from falkirk.policies.store.commits import open_table
    from falkirk.policies.store.ledger import LedgerSnapshot

    ledger = Ledger(StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch")))
    rng = random.Random(seed)
    other = LedgerEntry(dag_id="b", task_id="t", epoch=0, regime="ephemeral", run_id="r0", try_number=1)
    ledger.append(other), ledger.invalidations.record([other], "plan-0")  # both tables exist
    held = LedgerSnapshot(ledger, "a")
    mine: list[LedgerEntry] = []
    rewrites = 0
    for step in range(40):
        roll = rng.random()
        if roll < 0.55:
            dag = rng.choice("ab")
            entry = LedgerEntry(dag_id=dag, task_id=rng.choice(["t", "u"]), epoch=step, regime="ephemeral", run_id=f"r{step}", try_number=1)
            ledger.append(entry)
            mine += [entry] if dag == "a" else []
        elif roll < 0.75 and mine:
            ledger.invalidations.record(rng.sample(mine, 1), f"plan-{step}")
        elif roll < 0.9:
            ledger.compact()
        elif mine and rewrites == 0:
            gone = mine.pop(0)  # not something the package does: the snapshot must notice and read afresh
            open_table(ledger.uri).delete(f"dag_id = 'a' AND epoch = {gone.epoch}")
            rewrites += 1
        held.refresh()
        fresh = LedgerSnapshot(ledger, "a")
        assert [e.key for e in held.entries()] == [e.key for e in fresh.entries()], step
        assert (held.gone, held.dag_version, held.rollbacks_version) == (
            fresh.gone, fresh.dag_version, fresh.rollbacks_version), step
    assert rewrites and (held.scans, held.refreshes) == (2 + rewrites, 40)  # one scan per table, one per rewrite


def _compact_at(uri: str, barrier) -> None:  # noqa: ANN001 - run in a spawned process
    from falkirk.policies.store.commits import compact

    barrier.wait()
    compact(uri)


def test_compactions_racing_on_one_table_never_duplicate_its_rows(tmp_path: Path) -> None:
    """Four processes compact the ledger at once, three times over, with appends between. delta-rs
    would commit every one of them (a rewrite that changes no data conflicts with nothing), each
    adding the rows of the files it rewrote again; the claim lets one through per race."""
    import multiprocessing

    ledger = Ledger(StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch")))
    spawn = multiprocessing.get_context("spawn")  # delta-rs's runtime does not survive a fork
    for race in range(3):
        for epoch in range(race * 15, race * 15 + 15):
            ledger.append(LedgerEntry(dag_id="d", task_id="t", epoch=epoch + 1, regime="ephemeral", run_id=f"r{epoch}", try_number=1))
        barrier = spawn.Barrier(4)
        racers = [spawn.Process(target=_compact_at, args=(ledger.uri, barrier)) for _ in range(4)]
        for p in racers:
            p.start()
        for p in racers:
            p.join(120)
            assert p.exitcode == 0
        table = open_table(ledger.uri)
        rows = scan(table).to_pylist()
        assert sorted(r["epoch"] for r in rows) == list(range(1, race * 15 + 16)), f"race {race}"
        assert sum(h["operation"] == "OPTIMIZE" for h in table.history()) >= race + 1


def test_a_compaction_that_claims_the_table_after_another_one_ended_reads_it_under_its_claim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One compactor looks at the table; before it claims it, another compacts the table to its
    end and releases it. The first then claims it and must rewrite the table as it is now: the
    five files it saw are gone, and rewriting them again would add their rows twice."""
    from falkirk.policies.store import commits

    ledger = Ledger(StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch")))
    for epoch in range(1, 6):
        ledger.append(LedgerEntry(dag_id="d", task_id="t", epoch=epoch, regime="ephemeral", run_id=f"r{epoch}", try_number=1))
    claim = commits._claim_compaction

    def after_another_compaction(uri: str, options: dict | None) -> str | None:
        monkeypatch.setattr(commits, "_claim_compaction", claim)
        assert commits.compact(uri, options) == 5  # the other compactor, start to end
        return claim(uri, options)

    monkeypatch.setattr(commits, "_claim_compaction", after_another_compaction)
    commits.compact(ledger.uri)
    assert sorted(r["epoch"] for r in scan(open_table(ledger.uri)).to_pylist()) == [1, 2, 3, 4, 5]


def test_a_compaction_claim_left_by_a_dead_compactor_expires(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from falkirk.policies.store import commits

    ledger = Ledger(StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch")))
    for epoch in range(1, 6):
        ledger.append(LedgerEntry(dag_id="d", task_id="t", epoch=epoch, regime="ephemeral", run_id=f"r{epoch}", try_number=1))
    assert commits._claim_compaction(ledger.uri, None) is not None  # and never released: it died
    assert ledger.compact() == 0  # held
    monkeypatch.setattr(commits, "COMPACTION_CLAIM_SECONDS", 0.0)
    assert ledger.compact() == 5  # expired: taken over
    assert len(open_table(ledger.uri).to_pyarrow_table()) == 5


def test_a_rows_delta_sources_are_kept_beside_its_inputs_and_read_back(tmp_path: Path) -> None:
    """The sources an epoch read (``read_delta``) go into the ``inputs`` column after the task's
    own inputs and its Asset inputs, and come back as they were, none of them taken for another."""
    from falkirk.policies.store.ledger import AssetInput, DeltaSource, InputRef

    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    entry = LedgerEntry(dag_id="crm", task_id="customers", epoch=3, regime="batch", run_id="r3", try_number=1,
                        inputs=(InputRef(task_id="orders", output="output", through=3),),
                        asset_inputs=(AssetInput(asset="a", dag_id="up", task_id="t", output="output", epoch=3),),
                        sources=(DeltaSource(uri="s3://crm/customers", version=2),
                                 DeltaSource(uri="/data/prices", version=7)))
    Ledger(store).append(entry)
    [back] = Ledger(store).entries("crm")
    assert (back.inputs, back.asset_inputs, back.sources) == (entry.inputs, entry.asset_inputs, entry.sources)
    assert '{"source": "s3://crm/customers", "version": 2}' in entry.to_row()["inputs"]
    assert "sources" not in entry.to_row()
