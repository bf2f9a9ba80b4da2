"""The ``falkirk`` command line.

``falkirk solve SCENARIO.json`` prints the answer to a rollback scenario as JSON on
stdout and exits 0. An invalid scenario prints one line naming the file and the offending
field on stderr, nothing on stdout, and exits 2.

``falkirk plan`` and ``falkirk replay`` talk to Airflow and live in :mod:`falkirk.plugins.cli`,
the command's entry point, which hands ``solve`` to :func:`main` here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from falkirk.policies.rollback.scenario import ScenarioError, load_scenario

EXIT_INVALID = 2
MAX_SCENARIO_BYTES = 16 * 1024 * 1024


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="falkirk", description="Falkirk Wheel rollback recovery tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    solve = sub.add_parser("solve", help="answer a rollback scenario (falkirk-scenario/1) as JSON")
    solve.add_argument("scenario", help="path to the scenario file, or - for standard input")
    args = parser.parse_args(argv)

    # Read at most one byte past the limit: /dev/zero or a huge file is refused, not slurped.
    try:
        if args.scenario == "-":
            text = sys.stdin.read(MAX_SCENARIO_BYTES + 1)
        else:
            with open(args.scenario, encoding="utf-8") as f:
                text = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        print(f"{args.scenario}: cannot read: {exc.strerror}", file=sys.stderr)
        return EXIT_INVALID
    except UnicodeDecodeError:
        print(f"{args.scenario}: not UTF-8 text; a scenario is a JSON file", file=sys.stderr)
        return EXIT_INVALID
    if len(text) > MAX_SCENARIO_BYTES:
        print(f"{args.scenario}: larger than {MAX_SCENARIO_BYTES // (1024 * 1024)} MiB; a scenario is a small "
              f"JSON file", file=sys.stderr)
        return EXIT_INVALID
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        print(f"{args.scenario}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", file=sys.stderr)
        return EXIT_INVALID
    except RecursionError:
        print(f"{args.scenario}: JSON nested too deeply", file=sys.stderr)
        return EXIT_INVALID
    try:
        scenario = load_scenario(doc)
    except ScenarioError as exc:
        print(f"{'<stdin>' if args.scenario == '-' else args.scenario}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    json.dump(scenario.answer(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
