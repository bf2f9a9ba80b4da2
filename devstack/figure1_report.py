"""The main job's report: one HTML page with PNG charts, written beside the run's data.

* a timeline of epochs × tasks: what ran normally, what failed, what was blocked behind
  the failure, and what the recovery re-ran;
* the work each recovery strategy re-runs (task instances, and task-seconds at the
  measured cost of each task), Falkirk's frontier against clear-downstream and against
  restarting from scratch;
* the plan as a table, and the checks against the failure-free run.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from falkirk.policies.ids import ProcessorId

# Cell kinds of the timeline, in legend order.
KINDS = {"ran": ("ran once", "#38a169"), "failed": ("failed, then re-run by the recovery", "#e53e3e"),
         "blocked": ("held back by the failure, then run by the recovery", "#ed8936"),
         "rerun": ("ran, then re-run by the recovery", "#3182ce"), "missing": ("did not run", "#e2e8f0")}


@dataclass(frozen=True)
class Strategy:
    name: str
    instances: int
    task_seconds: float


def timeline_png(path: Path, tasks: Sequence[ProcessorId], epochs: Sequence[int],
                 kinds: Mapping[tuple[ProcessorId, int], str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * len(epochs), 0.9 + 0.55 * len(tasks)), dpi=110)
    for row, task in enumerate(tasks):
        for col, epoch in enumerate(epochs):
            kind = kinds.get((task, epoch), "missing")
            ax.add_patch(Rectangle((col + 0.05, row + 0.08), 0.9, 0.84, color=KINDS[kind][1]))
    ax.set_xlim(0, len(epochs))
    ax.set_ylim(len(tasks), 0)
    ax.set_xticks([i + 0.5 for i in range(len(epochs))], [str(e) for e in epochs])
    ax.set_yticks([i + 0.5 for i in range(len(tasks))], list(tasks))
    ax.set_xlabel("epoch (one DAG run each)")
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.legend(handles=[Patch(color=c, label=label) for label, c in KINDS.values()], loc="upper center",
              bbox_to_anchor=(0.5, -0.18 - 0.02 * len(tasks)), ncol=2, frameon=False, fontsize=8)
    ax.set_title("Task instances: normal runs, the failure, the re-runs")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def strategies_png(path: Path, strategies: Sequence[Strategy]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), dpi=110)
    names = [s.name for s in strategies]
    colours = ["#3182ce", "#ed8936", "#a0aec0"][: len(strategies)]
    for ax, values, label in ((axes[0], [s.instances for s in strategies], "task instances re-run"),
                              (axes[1], [s.task_seconds for s in strategies], "task-seconds re-run")):
        bars = ax.barh(names, values, color=colours)
        ax.invert_yaxis()
        ax.set_xlabel(label)
        for bar, v in zip(bars, values):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.0f}", va="center", fontsize=9)
        ax.set_xlim(0, max(values) * 1.2 or 1)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.suptitle("Work re-run by each recovery strategy")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(out: Path, *, dag_id: str, summary: str, plan_table: str, timeline: Path, strategies: Path,
                 checks: Sequence[tuple[str, bool, str]], facts: Sequence[tuple[str, str]]) -> Path:
    """The HTML page at ``out`` (charts referenced by relative path)."""
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in facts)
    check_rows = "".join(
        f"<tr><td>{'✔' if ok else '✘'}</td><td>{html.escape(name)}</td><td>{html.escape(detail)}</td></tr>"
        for name, ok, detail in checks)
    out.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Falkirk: {html.escape(dag_id)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1000px; margin: 2em auto; color: #1a202c; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 10px; border-bottom: 1px solid #e2e8f0; text-align: left; }}
pre {{ background: #f7fafc; padding: 1em; overflow-x: auto; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>Falkirk: {html.escape(dag_id)}</h1>
<p>{html.escape(summary)}</p>
<h2>Timeline</h2><img alt="epochs by tasks: normal runs, the failure, the re-runs" src="{timeline.name}">
<h2>Work re-run</h2><img alt="task instances and task-seconds re-run per strategy" src="{strategies.name}">
<h2>The plan</h2><pre>{html.escape(plan_table)}</pre>
<h2>Checks against the failure-free run</h2><table>{check_rows}</table>
<h2>Run</h2><table>{rows}</table>
</body></html>
""")
    return out
