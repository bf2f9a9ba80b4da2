"""The ``falkirk`` command line.

``falkirk solve SCENARIO.json`` prints the answer to a rollback scenario as JSON on
stdout and exits 0. An invalid scenario prints one line naming the offending field on
stderr, nothing on stdout, and exits 2.

``falkirk plan --dag D (--failed-task T:E | --lost-scratch DIR | --bad-epoch T:E) [--json]``
reads the ledger of the store named by ``FALKIRK_STORE_URI`` (and ``AWS_*``) and prints
the recovery plan: per task its frontier, the epochs it re-runs and what Airflow's
clear-downstream would re-run. It changes nothing. Bad requests exit 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from policies.scenario import ScenarioError, load_scenario

EXIT_INVALID = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="falkirk", description="Falkirk Wheel rollback recovery tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    solve = sub.add_parser("solve", help="answer a rollback scenario (falkirk-scenario/1) as JSON")
    solve.add_argument("scenario", help="path to the scenario file, or - for standard input")
    plan = sub.add_parser("plan", help="plan a recovery from the ledger (changes nothing)")
    plan.add_argument("--dag", required=True)
    plan.add_argument("--failed-task", action="append", default=[], metavar="TASK:EPOCH")
    plan.add_argument("--lost-scratch", action="append", default=[], metavar="DIR")
    plan.add_argument("--bad-epoch", action="append", default=[], metavar="TASK:EPOCH")
    plan.add_argument("--last-epoch", type=int, help="the latest epoch with a DAG run (default: the ledger's)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    if args.command == "plan":
        return _plan(args)

    try:
        text = sys.stdin.read() if args.scenario == "-" else open(args.scenario, encoding="utf-8").read()
    except OSError as exc:
        print(f"{args.scenario}: cannot read: {exc.strerror}", file=sys.stderr)
        return EXIT_INVALID
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        print(f"(file): not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", file=sys.stderr)
        return EXIT_INVALID
    try:
        scenario = load_scenario(doc)
    except ScenarioError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID
    json.dump(scenario.answer(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _plan(args: argparse.Namespace) -> int:
    from policies.checkpoint_chains import StoreReadability, TaskGraph
    from policies.epoch_tables import open_table
    from policies.ledger import Ledger
    from policies.recovery import BadEpoch, FailedTask, LostScratch, PlanError, plan_recovery
    from policies.store import StoreConfig, StoreError

    try:
        failures = ([FailedTask(*_task_epoch("--failed-task", v)) for v in args.failed_task]
                    + [LostScratch(v) for v in args.lost_scratch]
                    + [BadEpoch(*_task_epoch("--bad-epoch", v)) for v in args.bad_epoch])
        store = StoreConfig.from_env()
        ledger = Ledger(store)
        entries = ledger.entries(args.dag)
        if not entries:
            raise PlanError(f"--dag: the ledger at {ledger.uri} has no rows for DAG {args.dag!r}")
        last = args.last_epoch if args.last_epoch is not None else max(e.epoch for e in entries)
        table = open_table(ledger.uri, store.options_for(ledger.uri))
        plan = plan_recovery(args.dag, TaskGraph.from_ledger(entries), entries, failures, last,
                             StoreReadability(store), ledger_version=table.version() if table else None)
    except (PlanError, StoreError, ValueError) as exc:
        print(f"falkirk plan: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        json.dump(plan.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(plan.table())
    return 0


def _task_epoch(flag: str, value: str) -> tuple[str, int]:
    task, sep, epoch = value.rpartition(":")
    if not sep or not task or not epoch.isdigit():
        raise ValueError(f"{flag} {value!r}: write it as TASK:EPOCH, e.g. aggregate:4")
    return task, int(epoch)
