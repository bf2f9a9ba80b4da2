"""Process pairs' layout (policies/pairs.py) on the fixture of the Flux scenarios: chained
placement of G1 (sessionize) and G2 (statistics), 4 partitions each, on w0..w3 with the spare
w4; then a property test of every transition against an oracle that recomputes the answers
from the history of events alone, and one of the failure detector's bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falkirk.policies.ids import ReplicaId
from falkirk.policies.liveness import Heartbeats
from falkirk.policies.pairs import Layout, PairsError, Status, catch_up_order, chained

WORKERS = ["w0", "w1", "w2", "w3"]
FIXTURE = {"G1": 4, "G2": 4}


def dead(layout: Layout) -> set[str]:
    return {r.name for r in layout.replicas if r.status is Status.DEAD}


def test_s1_one_worker_lost_takes_over_without_touching_other_partitions_and_catches_up_bottom_up() -> None:
    layout = chained(FIXTURE, WORKERS)
    assert {r.name for r in layout.on("w1")} == {"G1[1].A", "G2[1].A", "G1[0].B", "G2[0].B"}
    after = layout.fail("w1")
    assert dead(after) == {"G1[1].A", "G2[1].A", "G1[0].B", "G2[0].B"}
    # consumers G2.A{0,2,3} read producer partition 1 from G1.B1; G2.B{1,2,3} read partition 0 from G1.A0
    assert {c: after.source("G2", c, "A", "G1", 1) for c in (0, 2, 3)} == {0: "B", 2: "B", 3: "B"}
    assert {c: after.source("G2", c, "B", "G1", 0) for c in (1, 2, 3)} == {1: "A", 2: "A", 3: "A"}
    # everyone else keeps reading its own replica id
    assert after.source("G2", 2, "A", "G1", 2) == "A" and after.source("G2", 3, "B", "G1", 3) == "B"
    # partitions 2 and 3 of both levels: untouched, same records as before
    untouched = [r for r in layout.replicas if r.partition in (2, 3)]
    assert [after.replica(r.task, r.partition, r.replica) for r in untouched] == untouched
    assert after.lost_partitions() == []
    # catch-up onto w4, bottom-up: G1 p0 and p1 first, then G2 p0 and p1
    assert catch_up_order(after, ["G1", "G2"]) == [("G1", 0), ("G1", 1), ("G2", 0), ("G2", 1)]
    survivors = after.advance("G2", 1, "B", 1, 0)  # G2.B1 committed epoch 1: (http,a) cnt 2, sum 8, max 5
    standby = survivors.register("G2", 1, "w4").replica("G2", 1, "A")
    assert (standby.worker, standby.status, standby.version, standby.generation) == ("w4", Status.STDBY, 1, 2)


def test_s2_each_quartet_configuration_keeps_one_source_per_partition() -> None:
    layout = chained(FIXTURE, WORKERS)
    cases = {"A": [("G2", 0, "B")], "B": [("G1", 0, "B")], "C": [("G1", 0, "B"), ("G2", 0, "B")],
             "D": [("G1", 0, "B"), ("G2", 1, "A")]}
    for case, killed in cases.items():
        after = layout
        for r in killed:
            after = after.fail_replica(*r)
        assert after.lost_partitions() == [], case
        if case in ("B", "D"):  # consumers whose own producer 0 died read it from G1.A0
            assert {after.source("G2", c, "B", "G1", 0) for c in range(4)} == {"A"}, case
        # garbage collection no longer waits on a dead consumer replica
        if case in ("A", "C"):
            assert after.advance("G2", 0, "A", 2, 0).gc_floor("G2", 0) == 2, case


def test_s5_a_zombie_commit_is_fenced_and_never_revives_its_replica() -> None:
    layout = chained(FIXTURE, WORKERS)
    old = layout.replica("G1", 1, "A")
    after = layout.fail_replica("G1", 1, "A")  # declared dead by heartbeat while still running
    assert not after.admits(old, old.generation)
    assert after.advance("G1", 1, "A", 2, old.generation) == after  # its late commit changes nothing
    replaced = after.register("G1", 1, "w4")
    assert not replaced.admits(old, old.generation)  # nor once its replacement is registered
    assert replaced.replica("G1", 1, "A").status is Status.STDBY


def test_s6_a_failure_during_catch_up_discards_the_standby_and_retries_elsewhere() -> None:
    layout = chained(FIXTURE, WORKERS).fail("w1").advance("G1", 1, "B", 2, 0)
    pinned = layout.register("G1", 1, "w4")
    assert pinned.gc_floor("G1", 1) == 2
    lost = pinned.discard("G1", 1)
    r = lost.replica("G1", 1, "A")
    assert (r.status, r.generation) == (Status.DEAD, 3) and lost.gc_floor("G1", 1) == 2
    with pytest.raises(PairsError, match="w1 was lost"):
        lost.register("G1", 1, "w1")
    retried = lost.register("G1", 1, "w5").replica("G1", 1, "A")
    assert (retried.worker, retried.status, retried.generation) == ("w5", Status.STDBY, 4)


def test_a_new_machine_under_a_lost_workers_name_is_a_spare_once_named_replaced() -> None:
    """Two workers, one lost and replaced under its name: without ``replaced`` no spare is left
    (the survivor's worker holds the twin); with it the standby goes there, and the old
    incarnation's late commits stay fenced."""
    layout = chained({"t": 2}, ["w0", "w1"])
    old = layout.replica("t", 1, "A")
    assert old.worker == "w1"
    after = layout.fail("w1")
    with pytest.raises(PairsError, match="--spare w1 --replaced"):
        after.register("t", 1, "w1")
    with pytest.raises(PairsError, match="holds its survivor"):
        after.register("t", 1, "w0", replaced=True)
    back = after.register("t", 1, "w1", replaced=True)
    standby = back.replica("t", 1, "A")
    assert (standby.worker, standby.status, standby.generation) == ("w1", Status.STDBY, 2)
    assert not back.admits(old, old.generation) and back.admits(standby, 2)
    assert back.advance("t", 1, "A", 5, old.generation) == back


def test_s7_both_replicas_lost_is_named_and_never_read_from() -> None:
    layout = chained(FIXTURE, WORKERS).fail("w1").fail("w2")
    assert layout.lost_partitions() == [("G1", 1), ("G2", 1)]
    assert layout.source("G2", 0, "A", "G1", 1) is None
    with pytest.raises(PairsError, match="lost both replicas: no survivor to copy from; restore it on the durable"):
        layout.register("G1", 1, "w4")


def test_s8_a_standby_pins_collection_until_it_catches_up_and_folds_in_only_then() -> None:
    layout = chained(FIXTURE, WORKERS).fail("w1").advance("G2", 1, "B", 1, 0)
    standby = layout.register("G2", 1, "w4")  # copied state@1 of the survivor
    survivor = standby.advance("G2", 1, "B", 2, 0)  # the survivor commits epoch 2 meanwhile
    assert survivor.gc_floor("G2", 1) == 1  # epoch 2's input stays until the standby consumed it
    with pytest.raises(PairsError, match="replay epochs 2..2 first"):
        survivor.fold_in("G2", 1)
    caught = survivor.advance("G2", 1, "A", 2, 2)
    assert caught.gc_floor("G2", 1) == 2
    assert caught.fold_in("G2", 1).replica("G2", 1, "A").status is Status.ACTIVE


def test_bad_layout_changes_are_refused_naming_the_fix() -> None:
    layout = chained(FIXTURE, WORKERS)
    with pytest.raises(PairsError, match="worker 'w9' holds no live replica"):
        layout.fail("w9")
    with pytest.raises(PairsError, match="a catch-up needs exactly one dead replica"):
        layout.register("G1", 0, "w4")
    with pytest.raises(PairsError, match="holds its survivor"):
        layout.fail_replica("G1", 0, "A").register("G1", 0, "w1")
    with pytest.raises(PairsError, match="name each worker once"):
        chained(FIXTURE, ["w0", "w0"])


# -- the property test ----------------------------------------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["fail", "fail_replica", "register", "advance", "fold_in", "discard"]),
                         st.integers(0, 3), st.integers(0, 1), st.integers(0, 5)), max_size=25)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_every_transition_keeps_the_pairs_invariants(ops) -> None:
    """Random take-overs, catch-ups, commits, fold-ins and failed catch-ups. After each step:
    generations never go down; a replica comes back only through a standby of a higher
    generation; a partition with an active replica gives every consumer an active source, its
    own replica id first (the oracle); two live replicas of a pair never share a worker;
    garbage collection never releases what a live replica has not consumed."""
    layout = chained({"G1": 2, "G2": 2}, ["w0", "w1", "w2"])
    spares = iter(f"s{i}" for i in range(100))
    for op, p, ri, v in ops:
        task, replica = ("G1", "G2")[p % 2], ReplicaId.NAMES[ri]
        partition = p // 2
        before = layout
        try:
            if op == "fail":
                live = sorted({r.worker for r in layout.replicas if r.status is not Status.DEAD})
                layout = layout.fail(live[p % len(live)]) if live else layout
            elif op == "fail_replica":
                layout = layout.fail_replica(task, partition, replica)
            elif op == "register":
                layout = layout.register(task, partition, next(spares))
            elif op == "advance":
                r = layout.replica(task, partition, replica)
                layout = layout.advance(task, partition, replica, r.version + v, r.generation)
            elif op == "fold_in":
                layout = layout.fold_in(task, partition)
            else:
                layout = layout.discard(task, partition)
        except PairsError:
            assert layout == before  # a refused change changes nothing
        for old, new in zip(before.replicas, layout.replicas):
            assert new.generation >= old.generation
            if old.status is Status.DEAD and new.status is not Status.DEAD:
                assert new.status is Status.STDBY and new.generation > old.generation
        for t, q in {(r.task, r.partition) for r in layout.replicas}:
            a, b = layout.pair(t, q)
            if a.status is not Status.DEAD and b.status is not Status.DEAD:
                assert a.worker != b.worker
            assert layout.gc_floor(t, q) <= min([r.version for r in (a, b) if r.status is not Status.DEAD],
                                                default=0)
            for consumer in ("A", "B"):
                active = [r.replica for r in (a, b) if r.status is Status.ACTIVE]
                expected = consumer if consumer in active else (active[0] if active else None)
                assert layout.source("G2", 0, consumer, t, q) == expected
        assert set(layout.lost_partitions()) == {
            (t, q) for t, q in {(r.task, r.partition) for r in layout.replicas}
            if all(r.status is not Status.ACTIVE for r in layout.pair(t, q))}


# -- the layout table ------------------------------------------------------------------------


def _layouts(tmp_path):
    from falkirk.policies.store import StoreConfig
    from falkirk.policies.store.control import PairLayouts

    return PairLayouts(StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch")))


def test_the_layout_table_keeps_s1s_history_and_reads_back_every_step(tmp_path) -> None:
    """S1's layout transitions, each saved as what changed and read back whole: the take-over,
    the survivor's commits, the standby on the spare, its catch-up and fold-in."""
    table = _layouts(tmp_path)
    assert table.load("pairs") is None
    steps = [chained(FIXTURE, WORKERS)]
    steps.append(steps[-1].fail("w1"))
    steps.append(steps[-1].advance("G1", 1, "B", 2, 0).advance("G2", 1, "B", 2, 0))
    steps.append(steps[-1].register("G1", 1, "w4"))
    steps.append(steps[-1].fold_in("G1", 1))
    written = [table.save("pairs", steps[0])]
    for before, after in zip(steps, steps[1:]):
        written.append(table.save("pairs", after, before=before))
        assert table.load("pairs") == after
    assert written == [16, 4, 2, 1, 1]
    assert table.load("other-dag") is None


def test_the_layout_table_is_compacted_every_fifth_version_and_reads_back_the_same(tmp_path) -> None:
    from deltalake import DeltaTable

    table = _layouts(tmp_path)
    layout = chained({"t": 2}, ["w0", "w1", "w2", "w3"])
    table.save("d", layout)
    for epoch in range(1, 7):  # versions 1-6; the save of version 5 compacts
        after = layout.advance("t", 0, "A", epoch, 0)
        table.save("d", after, before=layout)
        layout = after
    history_before = table.history("d")
    delta = DeltaTable(table.uri)
    assert [h["operation"] for h in delta.history() if h["version"] == 6] == ["OPTIMIZE"]
    assert delta.version() == 7 and len(delta.file_uris()) == 2  # the compacted file and version 7's
    assert table.load("d") == layout and table.history("d") == history_before


def test_the_same_take_over_twice_is_recorded_once_and_a_take_over_beats_a_concurrent_fold_in(tmp_path) -> None:
    table = _layouts(tmp_path)
    start = chained({"t": 2}, ["w0", "w1", "w2"])
    table.save("d", start)
    # two detectors notice w1 gone from the same read: one record
    assert table.save("d", start.fail("w1"), before=start) == 2
    assert table.save("d", start.fail("w1"), before=start) == 0
    taken = start.fail("w1")
    standby = taken.register("t", 0, "w3")
    table.save("d", standby, before=taken)
    # from the same read, one process folds the standby in (it caught up) while a detector declares
    # its spare lost: every reader resolves it to the take-over
    caught = standby.advance("t", 0, "B", 0, 2)
    table.save("d", caught.fold_in("t", 0), before=caught)
    table.save("d", standby.fail("w3"), before=standby)
    r = table.load("d").replica("t", 0, "B")
    assert (r.worker, r.status, r.generation) == ("w3", Status.DEAD, 3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["w0", "w1", "w2"]), st.integers(0, 40)), max_size=40),
       st.integers(1, 10), st.integers(1, 5))
def test_a_worker_is_declared_lost_once_per_silence_that_exceeds_the_timeout(beats, timeout, poll) -> None:
    """Polled every ``poll`` seconds, a worker is declared lost at the first poll after its last
    answer plus ``timeout``, never before, and once per silence: answering again (a new machine
    under its name), it can be declared lost again."""
    heard = Heartbeats(["w0", "w1", "w2"], timeout=timeout, started=0)
    last = {"w0": 0, "w1": 0, "w2": 0}
    down: set[str] = set()
    answers = sorted(beats, key=lambda b: b[1])
    for now in range(0, 60, poll):
        ready = [w for w, at in answers if at <= now and at > now - poll]
        heard.heard(ready, now)
        for w in ready:
            last[w] = now
            down.discard(w)
        for w in heard.lost(now):
            assert w not in down  # once per silence
            assert timeout < now - last[w] <= timeout + poll  # at the first poll past the timeout
            down.add(w)
    final = list(range(0, 60, poll))[-1]
    for w in set(last) - down:
        assert final - last[w] <= timeout


def test_a_catch_up_copies_only_the_epochs_garbage_collection_left_of_the_survivor(tmp_path) -> None:
    """Collection may go past a dead replica's last epoch before the catch-up registers its standby
    (a replica its twin took over holds nothing back): the standby gets the survivor's epochs that
    are left, its state at the latest among them, and no read of a deleted epoch."""
    import pyarrow as pa

    from falkirk.plugins.pairs import _install
    from falkirk.policies.planning.collector import _delete_epochs
    from falkirk.policies.regimes import Tier
    from falkirk.policies.store import StoreConfig
    from falkirk.policies.store.commits import CommitKey, commit_epoch, read_epoch
    from falkirk.policies.store.control import Collections
    from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot, OutputRef

    store = StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch"))
    ledger = Ledger(store)
    survivor, dead = 1, 0  # partition 0: replica B survives, A (map index 0) died after epoch 2

    def checkpoint(index: int, epoch: int) -> None:
        key = CommitKey(dag_id="d", task_id="t", epoch=epoch, map_index=index, incarnation=0)
        uris = {name: store.table_uri(Tier.DURABLE, "d", "t", name, index) for name in ("output", "state")}
        rows = {name: pa.table({"epoch": [epoch], "v": [epoch * 10 + (name == "state")]}) for name in uris}
        done = {name: commit_epoch(uri, rows[name], key) for name, uri in uris.items()}
        ledger.append(LedgerEntry(dag_id="d", task_id="t", epoch=epoch, regime="process_pairs", run_id=f"epoch-{epoch}", try_number=1, map_index=index,
                                  state_uri=uris["state"], state_tier="durable", state_version=done["state"].version,
                                  state_rows=1, outputs=(OutputRef("output", uris["output"], "durable",
                                                                   done["output"].version, 1),)))

    for epoch in range(1, 7):
        checkpoint(survivor, epoch)
        if epoch <= 2:
            checkpoint(dead, epoch)
    Collections(store).mark("d", {"t[1]": 4})  # as the collector does: marks first, then the files
    for name in ("output", "state"):
        _delete_epochs(store, store.table_uri(Tier.DURABLE, "d", "t", name, survivor), (1, 2, 3, 4), 0)

    record = _install(store, LedgerSnapshot(ledger, "d"), "d", "t", 0, "B", "A")

    assert (record["epoch"], record["epochs"]) == (6, [5, 6])
    standby = {name: store.table_uri(Tier.DURABLE, "d", "t", name, dead) for name in ("output", "state")}
    assert [read_epoch(standby["state"], e).column("v").to_pylist() for e in (5, 6)] == [[51], [61]]
    assert [read_epoch(standby["output"], e).column("v").to_pylist() for e in (2, 5, 6)] == [[20], [50], [60]]
    assert sorted(e.epoch for e in ledger.entries("d") if e.map_index == dead) == [1, 2, 5, 6]


def test_a_catch_up_of_a_final_replica_names_the_sink_its_twin_wrote_and_copies_only_its_tables(tmp_path) -> None:
    """A final task's rows name the partition's egress table (``sink``, written once for both
    replicas, accepted at the commit): the standby's copied rows name that same table, which is
    not copied (the soak met ``falkirk pairs --catch-up`` failing on it as a table to copy)."""
    import pyarrow as pa

    from falkirk.plugins.pairs import _install
    from falkirk.policies.regimes import Tier
    from falkirk.policies.store import StoreConfig
    from falkirk.policies.store.commits import CommitKey, commit_epoch, read_epoch
    from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot, OutputRef, external_uri
    from falkirk.spark_jobs.pairs import sink_uri

    store = StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch"))
    ledger = Ledger(store)
    sink = sink_uri(store, "d", "stats", 0)
    for epoch in (1, 2):  # replica B (map index 1) committed; A died before epoch 1
        key = CommitKey(dag_id="d", task_id="stats", epoch=epoch, map_index=1, incarnation=0)
        out = commit_epoch(store.table_uri(Tier.DURABLE, "d", "stats", "output", 1),
                           pa.table({"epoch": [epoch], "v": [epoch]}), key)
        commit_epoch(sink, pa.table({"epoch": [epoch], "sn": [epoch * 10]}), CommitKey(dag_id="d", task_id="stats/sink", epoch=epoch, map_index=0, incarnation=0))
        ledger.append(LedgerEntry(dag_id="d", task_id="stats", epoch=epoch, regime="process_pairs", run_id=f"epoch-{epoch}", try_number=1, map_index=1,
                                  outputs=(OutputRef("output", out.uri, "durable", out.version, 1),
                                           OutputRef("sink", external_uri(sink), "external", 0, 1))))

    record = _install(store, LedgerSnapshot(ledger, "d"), "d", "stats", 0, "B", "A")

    assert record["epochs"] == [1, 2]
    copied = sorted((e for e in ledger.entries("d") if e.map_index == 0), key=lambda e: e.epoch)
    assert [[(o.name, o.uri, o.tier) for o in e.outputs] for e in copied] == [
        [("output", store.table_uri(Tier.DURABLE, "d", "stats", "output", 0), "durable"),
         ("sink", external_uri(sink), "external")]] * 2
    assert [read_epoch(sink, e).column("sn").to_pylist() for e in (1, 2)] == [[10], [20]]  # as written, once


def test_replaced_without_a_catch_up_spare_is_refused_before_anything_is_read(capsys, monkeypatch) -> None:  # noqa: ANN001
    from falkirk.plugins.cli import EXIT_INVALID, main

    monkeypatch.setenv("FALKIRK_STORE_URI", "/nonexistent/store")  # never reached
    assert main(["pairs", "--dag", "falkirk_pairs", "--replaced"]) == EXIT_INVALID
    assert main(["pairs", "--dag", "falkirk_pairs", "--catch-up", "--replaced"]) == EXIT_INVALID
    assert "use it with --catch-up --spare WORKER" in capsys.readouterr().err


def test_the_durable_path_restores_on_the_workers_never_lost_else_on_every_name() -> None:
    """Both workers of two lost one after the other: no live worker is left, so the partitions
    are restored on both names (new machines took them), never refused."""
    from falkirk.policies.pairs import restore_workers

    layout = chained({"t": 2}, ["w0", "w1"])
    assert restore_workers(layout, ["w0", "w1"]) == ["w0", "w1"]
    one = layout.fail("w1")
    assert restore_workers(one, ["w0", "w1"]) == ["w0"]
    both = one.fail("w0")
    assert both.lost_partitions() == [("t", 0), ("t", 1)]
    workers = restore_workers(both, ["w0", "w1"])
    assert workers == ["w0", "w1"]
    restored = both.restore("t", 0, workers).restore("t", 1, workers)
    assert [(r.name, r.worker, r.status) for r in restored.replicas] == [
        ("t[0].A", "w0", Status.ACTIVE), ("t[0].B", "w1", Status.ACTIVE),
        ("t[1].A", "w1", Status.ACTIVE), ("t[1].B", "w0", Status.ACTIVE)]


def test_a_readers_chain_counts_a_read_of_the_twin_on_both_replicas_edges() -> None:
    """stats[0] (replica A) reads sessions' partition 0 from replica A, from B while A is taken
    over (epoch 3), then from A again once it is caught up: on both edges its M̄ grows epoch by
    epoch, rather than shrinking at the switch (which made every later collection refuse the
    ledger); a partitioned task that is not paired keeps one edge per partition."""
    from falkirk.policies.planning.chains import TaskGraph, chains_from_ledger
    from falkirk.policies.rollback.metadata import MetadataError
    from falkirk.policies.rollback.times import EPOCH
    from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef

    def rows(regime: str, read: dict[int, int]) -> list[LedgerEntry]:
        out = [LedgerEntry(dag_id="d", task_id="sessions", epoch=e, regime=regime, run_id=f"epoch-{e}", try_number=1, map_index=i, notified_through=e,
                           outputs=(OutputRef("output", f"/s/sessions/{i}", "durable", e, 1, e),))
               for e in range(1, 5) for i in (0, 1)]
        return out + [LedgerEntry(dag_id="d", task_id="stats", epoch=e, regime=regime, run_id=f"epoch-{e}", try_number=1, map_index=0, notified_through=e,
                                  state_uri="/s/stats/0/state", state_tier="durable", state_version=e,
                                  inputs=(InputRef(task_id="sessions", output="output", through=e, map_index=read[e]),))
                      for e in range(1, 5)]

    reads = {1: 0, 2: 0, 3: 1, 4: 0}
    paired = rows("process_pairs", reads)
    chain = chains_from_ledger(paired, TaskGraph.from_ledger(paired), readable=lambda uri, key: True)["stats[0]"]
    through = [EPOCH.through_bound(e) for e in range(1, 5)]
    for edge in ("sessions[0].output->stats[0]", "sessions[1].output->stats[0]"):
        assert [c.M[edge] for c in chain.checkpoints[1:]] == through
    # two partitions of a task that is not paired are two inputs: one read of partition 1 in
    # place of partition 0 is not the same rows, and the chain still refuses it
    plain = rows("eager_checkpoint", reads)
    with pytest.raises(MetadataError, match="sessions\\[0\\].output->stats\\[0\\]: metadata must not shrink"):
        chains_from_ledger(plain, TaskGraph.from_ledger(plain), readable=lambda uri, key: True)


def test_a_replay_leaves_skipped_a_replica_taken_over_while_it_runs(tmp_path) -> None:
    """A worker lost while a replay runs: the watch takes its replicas over, their instances end
    skipped at once, and the replay must leave them so rather than clear them again and again
    (the soak met one cleared 23 times). What it knows of the layout is read at every pass."""
    from types import SimpleNamespace

    from falkirk.plugins.replay.observe import Observer
    from falkirk.policies.replay import Memory
    from falkirk.policies.replay.rules import Pass, needed
    from falkirk.policies.store import StoreConfig
    from falkirk.policies.store.control import PairLayouts
    from falkirk.policies.store.ledger import Ledger, LedgerSnapshot

    store = StoreConfig(durable_uri=str(tmp_path / "store"), scratch_uri=str(tmp_path / "scratch"))
    layouts = PairLayouts(store)
    layout = chained({"stats": 2}, ["worker-a", "worker-b"])
    layouts.save("d", layout)

    class Airflow:
        """Airflow's REST API, answering as the scheduler left epoch 8."""

        def on_poll(self) -> None:
            pass

        def runs_with_instances(self, dag_id: str, run_ids) -> dict:
            return {r: (self.find_run(dag_id, r), self.task_instances(dag_id, r)) for r in run_ids}

        def find_run(self, dag_id: str, run: str) -> dict:
            return {"state": "running"}

        def task_instances(self, dag_id: str, run: str) -> dict:
            return {"stats[0]": {"state": "skipped", "queue": "worker-b"},
                    "stats[1]": {"state": "failed", "queue": "worker-b"}}

        def dag(self, dag_id: str) -> dict:
            return {"is_paused": False, "max_active_runs": 16}

        def active_runs(self, dag_id: str) -> list:
            return []

    wanted = {("stats[0]", 8), ("stats[1]", 8)}
    plan = SimpleNamespace(dag_id="d", plan_id="p", failures=(), last_epoch=8, rerun_set=lambda: frozenset(wanted))
    observer = Observer(plan, store, Airflow(), LedgerSnapshot(Ledger(store), "d"))
    memory = Memory.fresh(frozenset(wanted), {8: "epoch-8"}, 0.0, 8).but(stage="rerun")

    def cleared() -> set:
        seen, airflow = observer.observe(memory)
        return set(needed(Pass(plan, seen, airflow, 0.0), wanted).clear)

    assert cleared() == wanted  # no replica taken over: both re-run
    layouts.save("d", layout.fail("worker-a"), before=layout)  # stats[0] is partition 0's replica A
    assert cleared() == {("stats[1]", 8)}


def test_a_standby_with_no_epoch_left_to_replay_is_active_at_once(tmp_path) -> None:
    """A catch-up whose copy brought the standby to its survivor's latest epoch, with no DAG run
    after it, makes it active at once: no further epoch may ever come to fold it in (the soak's
    catch-up after its last epoch waited for one). A survivor recorded further on leaves it."""
    from falkirk.plugins.pairs import _fold_in_now
    from falkirk.policies.store import StoreConfig
    from falkirk.policies.store.control import PairLayouts

    layouts = PairLayouts(StoreConfig(durable_uri=str(tmp_path / "store"), scratch_uri=str(tmp_path / "scratch")))
    lost = chained({"t": 2}, ["w0", "w1"]).advance("t", 1, "B", 6, 0).fail("w1")  # t[1].A was on w1
    standby = lost.register("t", 1, "w1", replaced=True)
    layouts.save("d", standby)
    assert _fold_in_now(layouts, "d", "t", 1, "A", 6)
    assert [(r.name, r.status, r.version) for r in layouts.load("d").pair("t", 1)] == [
        ("t[1].A", Status.ACTIVE, 6), ("t[1].B", Status.ACTIVE, 6)]
    assert not _fold_in_now(layouts, "d", "t", 1, "A", 6)  # active already: nothing to do
    ahead = lost.advance("t", 1, "B", 8, 0).register("t", 1, "w1", replaced=True)
    layouts.save("e", ahead)
    assert not _fold_in_now(layouts, "e", "t", 1, "A", 6)  # the survivor is at 8: its next commit folds it in
    assert layouts.load("e").replica("t", 1, "A").status is Status.STDBY


def test_a_catch_up_keeps_the_standbys_reads_of_the_replicas_its_twin_did_not_read(tmp_path) -> None:
    """The twins of ``stats`` read different replicas of ``sessions``: the standby (A) had read
    ``sessions[1]`` through epoch 2 before it died; its twin (B) had stopped reading it at epoch
    1. The rows copied from B go on the standby's chain with M̄ of ``sessions[1]`` kept at 2: the
    sixty-minute soak met the copy shrinking it, and every later plan of the DAG failed
    ("metadata must not shrink along the chain")."""
    import pyarrow as pa

    from falkirk.plugins.pairs import _install
    from falkirk.policies.planning.chains import TaskGraph, chains_from_ledger
    from falkirk.policies.regimes import Tier
    from falkirk.policies.store import StoreConfig
    from falkirk.policies.store.commits import CommitKey, commit_epoch
    from falkirk.policies.store.ledger import InputRef, Ledger, LedgerEntry, LedgerSnapshot, OutputRef

    store = StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch"))
    ledger = Ledger(store)

    def checkpoint(index: int, epoch: int, reads: dict[int, int]) -> None:
        key = CommitKey(dag_id="d", task_id="stats", epoch=epoch, map_index=index, incarnation=0)
        uri, state = (store.table_uri(Tier.DURABLE, "d", "stats", name, index) for name in ("output", "state"))
        done = commit_epoch(uri, pa.table({"epoch": [epoch], "v": [epoch]}), key)
        kept = commit_epoch(state, pa.table({"epoch": [epoch], "n": [epoch]}), key)
        ledger.append(LedgerEntry(dag_id="d", task_id="stats", epoch=epoch, regime="process_pairs", run_id=f"epoch-{epoch}", try_number=1, map_index=index,
                                  state_uri=state, state_tier="durable", state_version=kept.version, state_rows=1,
                                  outputs=(OutputRef("output", uri, "durable", done.version, 1),),
                                  inputs=tuple(InputRef(task_id="sessions", output="output", through=t, map_index=p)
                                               for p, t in sorted(reads.items())), notified_through=epoch))

    for epoch in (1, 2, 3, 4):
        for p in (0, 1):
            out = OutputRef("output", store.table_uri(Tier.DURABLE, "d", "sessions", "output", p), "durable", epoch, 1)
            ledger.append(LedgerEntry(dag_id="d", task_id="sessions", epoch=epoch, regime="batch(log_outputs=true)", run_id=f"epoch-{epoch}", try_number=1,
                                      map_index=p, outputs=(out,), notified_through=epoch))
        checkpoint(1, epoch, {0: epoch, 1: 1})  # B: sessions[0] each epoch, sessions[1] once
        if epoch <= 2:
            checkpoint(0, epoch, {0: 1, 1: epoch})  # A: sessions[1] each epoch, then died

    record = _install(store, LedgerSnapshot(ledger, "d"), "d", "stats", 0, "B", "A")

    assert record["epochs"] == [3, 4]
    standby = sorted((e for e in ledger.entries("d", "stats") if e.map_index == 0), key=lambda e: e.epoch)
    assert [{i.processor: i.through for i in e.inputs} for e in standby] == [
        {"sessions[0]": 1, "sessions[1]": 1}, {"sessions[0]": 1, "sessions[1]": 2},
        {"sessions[0]": 3, "sessions[1]": 2}, {"sessions[0]": 4, "sessions[1]": 2}]
    rows = ledger.entries("d")
    chains_from_ledger(rows, TaskGraph.from_ledger(rows), lambda uri, key: True)  # raised MetadataError before
