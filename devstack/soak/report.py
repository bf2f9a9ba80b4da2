"""The soak's report: the schedule as it landed, each recovery, the checks, and how to replay it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from falkirk.policies.faults import BROKEN

if TYPE_CHECKING:
    from devstack.soak.run import SoakReport


@dataclass(frozen=True)
class KindFigures:
    """One line of the report's table: a fault kind, how often it landed, how many of those a
    plan followed, and the median and longest time to caught-up after it."""

    kind: str
    faults: int
    planned: int
    median: float | None
    longest: float | None


def by_kind(report: SoakReport) -> list[KindFigures]:
    """The faults of ``report`` that landed, by kind, the most frequent first."""
    kinds: dict[str, list] = {}
    for injected in landed(report):
        kinds.setdefault(injected.fault.kind, []).append(injected)
    out = []
    for kind, faults in sorted(kinds.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        times = [i.caught_up_in for i in faults if i.caught_up_in is not None]
        out.append(KindFigures(kind, len(faults), sum(bool(i.recoveries) for i in faults),
                               statistics.median(times) if times else None, max(times, default=None)))
    return out


def landed(report: SoakReport) -> list:
    """The faults that landed (not those the soak could not inject, or held back to the end)."""
    return [i for i in report.injected if not i.hit.startswith(("not landed", "could not inject"))]


def command(report: SoakReport) -> str:
    """The command that runs the same schedule on the same DAGs again."""
    from devstack.soak.pipelines import SOAK_DAGS

    names = [d.removeprefix("falkirk_") for d in report.dags]
    return report.schedule.command(report.broken) + (f" DAGS={','.join(names)}" if names != list(SOAK_DAGS) else "")


def _epochs(report: SoakReport) -> str:
    return ", ".join(f"{d} {n}" for d, n in report.epochs.items())


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"


def render(report: SoakReport) -> str:
    """The report as printed at the end of ``make soak``."""
    s = report.schedule
    lines = ["", f"== soak report: seed {s.seed}, {s.duration / 60:g} minutes; epochs: {_epochs(report)}", "",
             f"faults injected: {len(landed(report))} of {len(s.faults)} scheduled, "
             f"{len({i.fault.kind for i in landed(report)})} kinds"
             + (f" ({len(report.injected) - len(landed(report))} did not land: below)"
                if len(landed(report)) < len(report.injected) else "")]
    lines += ["  kind                faults  with a plan  caught up: median  max"]
    lines += [f"  {k.kind:<18} {k.faults:>7} {k.planned:>12} {_seconds(k.median):>18} {_seconds(k.longest):>5}"
              for k in by_kind(report)]
    lines += ["", "fault schedule (offset, fault, what it hit, the plans replayed after it):"]
    lines += [f"  {i.line()}" + (f"  -> {', '.join(i.recoveries)}" if i.recoveries else "") for i in report.injected]
    lines += ["", f"recoveries: {len(report.recoveries)}"]
    lines += [f"  {r.planned_at:7.0f}s  {r.dag_id} plan {r.plan_id}: {r.reruns} re-runs, "
              + (f"replayed in {r.replayed_in:.0f}s" if r.replayed_in is not None else "not finished")
              + (f" ({r.attempts} attempts)" if r.attempts > 1 else "") + f"  [{r.why}]" for r in report.recoveries]
    lines += ["", "time to caught-up after the last epoch: "
              + (f"{report.caught_up_in:.0f}s" if report.caught_up_in is not None else "NOT CAUGHT UP")]
    lines += ["", "checks along the way (the durable tables and the SQL sink, up to each DAG's epoch settled "
                  "then):"]
    lines += [f"  {at:7.0f}s  " + ", ".join(f"{d} 1-{n}" for d, n in through.items() if n) + ": "
              + (f"{n} DIFFER" if n else "equal")
              for at, through, n in report.along_the_way] or ["  none (no epoch settled in time)"]
    lines += ["", "checks:"] + [f"  {'ok  ' if ok else 'FAIL'} {name} ({detail})" for name, ok, detail in report.checks]
    verdict = "zero discrepancies" if report.ok else f"{len(report.discrepancies)} DISCREPANCIES"
    if report.broken:
        lines += ["", f"recovery broken on purpose: {report.broken} ({BROKEN.get(report.broken, '')})"]
    lines += ["", f"{verdict}; this schedule again: {command(report)}"]
    lines += [f"  {d}" for d in report.discrepancies]
    return "\n".join(lines)


def markdown(report: SoakReport) -> str:
    """The report's figures as a Markdown table, for the docs: faults by kind, recoveries, time to
    caught-up."""
    s = report.schedule
    lines = [f"Seed {s.seed}, {s.duration / 60:g} minutes, epochs {_epochs(report)}, {len(landed(report))} faults of "
             f"{len({i.fault.kind for i in landed(report)})} kinds landed, {len(report.recoveries)} plans "
             f"({sum(r.replayed_in is not None for r in report.recoveries)} replayed to the end, the others "
             f"planned again after a fault stopped their replay); "
             + ("zero discrepancies" if report.ok else f"{len(report.discrepancies)} discrepancies")
             + f" (`{command(report)}`).", "",
             "| fault | landed | followed by a plan | caught up after it: median | longest |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {k.kind} | {k.faults} | {k.planned} | {_seconds(k.median)} | {_seconds(k.longest)} |"
              for k in by_kind(report)]
    sizes = sorted(r.reruns for r in report.recoveries)
    times = sorted(r.replayed_in for r in report.recoveries if r.replayed_in is not None)
    if sizes:
        lines += ["", f"Plans: {len(sizes)}, {sizes[0]} to {sizes[-1]} task instances re-run (median "
                      f"{statistics.median(sizes):g}); replays took {_seconds(times[0] if times else None)} to "
                      f"{_seconds(times[-1] if times else None)}. After the last epoch the soak caught up in "
                      f"{_seconds(report.caught_up_in)}."]
    return "\n".join(lines) + "\n"
