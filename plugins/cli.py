"""The ``falkirk`` command line.

* ``falkirk trigger --dag D [--epochs N] [--wait]``: trigger the DAG's next epoch (or the next
  ``N``), named ``manual__epoch-E`` at the epoch's logical date, and with ``--wait`` follow each
  run to its end.
* ``falkirk new-job NAME [--project DIR]``: write a job (``jobs/NAME.py``) and a DAG
  (``dags/NAME.py``) to start from (see :mod:`falkirk.plugins.scaffold`).
* ``falkirk solve SCENARIO.json``: answer a rollback scenario (see :mod:`falkirk.policies.rollback.cli`).
* ``falkirk plan --dag D (--failed-task T[:E] | --lost-scratch LOCATION | --lost-worker NAME | --bad-epoch T:E |
  --stale-inputs) [--json]``:
  compute a recovery plan from the ledger (and, for ``--failed-task T`` without an
  epoch, from the failed task instances Airflow reports), record it, and print it as a
  table: per task its frontier, the epochs it re-runs and what clear-downstream would
  re-run. It changes no table and no task instance.
* ``falkirk replay PLAN_ID``: execute a recorded plan through Airflow and show progress
  until every re-run has finished (see :mod:`falkirk.plugins.recovery`).
* ``falkirk release --dag D --reason TEXT``: end the DAG's recovery (or collection) lease by
  hand, when its holder is known to be dead; recorded in the recovery log with who and why.
  A lease also expires by itself when its holder stops renewing it
  (``FALKIRK_LEASE_SECONDS``, default 120); either way ``falkirk replay PLAN_ID`` then
  resumes the plan where it stopped.
* ``falkirk discard --dag D --epochs A-B [--yes]``: withdraw the DAG's newest epochs, run by
  mistake (a trigger at a far-ahead date): their ledger rows are rolled back, their DAG runs
  deleted, and the discard recorded in the history (see :mod:`falkirk.plugins.discard`).
  Without ``--yes`` it prints what it would do.
* ``falkirk keep --dag D --run RUN_ID [--yes]``: keep the results of a run whose re-run of
  completed epochs its jobs refused: its refused instances, then the run, marked success (see
  :mod:`falkirk.plugins.keep`). Without ``--yes`` it prints what it would do.
* ``falkirk gc --dag D [--dry-run]``: garbage-collect what the DAG's low-watermarks
  release (see :mod:`falkirk.policies.planning.collector`) and print it, with the space reclaimed;
  ``--dry-run`` only prints. Needs only the store, not Airflow.
* ``falkirk delivered --dag D --task T --through E``: record that the external system task
  ``T`` sends to has accepted every record of its epochs up to ``E`` (Falkirk Wheel
  §4.3, outputs); from then on those epochs are ``T``'s checkpoints and the rest of the pipeline may
  forget what it kept to send them again. For systems that acknowledge by calling back.

The store comes from ``FALKIRK_STORE_URI`` (and ``FALKIRK_SCRATCH_URI``, ``AWS_*``), or from
the Airflow connection named by ``FALKIRK_STORE_CONN_ID`` (see :mod:`falkirk.plugins.store_hook`);
Airflow from ``--airflow-url`` or ``FALKIRK_AIRFLOW_URL``, with the caller's own
credentials: ``FALKIRK_AIRFLOW_TOKEN``, or ``FALKIRK_AIRFLOW_USER`` and
``FALKIRK_AIRFLOW_PASSWORD``. A bad request prints one line naming the problem and
exits 2, having changed nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import httpx
from deltalake.exceptions import DeltaError

from falkirk.plugins.airflow_rest import AirflowClient, AirflowError, api_path
from falkirk.policies.ids import IdError, ProcessorId, check_dag_id, check_task_id
from falkirk.policies.planning.recovery import PlanError, RecoveryPlan
from falkirk.policies.rollback import cli as solver_cli
from falkirk.policies.store.commits import StoreUnreachable, UnreadableTable, plain_reason

if TYPE_CHECKING:
    from falkirk.policies.store import StoreConfig

EXIT_INVALID = 2
EXIT_STORE = 3


STORE_VARIABLES = """\
the store (every command but solve):
  FALKIRK_STORE_URI       the durable root: a local path or s3://bucket/prefix
  FALKIRK_SCRATCH_URI     the scratch root (default: scratch beside a local store)
  AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION   an S3-compatible store
  FALKIRK_STORE_CONN_ID   or: an Airflow connection of type falkirk_store to read all of these from
"""
AIRFLOW_VARIABLES = """
Airflow (--airflow-url, as the user who recovers; the user is recorded in the recovery log):
  FALKIRK_AIRFLOW_URL     Airflow's base URL, e.g. http://127.0.0.1:8080
  FALKIRK_AIRFLOW_USER, FALKIRK_AIRFLOW_PASSWORD   or FALKIRK_AIRFLOW_TOKEN
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["solve"]:
        return solver_cli.main(argv)
    parser = argparse.ArgumentParser(prog="falkirk", description="Falkirk Wheel rollback recovery for Airflow.",
                                     epilog="falkirk solve SCENARIO.json answers a rollback scenario "
                                            "(falkirk-scenario/1) as JSON; see falkirk solve --help.")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="plan a recovery from the ledger and Airflow (changes nothing)",
                          formatter_class=argparse.RawDescriptionHelpFormatter, epilog=STORE_VARIABLES + AIRFLOW_VARIABLES
                          + "\nexamples:\n  falkirk plan --dag falkirk_clicks --failed-task clean\n"
                            "  falkirk plan --dag falkirk_clicks --bad-epoch source:4 --json\n"
                            "  falkirk plan --dag falkirk_clicks --lost-scratch .falkirk/scratch/falkirk_clicks\n"
                            "  falkirk plan --dag falkirk_orders --lost-worker worker-a\n"
                            "  falkirk plan --dag falkirk_shards --bad-epoch 'events[1]:3'   # one partition\n"
                            "  falkirk plan --dag falkirk_orders --bad-epoch ingest:3 --consumers   # and the DAGs "
                            "reading it\n")
    plan.add_argument("--dag", required=True, type=_dag_arg)
    plan.add_argument("--failed-task", action="append", default=[], metavar="TASK[:EPOCH]",
                      help="a failed task, or one partition TASK[i] of a partitioned task; without an epoch, its "
                           "failed instances are read from Airflow")
    plan.add_argument("--lost-scratch", action="append", default=[], metavar="LOCATION",
                      help="a scratch directory that is gone")
    plan.add_argument("--lost-worker", action="append", default=[], metavar="NAME",
                      help="a worker that is gone with its local disk (its name in Airflow's task instances)")
    plan.add_argument("--bad-epoch", action="append", default=[], metavar="TASK:EPOCH",
                      help="an epoch of a task (or of one partition, TASK[i]:EPOCH) whose results are wrong "
                           "(e.g. its input was corrected)")
    plan.add_argument("--stale-inputs", action="store_true",
                      help="every epoch that read an epoch of another DAG (through an Asset) which a recovery "
                           "there has redone since")
    plan.add_argument("--consumers", action="store_true",
                      help="plan, too, every DAG that read (through an Asset) an epoch this plan redoes, and the "
                           "DAGs reading those: one plan per DAG, replayed producers first")
    plan.add_argument("--last-epoch", type=_epoch_arg,
                      help="the latest epoch with a DAG run (default: the DAG's latest run in Airflow, else the "
                           "ledger's newest epoch)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    replay = sub.add_parser("replay", help="execute a recorded plan through Airflow and wait for it",
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=STORE_VARIABLES + AIRFLOW_VARIABLES + "\nexamples:\n  falkirk replay 3f9c0a1b2c4d\n"
                                   "  falkirk replay 3f9c0a1b2c4d 8e1d2f3a4b5c   # a plan across DAGs, "
                                   "producers first\n")
    replay.add_argument("plan_id", nargs="+", help="a plan's id; several (from plan --consumers): replayed in "
                                                     "order, each DAG's to its end before the next")
    replay.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the re-runs")
    gc = sub.add_parser("gc", help="garbage-collect checkpoints, logs and scratch below the low-watermarks",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog=STORE_VARIABLES + "\nexample:\n  falkirk gc --dag falkirk_clicks --dry-run\n")
    gc.add_argument("--dag", required=True, type=_dag_arg)
    gc.add_argument("--dry-run", action="store_true", help="print what would be reclaimed; change nothing")
    gc.add_argument("--retain-hours", type=int, default=1, metavar="HOURS",
                    help="keep files a table stopped referencing this many hours, for jobs still reading "
                         "(a whole number; default 1)")
    release = sub.add_parser("release", help="end a DAG's recovery lease by hand (its holder is dead)")
    release.add_argument("--dag", required=True, type=_dag_arg)
    release.add_argument("--reason", required=True, help="why; recorded in the recovery log")
    delivered = sub.add_parser("delivered", help="record that an external system accepted a task's epochs")
    delivered.add_argument("--dag", required=True, type=_dag_arg)
    delivered.add_argument("--task", required=True, type=_task_arg)
    delivered.add_argument("--through", type=int, required=True, metavar="EPOCH",
                           help="the last epoch whose records the system has accepted (all earlier ones too)")
    discard = sub.add_parser("discard", help="withdraw the newest epochs of a DAG, run by mistake (previews "
                                             "unless --yes)",
                             formatter_class=argparse.RawDescriptionHelpFormatter, epilog=STORE_VARIABLES
                             + AIRFLOW_VARIABLES + "\nexamples:\n  falkirk discard --dag falkirk_orders --epochs 329\n"
                             "  falkirk discard --dag falkirk_orders --epochs 15-329 --yes\n"
                             "  falkirk discard --dag falkirk_orders --epochs 9 --consumers --yes   # and what "
                             "falkirk_orders_leaders built on it\n")
    discard.add_argument("--dag", required=True, type=_dag_arg)
    discard.add_argument("--epochs", required=True, type=_epochs_arg, metavar="FIRST[-[LAST]]",
                         help="the epochs to withdraw: the DAG's newest, up to its last ledger row and DAG run")
    discard.add_argument("--consumers", action="store_true",
                         help="withdraw too the epochs of other DAGs that read these through an Asset (from the "
                              "first such epoch to each one's newest); without it such a discard is refused")
    discard.add_argument("--yes", action="store_true", help="do it (without: print what it would do, change nothing)")
    keep = sub.add_parser("keep", help="keep the results of a DAG run whose re-run of completed epochs was refused: "
                                       "mark its refused instances, then the run, success (previews unless --yes)",
                          formatter_class=argparse.RawDescriptionHelpFormatter, epilog=STORE_VARIABLES
                          + AIRFLOW_VARIABLES + "\nexample:\n  falkirk keep --dag falkirk_orders --run manual__epoch-6 "
                          "--yes\n")
    keep.add_argument("--dag", required=True, type=_dag_arg)
    keep.add_argument("--run", required=True, type=_run_arg, metavar="RUN_ID", help="the DAG run's id")
    keep.add_argument("--yes", action="store_true", help="do it (without: print what it would do, change nothing)")
    new_job = sub.add_parser("new-job", help="write a job and a DAG to start from (jobs/NAME.py, dags/NAME.py)",
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             epilog="example:\n  falkirk new-job word_count --project .\n")
    new_job.add_argument("name", metavar="NAME", help="the job's module name and DAG id, e.g. word_count")
    new_job.add_argument("--project", default=".", metavar="DIR", type=_project_arg,
                         help="your Airflow project: jobs/ and dags/ are written under it (default: .)")
    new_job.add_argument("--first", default="2026-01-01", metavar="YYYY-MM-DD", type=_date_arg,
                         help="the date of the DAG's first epoch (one epoch a day from it; default 2026-01-01)")
    trigger = sub.add_parser("trigger", help="trigger the DAG's next epoch (the one after its latest run)",
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             epilog=AIRFLOW_VARIABLES + "\nexamples:\n  falkirk trigger --dag word_count --wait\n"
                                                        "  falkirk trigger --dag word_count --epochs 3\n")
    trigger.add_argument("--dag", required=True, type=_dag_arg)
    trigger.add_argument("--epochs", type=_epoch_arg, default=1, metavar="N",
                         help="how many epochs to trigger, one after the other (default 1)")
    trigger.add_argument("--wait", action="store_true",
                         help="wait for each run to end, printing its task states; if one fails, print the end of "
                              "its failed task instances' logs, trigger no more and exit 1")
    pairs = sub.add_parser("pairs", help="process pairs: show the layout, declare a worker or replica dead, "
                                         "recreate lost replicas on a spare",
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog=AIRFLOW_VARIABLES + "\nexamples:\n  falkirk pairs --dag falkirk_pairs\n"
                           "  falkirk pairs --dag falkirk_pairs --fail-worker worker-1\n"
                           "  falkirk pairs --dag falkirk_pairs --fail-replica sessions[1].A\n"
                           "  falkirk pairs --dag falkirk_pairs --catch-up [--spare worker-4]\n"
                           "  falkirk pairs --dag falkirk_pairs --catch-up --spare worker-1 --replaced\n")
    pairs.add_argument("--dag", required=True, type=_dag_arg)
    action = pairs.add_mutually_exclusive_group()
    action.add_argument("--fail-worker", metavar="WORKER", help="take over every replica on WORKER (it is lost)")
    action.add_argument("--fail-replica", metavar="TASK[P].R", help="take over one replica, e.g. sessions[1].A")
    action.add_argument("--catch-up", action="store_true", help="recreate each lost replica on a spare, bottom-up")
    pairs.add_argument("--spare", metavar="WORKER", help="the worker --catch-up recreates replicas on (default: the "
                                                         "first of FALKIRK_WORKERS holding none)")
    pairs.add_argument("--replaced", action="store_true",
                       help="with --catch-up --spare: the spare is a lost worker's name a new machine has taken "
                            "(its disk empty); without it a lost worker is no spare")
    watch = sub.add_parser("watch", help="notice lost workers by their heartbeats and respond: take over their "
                                         "process pairs, plan (and where the DAG opts in, replay) the rest",
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog=AIRFLOW_VARIABLES + "\nA DAG opts in to replays without a person with the tag "
                           "falkirk:auto_recover.\nexample:\n  falkirk watch --dag falkirk_pairs --dag falkirk_shards "
                           "--timeout 30\n")
    watch.add_argument("--dag", action="append", required=True, type=_dag_arg,
                       help="a DAG to respond for (repeatable)")
    watch.add_argument("--timeout", type=_seconds_arg(WATCH_TIMEOUT), default=30.0, metavar="SECONDS",
                       help=f"silence after which a worker is lost ({WATCH_TIMEOUT[0]:g} to {WATCH_TIMEOUT[1]:g}; "
                            f"default 30)")
    watch.add_argument("--poll", type=_seconds_arg(WATCH_POLL), default=5.0, metavar="SECONDS",
                       help=f"time between pings ({WATCH_POLL[0]:g} to {WATCH_POLL[1]:g}; default 5)")
    for p in (plan, replay, discard, keep, trigger, pairs, watch):
        p.add_argument("--airflow-url", default=os.environ.get("FALKIRK_AIRFLOW_URL"),
                       help="Airflow's base URL (default: $FALKIRK_AIRFLOW_URL)")
    args = parser.parse_args(argv)
    try:
        return {"plan": _plan, "replay": _replay, "gc": _gc, "delivered": _delivered,
                "release": _release, "discard": _discard, "keep": _keep, "new-job": _new_job,
                "trigger": _trigger, "pairs": _pairs, "watch": _watch}[args.command](args)
    except (PlanError, AirflowError, ValueError) as exc:  # ScaffoldError and IdError are ValueErrors
        print(f"falkirk {args.command}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except (UnreadableTable, StoreUnreachable) as exc:
        print(f"falkirk {args.command}: {exc}", file=sys.stderr)
        return EXIT_STORE
    except httpx.TransportError as exc:  # refused, reset, timed out, a name that does not resolve
        reason = " ".join(str(exc).split())[:300]
        print(f"falkirk {args.command}: cannot reach Airflow at {getattr(args, 'airflow_url', None)} "
              f"({type(exc).__name__}: {reason}); check --airflow-url (or FALKIRK_AIRFLOW_URL) and that Airflow's "
              f"API server is running", file=sys.stderr)
        return EXIT_INVALID
    except DeltaError as exc:
        print(f"falkirk {args.command}: the store cannot be read: {plain_reason(exc)}. A table's _delta_log is "
              f"damaged: restore it from a backup (nothing was changed)", file=sys.stderr)
        return EXIT_STORE


def _pairs(args: argparse.Namespace) -> int:
    from falkirk.plugins import pairs
    from falkirk.policies.pairs import PairsError
    from falkirk.policies.store.control import PairLayouts
    from falkirk.policies.store.ledger import Ledger, LedgerSnapshot
    from falkirk.policies.workers import configured_workers

    if args.replaced and not (args.catch_up and args.spare):
        print("falkirk pairs: --replaced names the worker a catch-up recreates replicas on: use it with "
              "--catch-up --spare WORKER", file=sys.stderr)
        return EXIT_INVALID
    store = _store()
    try:
        if args.fail_worker or args.fail_replica:
            pairs.take_over(args.dag, store, _airflow(args.airflow_url), worker=args.fail_worker,
                            replica=args.fail_replica, reason="falkirk pairs, by hand")
        elif args.catch_up:
            pairs.catch_up(args.dag, store, _airflow(args.airflow_url), spare=args.spare,
                           workers=configured_workers(os.environ), replaced=args.replaced)
        layout = PairLayouts(store).load(args.dag)
        if layout is None:
            raise PairsError(f"--dag {args.dag}: no process pairs are recorded for this DAG (has a ProcessPairs task "
                             f"run?)")
        print(pairs.layout_table(layout, LedgerSnapshot(Ledger(store), args.dag)))
    except (PairsError, AirflowError) as exc:
        print(f"falkirk pairs: {exc}", file=sys.stderr)
        return EXIT_INVALID
    return 0


def _watch(args: argparse.Namespace) -> int:
    from falkirk.plugins.watch import watch
    from falkirk.policies.workers import configured_workers

    workers = configured_workers(os.environ)
    if not workers:
        raise PlanError("FALKIRK_WORKERS: name the workers to watch (comma-separated), as the scheduler has them")
    if args.poll > args.timeout:
        raise PlanError(f"--poll {args.poll:g}: a worker is pinged less often than --timeout {args.timeout:g} lets "
                        f"it be silent, so every worker would seem lost; give a --poll below --timeout")
    client = _airflow(args.airflow_url)
    unknown = [dag for dag in args.dag if not client.dag_exists(dag)]
    if unknown:
        raise PlanError(f"--dag {unknown[0]}: Airflow has no DAG {unknown[0]!r}; name a DAG it lists "
                        f"(airflow dags list)")
    store = _store()
    try:
        watch(args.dag, store, client, workers, timeout=args.timeout,
              poll=args.poll, progress=lambda m: print(m, flush=True))
    except KeyboardInterrupt:
        return 0
    return 0


def _trigger(args: argparse.Namespace) -> int:
    from falkirk.plugins.dag_facts import latest_run_epoch, regimes_and_clock

    client = _airflow(args.airflow_url)
    if not client.dag_exists(args.dag):
        raise PlanError(f"--dag: Airflow has no DAG {args.dag!r}")
    _, clock = regimes_and_clock(args.dag, client)
    if clock is None:
        raise PlanError(f"--dag {args.dag}: it has no Falkirk task, so it has no epochs; trigger it as usual")
    if args.wait and client.request("GET", api_path("dags", args.dag)).get("is_paused"):
        raise PlanError(f"--wait: DAG {args.dag} is paused, so its runs would wait for ever; unpause it first "
                        f"(airflow dags unpause {args.dag}, or the toggle in the UI)")
    latest = latest_run_epoch(args.dag, client, clock)
    first = clock.first_epoch if latest is None else latest + 1
    for epoch in range(first, first + args.epochs):
        _check_date_free(client, args.dag, epoch, clock.logical_date(epoch))
        run = client.trigger(args.dag, f"manual__epoch-{epoch}", clock.logical_date(epoch))
        print(f"triggered {args.dag} epoch {epoch}: run {run['dag_run_id']} at {clock.logical_date(epoch).isoformat()}",
              flush=True)
        if args.wait:
            state = client.wait_for_run(args.dag, run["dag_run_id"], timeout=3600,
                                        progress=lambda m: print(m, flush=True))
            print(f"{run['dag_run_id']}: {state}", flush=True)
            if state != "success":
                _print_failures(client, args.dag, run["dag_run_id"])
                return 1  # the next epochs would only wait on this one
    return 0


def _check_date_free(client: AirflowClient, dag_id: str, epoch: int, date: datetime) -> None:
    """Refuse, naming it and the command that deletes it, a run that holds epoch ``epoch``'s
    logical date though it is no epoch of the DAG: a run of ``airflow dags test`` (Airflow
    allows one run per logical date, and ``latest_run_epoch`` leaves test runs out)."""
    from falkirk.plugins.dags_test import is_test_run

    held = [r for r in client.runs_between(dag_id, date, date) if r.get("logical_date") and is_test_run(r)]
    if held:
        raise PlanError(f"epoch {epoch}'s logical date {date.isoformat()} is held by {held[0]['dag_run_id']}, a run "
                        f"of `airflow dags test` (Airflow keeps one run per logical date); delete it with: falkirk "
                        f"discard --dag {dag_id} --epochs {epoch} --yes (or the delete button in the DAG's runs list), "
                        f"then trigger again")


def _print_failures(client: AirflowClient, dag_id: str, run_id: str, lines: int = 15) -> None:
    """The end of each failed task instance's log, and where to go from there."""
    for task, ti in sorted(client.task_instances(dag_id, run_id).items()):
        if ti.get("state") != "failed":
            continue
        try:
            log = client.task_log(dag_id, run_id, ti["task_id"], ti.get("try_number") or 1,
                                  ti.get("map_index", -1)).splitlines()
        except AirflowError as exc:
            log = [f"(its log could not be read: {exc})"]
        print(f"--- {task} failed; the end of its log:", *log[-lines:], sep="\n", flush=True)
    print(f"plan a recovery once the cause is fixed: falkirk plan --dag {dag_id} --failed-task '*' (or the DAG's "
          f"Falkirk tab)", flush=True)


def _new_job(args: argparse.Namespace) -> int:
    from falkirk.plugins.scaffold import new_job

    for path in new_job(args.name, args.project, args.first):
        print(f"wrote {path}")
    print(f"put dags/ in Airflow's dags folder (or point AIRFLOW__CORE__DAGS_FOLDER at it), then trigger "
          f"{args.name} at {args.first}T00:00:00+00:00")
    return 0


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1.

    >>> _count(1, "DAG"), _count(13, "task instance")
    ('1 DAG', '13 task instances')
    """
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _epochs_arg(value: str) -> tuple[int, int | None]:
    """``FIRST-LAST``, one epoch, or ``FIRST-`` (through the DAG's newest epoch: ``None``).

    >>> _epochs_arg("15-329"), _epochs_arg("7"), _epochs_arg("328-")
    ((15, 329), (7, 7), (328, None))
    """
    first, dash, last = value.partition("-")
    try:
        span = (_epoch_arg(first), None if dash and not last else _epoch_arg(last or first))
    except argparse.ArgumentTypeError:
        span = (0, 0)
    if not 1 <= span[0] <= (span[0] if span[1] is None else span[1]):
        raise argparse.ArgumentTypeError(f"{value[:40]!r}: write FIRST-LAST, one epoch, or FIRST- (through the "
                                         f"newest), e.g. 15-329")
    return span


def _run_arg(value: str) -> str:
    """A DAG run id: what Airflow's runs list shows (at most 250 characters).

    >>> _run_arg("manual__epoch-6")
    'manual__epoch-6'
    """
    if not value.strip() or len(value) > 250:
        raise argparse.ArgumentTypeError(f"{value[:40]!r}: give a DAG run's id, e.g. manual__epoch-6")
    return value


def _keep(args: argparse.Namespace) -> int:
    from falkirk.plugins.keep import keep, plan_keep

    client = _airflow(args.airflow_url)
    if not args.yes:
        print(plan_keep(args.dag, _store(), client, args.run).describe())
        print(f"nothing was changed; do it with: falkirk keep --dag {args.dag} --run {args.run} --yes")
        return 0
    keep(args.dag, _store(), client, args.run, progress=lambda m: print(m, flush=True))
    return 0


def _discard(args: argparse.Namespace) -> int:
    from falkirk.plugins.discard import discard, plan_discard

    client = _airflow(args.airflow_url)
    first, last = args.epochs
    also = " --consumers" if args.consumers else ""
    if not args.yes:
        preview = plan_discard(args.dag, _store(), client, first, last, consumers=args.consumers)
        print(preview.describe())
        print(f"nothing was changed; do it with: falkirk discard --dag {args.dag} --epochs {first}-{preview.last}"
              f"{also} --yes")
        return 0
    done = discard(args.dag, _store(), client, first, last, holder=_airflow_user(client),
                   progress=lambda m: print(m, flush=True), consumers=args.consumers)
    for each in done.every():
        print(f"discarded epochs {each.first}..{each.last} of {each.plan.dag_id}; its next epoch is {each.next_epoch}")
    return 0


WATCH_TIMEOUT = (1.0, 86_400.0)  # seconds of silence before a worker is lost
WATCH_POLL = (0.1, 3_600.0)  # seconds between two pings


def _seconds_arg(bounds: tuple[float, float]) -> Callable[[str], float]:
    """An argparse type: a number of seconds within ``bounds`` (not inf, nan or negative).

    >>> _seconds_arg((1, 60))("2.5")
    2.5
    >>> _seconds_arg((1, 60))("inf")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 'inf': give a number of seconds from 1 to 60
    """
    low, high = bounds

    def seconds(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not low <= number <= high:  # False for nan
            raise argparse.ArgumentTypeError(f"{value[:40]!r}: give a number of seconds from {low:g} to {high:g}")
        return number
    return seconds


def _dag_arg(value: str) -> str:
    """An argparse type: a DAG id Airflow accepts (:func:`falkirk.policies.ids.check_dag_id`;
    argparse names the flag)."""
    try:
        return check_dag_id(value, field="")
    except IdError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _task_arg(value: str) -> str:
    """An argparse type: a task id Airflow accepts (:func:`falkirk.policies.ids.check_task_id`)."""
    try:
        return check_task_id(value, field="")
    except IdError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _date_arg(value: str) -> str:
    """An argparse type: a calendar date written YYYY-MM-DD.

    >>> _date_arg("2026-02-28")
    '2026-02-28'
    >>> _date_arg("2026-13-01")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '2026-13-01': give the first epoch's date as YYYY-MM-DD, a day of the calendar (e.g. 2026-01-01)
    """
    from datetime import date

    try:
        if len(value) != 10:
            raise ValueError(value)
        date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value[:40]!r}: give the first epoch's date as YYYY-MM-DD, a day of the "
                                         f"calendar (e.g. 2026-01-01)") from None
    return value


def _project_arg(value: str) -> str:
    """An argparse type: a directory to write ``jobs/`` and ``dags/`` under (it may not exist yet)."""
    from pathlib import Path

    path = Path(value)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if not value or (path.exists() and not path.is_dir()):
        raise argparse.ArgumentTypeError(f"{value[:80]!r}: not a directory; give your Airflow project's directory "
                                         f"(jobs/ and dags/ are written under it)")
    if existing is not None and not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{value[:80]!r}: {existing} is a file, so no directory can be made under "
                                         f"it; give your Airflow project's directory")
    if existing is not None and not os.access(existing, os.W_OK):
        raise argparse.ArgumentTypeError(f"{value[:80]!r}: {existing} is not writable by this user; give a "
                                         f"directory you may write to")
    return value


def _epoch_arg(value: str) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 10 or not 1 <= int(value) <= MAX_EPOCH:
        raise argparse.ArgumentTypeError(f"{value[:40]!r}: give an epoch from 1 to {MAX_EPOCH}")
    return int(value)


def _store() -> StoreConfig:
    """The store: the connection ``FALKIRK_STORE_CONN_ID`` names, else the ``FALKIRK_*`` variables.
    Airflow is imported only for a connection (it reads its configuration as it loads)."""
    from falkirk.policies.store import StoreConfig

    conn_id = os.environ.get("FALKIRK_STORE_CONN_ID", "").strip()
    if not conn_id:
        return StoreConfig.from_env()
    from falkirk.plugins.store_hook import FalkirkStoreHook

    return FalkirkStoreHook(conn_id).get_store()


def _airflow(url: str | None) -> AirflowClient:
    """The client of the Airflow at ``url`` (``--airflow-url``), which the command needs."""
    client = _client(url, required=True)
    assert client is not None  # _client raises when a required URL is missing
    return client


def _client(url: str | None, required: bool) -> AirflowClient | None:
    if not url:
        if required:
            raise PlanError("--airflow-url: name Airflow's base URL (or set FALKIRK_AIRFLOW_URL)")
        return None
    env = os.environ
    return AirflowClient(url, env.get("FALKIRK_AIRFLOW_USER"), env.get("FALKIRK_AIRFLOW_PASSWORD"),
                         token=env.get("FALKIRK_AIRFLOW_TOKEN"))


def _plan(args: argparse.Namespace) -> int:
    from falkirk.plugins.discard import beyond_note, rows_beyond
    from falkirk.plugins.recovery import plan
    from falkirk.policies.store.ledger import Ledger

    instances, tasks = [], []
    for value in args.failed_task:
        if ":" in value:
            instances.append(_task_epoch("--failed-task", value))
        else:
            tasks.append(value if value == "*" else _processor("--failed-task", value))
    failures = dict(failed_tasks=tasks, failed_instances=instances, lost_scratch=args.lost_scratch,
                    lost_workers=args.lost_worker, bad_epochs=[_task_epoch("--bad-epoch", v) for v in args.bad_epoch],
                    stale_inputs=args.stale_inputs, last_epoch=args.last_epoch)
    client = _client(args.airflow_url, required=bool(tasks))
    if args.consumers:
        from falkirk.plugins.asset_recovery import plan_across

        across = plan_across(args.dag, _store(), client, **failures)
        if args.json:
            json.dump({"plans": [p.to_json() for p in across.plans]}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(across.table())
            print(f"re-runs {_count(len(across.rerun_set()), 'task instance')} in {_count(len(across.plans), 'DAG')} "
                  f"({', '.join(across.dags())})")
            print(f"execute it with: falkirk replay {' '.join(p.plan_id for p in across.plans)}")
        return 0
    result = plan(args.dag, _store(), client, **failures)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        gap = _plan_gap(args.dag, result, client)
        if gap is None or not gap[1]:
            print(result.table())
        if gap is not None:
            print(gap[0])
        beyond = rows_beyond(Ledger(_store()).entries(args.dag), result.last_epoch)
        if beyond:
            print(beyond_note(args.dag, result.last_epoch, beyond))
        print(f"execute it with: falkirk replay {result.plan_id}")
    return 0


def _plan_gap(dag_id: str, result: RecoveryPlan, client: AirflowClient | None) -> tuple[str, bool] | None:
    """The note on a plan that re-runs epochs without a DAG run
    (:func:`~falkirk.plugins.discard.run_gap`), and whether they are most of it (the note then
    stands instead of the plan's table); ``None`` when it has none."""
    from falkirk.plugins.dag_facts import regimes_and_clock
    from falkirk.plugins.discard import gap_note, run_epochs, run_gap

    rerun = result.rerun_set()
    if client is None or not rerun:
        return None
    clock = regimes_and_clock(dag_id, client)[1]
    if clock is None:
        return None
    epochs = sorted({e for _, e in rerun})
    gap = run_gap(epochs, run_epochs(client, dag_id, clock, epochs[0], epochs[-1]))
    if gap is None:
        return None
    in_gap = sum(1 for _, e in rerun if gap[0] <= e <= gap[1])
    return gap_note(dag_id, gap, len(rerun), in_gap), 2 * in_gap > len(rerun)


def _replay(args: argparse.Namespace) -> int:
    from falkirk.plugins.recovery import replay
    from falkirk.policies.planning.recovery_log import AlreadyReplayed

    client = _airflow(args.airflow_url)
    if len(args.plan_id) > 1:
        from falkirk.plugins.asset_recovery import replay_across

        replay_across(args.plan_id, _store(), client, holder=_airflow_user(client),
                      progress=lambda m: print(m, flush=True), timeout=args.timeout)
        return 0
    try:
        replay(args.plan_id[0], _store(), client, holder=_airflow_user(client),
               progress=lambda m: print(m, flush=True), timeout=args.timeout)
    except AlreadyReplayed as exc:
        print(f"falkirk replay: {exc}")
    return 0


def _airflow_user(client: AirflowClient) -> str | None:
    """The Airflow user the CLI acts as, recorded as the executor of what it does: the user
    name given, or the one Airflow reports for the token."""
    named = os.environ.get("FALKIRK_AIRFLOW_USER")
    if named:
        return named
    try:
        return (client.request("GET", "/falkirk/api/v1/health") or {}).get("user")
    except AirflowError:
        return None


def _gc(args: argparse.Namespace) -> int:
    from falkirk.policies.planning.collector import collect

    if not 0 <= args.retain_hours <= 87_600:
        raise ValueError(f"--retain-hours {args.retain_hours}: give a whole number of hours from 0 to 87600")
    report = collect(_store(), args.dag, dry_run=args.dry_run, retain_hours=args.retain_hours,
                     progress=lambda m: print(m, flush=True))
    plan = report.plan
    if plan.empty:
        print("nothing to reclaim")
    elif args.dry_run:
        print("dry run: nothing was changed; run without --dry-run to reclaim it")
    else:
        print(f"reclaimed {plan.bytes} bytes; {report.files_removed} files removed from disk (files dropped less "
              f"than {args.retain_hours} h ago stay; a later collection of the same table removes them)")
    return 0


def _release(args: argparse.Namespace) -> int:
    import getpass

    from falkirk.policies.planning.recovery_log import RecoveryLog

    by = os.environ.get("FALKIRK_AIRFLOW_USER") or getpass.getuser()
    held = RecoveryLog(_store()).release(args.dag, by, args.reason)
    print(f"released the lease of plan {held.plan_id} on {args.dag} (held by {held.holder} since "
          f"{held.since:%Y-%m-%d %H:%M:%S}Z); resume the plan with: falkirk replay {held.plan_id}")
    return 0


def _delivered(args: argparse.Namespace) -> int:
    from falkirk.policies.store.control import Deliveries
    from falkirk.policies.store.ledger import Ledger

    store = _store()
    deliveries = Deliveries(store)
    raised = deliveries.record(args.dag, args.task, args.through, Ledger(store).external_senders(args.dag))
    point = deliveries.through(args.dag).get(args.task, 0)
    print(f"{args.dag}.{args.task}: delivered through epoch {point}" + ("" if raised else " (unchanged)"))
    return 0


MAX_EPOCH = 10**9


def _task_epoch(flag: str, value: str) -> tuple[str, int]:
    task, sep, epoch = value.rpartition(":")
    if not sep or not task or not epoch.isascii() or not epoch.isdigit() or len(epoch) > 10 \
            or not 1 <= int(epoch) <= MAX_EPOCH:
        raise ValueError(f"{flag} {value!r:.80}: write it as TASK:EPOCH with an epoch from 1 to {MAX_EPOCH}, "
                         f"e.g. aggregate:4")
    return _processor(flag, task), int(epoch)


def _processor(flag: str, value: str) -> str:
    """``value``, a task or one partition of it (``task[i]``), whose task id Airflow accepts."""

    check_task_id(ProcessorId.parse(value).task, flag)
    return value


if __name__ == "__main__":
    raise SystemExit(main())
