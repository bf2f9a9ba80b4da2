"""The soak's report: the schedule as it landed, each recovery, the checks, and how to replay it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from devstack.soak.run import SoakReport


def render(report: "SoakReport") -> str:
    """The report as printed at the end of ``make soak``."""
    s = report.schedule
    lines = ["", f"== soak report: seed {s.seed}, {s.duration / 60:g} minutes, {report.epochs} epochs", "",
             f"faults injected: {len(report.injected)} of {len(s.faults)} scheduled, "
             f"{len({i.fault.kind for i in report.injected})} kinds"]
    counts: dict[str, int] = {}
    for injected in report.injected:
        counts[injected.fault.kind] = counts.get(injected.fault.kind, 0) + 1
    lines += [f"  {kind:<18} {n:>3}" for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines += ["", "fault schedule (offset, fault, what it hit, the plans replayed after it):"]
    lines += [f"  {i.line()}" + (f"  -> {', '.join(i.recoveries)}" if i.recoveries else "") for i in report.injected]
    lines += ["", f"recoveries: {len(report.recoveries)}"]
    lines += [f"  {r.planned_at:7.0f}s  plan {r.plan_id}: {r.reruns} re-runs, "
              + (f"replayed in {r.replayed_in:.0f}s" if r.replayed_in is not None else "not finished")
              + (f" ({r.attempts} attempts)" if r.attempts > 1 else "") + f"  [{r.why}]" for r in report.recoveries]
    lines += ["", "time to caught-up after the last epoch: "
              + (f"{report.caught_up_in:.0f}s" if report.caught_up_in is not None else "NOT CAUGHT UP")]
    lines += ["", "checks:"] + [f"  {'ok  ' if ok else 'FAIL'} {name} ({detail})" for name, ok, detail in report.checks]
    verdict = "zero discrepancies" if report.ok else f"{len(report.discrepancies)} DISCREPANCIES"
    lines += ["", f"{verdict}; this schedule again: {s.command()}"]
    lines += [f"  {d}" for d in report.discrepancies]
    return "\n".join(lines)
