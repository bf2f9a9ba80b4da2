// The Falkirk view: a React component that Airflow's UI renders as a tab of a DAG
// (props {dagId}) or of a task instance (props {dagId, runId, taskId}, preselected).
//
// It uses the React instance the Airflow UI exposes on globalThis, so it needs no build
// step: this file is the bundle. Data comes from the plugin's API under
// <base>/falkirk/api/v1, authenticated by the UI's own session cookie.
//
// Sections: the DAG graph coloured by regime; the failure picker; the plan (frontiers,
// re-run count next to clear-downstream's); the grid of epochs x tasks with checkpoint
// statuses and the re-run set highlighted; the roll-back-and-replay action with a
// confirmation; the process pairs (where each replica runs, take-overs and catch-ups); the
// history of recoveries, where an admin can release a dead executor's lease.

// Read by the browser test: ms since navigation started when Airflow's UI loaded this
// bundle, when the view mounted, and when the grid's visible window first rendered.
globalThis.__falkirkTimings = { evaluated: performance.now() };

const React = globalThis.React;
const h = React.createElement;
const { useCallback, useEffect, useMemo, useRef, useState } = React;

// Regimes colour the graph's nodes and the grid's row swatches in pale tints; checkpoint statuses
// colour the grid's cells in full ones: no colour means two things.
const REGIME_COLOURS = {
  ephemeral: "#e9d8fd",
  batch: "#b2f5ea",
  lazy_checkpoint: "#feebc8",
  eager_checkpoint: "#c6f6d5",
};
const STATUS_COLOURS = {
  G: "#718096", // garbage-collected
  D: "#2f855a", // durable
  S: "#d69e2e", // scratch only
  X: "#63171b", // lost: kept only on scratch, and the scratch files are gone
  L: "#3182ce", // logged outputs
  I: "#c53030", // invalidated by a recovery
  "-": "transparent", // missing
};
const RERUN = "#d53f8c";
const AIRFLOW_RINGS = { failed: "#e53e3e", running: "#805ad5", unrecorded: "#dd6b20" };
const NOT_MANAGED = "not managed (no regime: a plain Airflow task)";
const C = {
  fg: "var(--chakra-colors-fg, #1a202c)",
  muted: "var(--chakra-colors-fg-muted, #4a5568)",
  bg: "var(--chakra-colors-bg, #ffffff)",
  panel: "var(--chakra-colors-bg-subtle, #f7fafc)",
  border: "var(--chakra-colors-border, #cbd5e0)",
};

function apiUrl(path) {
  return new URL(`falkirk/api/v1/${path}`, document.baseURI).href;
}

async function api(path, options = {}) {
  const response = await fetch(apiUrl(path), {
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Falkirk-Request": "view" },
    ...options,
  });
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch (e) {
    body = { detail: text };
  }
  if (!response.ok) {
    const error = new Error(describeError(response.status, body));
    error.status = response.status;
    throw error;
  }
  return body;
}

function describeError(status, body) {
  const detail = body && body.detail;
  if (Array.isArray(detail)) {
    return `${status}: ` + detail.map((d) => `${(d.loc || []).slice(1).join(".") || "body"}: ${d.msg}`).join("; ");
  }
  return `${status}: ${detail || "request failed"}`;
}

const key = (task, epoch) => `${task}\u0000${epoch}`;

// -- small building blocks -------------------------------------------------------------------

function Panel({ title, testid, children, right }) {
  return h(
    "section",
    { "data-testid": testid, style: { border: `1px solid ${C.border}`, borderRadius: 8, padding: 12, background: C.panel, minWidth: 0 } },
    h(
      "div",
      { style: { display: "flex", justifyContent: "space-between", alignItems: "center", marginBottom: 8 } },
      h("h3", { style: { fontWeight: 600, fontSize: 15, margin: 0 } }, title),
      right || null,
    ),
    children,
  );
}

function Button({ children, onClick, disabled, primary, testid, title }) {
  return h(
    "button",
    {
      type: "button",
      onClick,
      disabled,
      title,
      "data-testid": testid,
      style: {
        padding: "6px 12px",
        borderRadius: 6,
        border: `1px solid ${primary ? RERUN : C.border}`,
        background: primary && !disabled ? RERUN : "transparent",
        color: primary && !disabled ? "#ffffff" : C.fg,
        opacity: disabled ? 0.5 : 1,
        cursor: disabled ? "not-allowed" : "pointer",
        fontSize: 13,
      },
    },
    children,
  );
}

function Swatch({ colour, outline, dashed }) {
  return h("span", {
    style: {
      display: "inline-block",
      width: 12,
      height: 12,
      borderRadius: 3,
      background: colour,
      border: `${outline ? 2 : 1}px ${dashed ? "dashed" : "solid"} ${outline || C.border}`,
      verticalAlign: "middle",
      marginRight: 4,
    },
  });
}

function Legend({ statuses }) {
  const item = (children, k) => h("span", { key: k, "data-testid": `legend-${k}`, style: { marginRight: 14, whiteSpace: "nowrap" } }, ...children);
  const group = (testid, title, items) =>
    h("div", { key: testid, "data-testid": testid, style: { display: "flex", flexWrap: "wrap", rowGap: 4, alignItems: "center" } },
      h("span", { style: { fontWeight: 600, marginRight: 8, minWidth: 170 } }, title), ...items);
  const ring = (colour) => h(Swatch, { colour: "transparent", outline: colour });
  return h(
    "div",
    { "data-testid": "falkirk-legend", style: { fontSize: 12, color: C.muted, display: "grid", rowGap: 4 } },
    group("legend-regimes", "Regime (node, row swatch)", [
      ...Object.entries(REGIME_COLOURS).map(([name, colour]) =>
        item([h(Swatch, { colour }), name.replace("_", " ")], `regime-${name}`)),
      item([h(Swatch, { colour: "transparent", dashed: true, outline: C.muted }), "not managed"], "regime-none"),
      item(["keeps 1-2, 4 (under a node): the epochs the plan shown keeps as they are"], "keeps"),
    ]),
    group("legend-statuses", "Checkpoint (grid cell)", [
      ...statuses.map((s) => item([h(Swatch, { colour: STATUS_COLOURS[s.code] }), s.label], `status-${s.code}`)),
      item([h("span", { style: { display: "inline-block", width: 12, height: 3, marginRight: 4, verticalAlign: "middle",
        background: STATUS_COLOURS.D } }), "checkpointed part-way into the epoch (hover: how far)"], "status-partial"),
    ]),
    group("legend-airflow", "Airflow (ring inside a cell)", [
      item([ring(AIRFLOW_RINGS.failed), "failed"], "airflow-failed"),
      item([ring(AIRFLOW_RINGS.running), "queued or running"], "airflow-running"),
      item([h(Swatch, { colour: "transparent", outline: AIRFLOW_RINGS.running, dashed: true }), "waiting (not started, or blocked)"], "airflow-waiting"),
      item([h(Swatch, { colour: "transparent", outline: AIRFLOW_RINGS.failed, dashed: true }), "upstream failed"], "airflow-upstream-failed"),
      item([ring(AIRFLOW_RINGS.unrecorded), UNRECORDED], "airflow-unrecorded"),
    ]),
    group("legend-plan", "Recovery (cell border, dot)", [
      item([h(Swatch, { colour: "transparent", outline: RERUN }), "re-run by the plan shown"], "rerun"),
      item([h(Swatch, { colour: "transparent", outline: C.muted, dashed: true }), "clear-downstream only"], "clear"),
      item([h("span", { style: { color: RERUN, marginRight: 4 } }, "\u25CF"), "re-run by the last recovery"], "reran"),
    ]),
  );
}

// -- the DAG graph ---------------------------------------------------------------------------

function layout(tasks) {
  const layer = {};
  for (const t of tasks) {
    // tasks arrive in topological order
    layer[t.task_id] = t.upstream.length ? 1 + Math.max(...t.upstream.map((u) => layer[u] ?? 0)) : 0;
  }
  const rows = {};
  const pos = {};
  for (const t of tasks) {
    const l = layer[t.task_id];
    rows[l] = (rows[l] || 0) + 1;
    pos[t.task_id] = { x: 10 + l * 170, y: 10 + (rows[l] - 1) * 52 }; // a node and the line under it
  }
  const width = 10 + (Math.max(0, ...Object.values(layer)) + 1) * 170;
  const height = 10 + Math.max(1, ...Object.values(rows)) * 52;
  return { pos, width, height };
}

function Graph({ tasks, plan, view }) {
  const { pos, width, height } = useMemo(() => layout(tasks), [tasks]);
  const frontier = useMemo(() => Object.fromEntries((plan?.tasks || []).map((t) => [t.task_id, t])), [plan]);
  // a partitioned task's node speaks for its partitions: how many the plan rolls back
  const partitionsRerun = (t) => (plan?.tasks || []).filter((f) => f.task_id.startsWith(`${t.task_id}[`) && f.rerun.length).length;
  const W = 140;
  const H = 28;
  return h(
    "div",
    { style: { overflow: "auto", maxHeight: 320, width: "100%" } },
    h(
      "svg",
      { width, height, "data-testid": "falkirk-graph", role: "img", "aria-label": "DAG coloured by regime" },
      ...tasks.flatMap((t) =>
        t.upstream.map((u) =>
          h("line", {
            key: `${u}->${t.task_id}`,
            x1: pos[u].x + W, y1: pos[u].y + H / 2, x2: pos[t.task_id].x, y2: pos[t.task_id].y + H / 2,
            stroke: C.muted, strokeWidth: 1.2,
          }),
        ),
      ),
      ...tasks.map((t) => {
        const p = pos[t.task_id];
        const f = frontier[t.task_id];
        const reruns = t.partitions ? partitionsRerun(t) > 0 : f && f.rerun.length > 0;
        return h(
          "g",
          { key: t.task_id, "data-testid": `graph-node-${t.task_id}`, "data-regime": t.regime_name || "none" },
          h("title", null, `${t.task_id}: ${t.regime || NOT_MANAGED}` +
            (f ? `; the plan keeps ${keptText(f, plan, view)}` : "")),
          h("rect", {
            x: p.x, y: p.y, width: W, height: H, rx: 6,
            fill: REGIME_COLOURS[t.regime_name] || "transparent",
            stroke: reruns ? RERUN : C.border, strokeWidth: reruns ? 3 : 1,
            strokeDasharray: t.regime_name ? undefined : "4 3",
          }),
          h("text", { x: p.x + 8, y: p.y + 18, fontSize: 12, fill: "#1a202c", "data-testid": `graph-label-${t.task_id}` },
            t.task_id.length > 19 ? t.task_id.slice(0, 18) + "…" : t.task_id),
          // under the node, never over its label: what a recovery keeps, or that Falkirk leaves it alone
          f || !t.regime_name || (plan && t.partitions)
            ? h("text", { x: p.x + 4, y: p.y + H + 11, fontSize: 10, fill: C.muted, "data-testid": `graph-badge-${t.task_id}` },
              !t.regime_name ? "not managed" : t.partitions ? `${partitionsRerun(t)}/${t.partitions} partitions re-run`
                : `keeps ${keptText(f, plan, view)}`)
            : null,
        );
      }),
    ),
  );
}

function keptText(t, plan, view) {
  const kept = planCells(t, plan, view).kept;
  return kept.length ? span(kept) : "none";
}

// -- the failure picker ----------------------------------------------------------------------

function FailurePicker({ view, selection, setSelection }) {
  const [scratch, setScratch] = useState(view.scratch_locations[0] || "");
  const [worker, setWorker] = useState((view.workers || [])[0] || "");
  const suggested = selection.suggested;
  // a plain Airflow task has no epochs to redo; a partitioned task's epoch may be bad in one
  // partition (task[i]) or in all of them (the task's own name)
  const managed = view.tasks.filter((t) => t.regime_name).flatMap((t) =>
    [{ task_id: t.task_id }, ...gridRows(view).filter((r) => t.partitions && r.task_id === t.task_id).map((r) => ({ task_id: r.row_id }))]);
  const [badTask, setBadTask] = useState(suggested?.task_id || managed[0]?.task_id || "");
  const [badEpoch, setBadEpoch] = useState(String(suggested?.epoch || view.last_run_epoch || view.last_epoch || 1));
  const toggleFailed = (f) => {
    const k = key(f.task_id, f.epoch);
    const failed = new Map(selection.failed);
    failed.has(k) ? failed.delete(k) : failed.set(k, { task_id: f.task_id, epoch: f.epoch });
    setSelection({ ...selection, failed });
  };
  const chip = (label, onRemove, testid) =>
    h(
      "span",
      { key: testid, "data-testid": testid, style: { border: `1px solid ${C.border}`, borderRadius: 12, padding: "2px 8px", marginRight: 6, fontSize: 12 } },
      label, " ",
      h("button", { type: "button", onClick: onRemove, "aria-label": `remove ${label}`, style: { color: C.muted } }, "×"),
    );
  const failedChoices = new Map(view.failed.map((f) => [key(f.task_id, f.epoch), f]));
  for (const [k, f] of selection.failed) if (!failedChoices.has(k)) failedChoices.set(k, f);
  return h(
    "div",
    { style: { display: "grid", gap: 10, fontSize: 13 } },
    h(
      "div",
      { "data-testid": "failed-choices" },
      h("div", { style: { color: C.muted, marginBottom: 4 } }, "Failed task instances (from Airflow)"),
      failedChoices.size === 0
        ? h("div", { style: { color: C.muted } }, "Airflow reports no failed task instance of this DAG.")
        : [...failedChoices.entries()].map(([k, f]) =>
            h(
              "label",
              { key: k, style: { marginRight: 14, whiteSpace: "nowrap" } },
              h("input", {
                type: "checkbox",
                checked: selection.failed.has(k),
                onChange: () => toggleFailed(f),
                "data-testid": `failed-${f.task_id}-${f.epoch}`,
              }),
              ` ${f.task_id} @ epoch ${f.epoch}`,
              f.why ? h("span", { title: f.why, style: { color: "#c05621" }, "data-testid": `unrecorded-${f.task_id}-${f.epoch}` }, " (success without ledger row)") : null,
            ),
          ),
    ),
    h(
      "div",
      null,
      h("span", { style: { color: C.muted, marginRight: 6 } }, "Lost scratch location"),
      h(
        "select",
        { value: scratch, onChange: (e) => setScratch(e.target.value), "data-testid": "scratch-select", style: { background: C.bg, color: C.fg, maxWidth: 420 } },
        ...view.scratch_locations.map((l) => h("option", { key: l, value: l }, l)),
      ),
      " ",
      h(Button, {
        testid: "add-scratch",
        onClick: () => !selection.lost.includes(scratch) && setSelection({ ...selection, lost: [...selection.lost, scratch] }),
      }, "Add"),
    ),
    (view.workers || []).length
      ? h(
          "div",
          null,
          h("span", { style: { color: C.muted, marginRight: 6 } }, "Lost worker"),
          h(
            "select",
            { value: worker, onChange: (e) => setWorker(e.target.value), "data-testid": "worker-select", style: { background: C.bg, color: C.fg } },
            ...view.workers.map((w) => h("option", { key: w, value: w }, w)),
          ),
          " ",
          h(Button, {
            testid: "add-worker",
            onClick: () => !selection.workers.includes(worker) && setSelection({ ...selection, workers: [...selection.workers, worker] }),
          }, "Add"),
          h("span", { style: { color: C.muted, marginLeft: 8 } }, "(every scratch table it kept is gone)"),
        )
      : null,
    h(
      "div",
      null,
      h("span", { style: { color: C.muted, marginRight: 6 } }, "Bad epoch"),
      h(
        "select",
        { value: badTask, onChange: (e) => setBadTask(e.target.value), "data-testid": "bad-task", style: { background: C.bg, color: C.fg } },
        ...managed.map((t) => h("option", { key: t.task_id, value: t.task_id }, t.task_id)),
      ),
      " epoch ",
      h("input", {
        type: "number", min: 1, max: view.last_epoch, value: badEpoch, "data-testid": "bad-epoch",
        onChange: (e) => setBadEpoch(e.target.value), style: { width: 70, background: C.bg, color: C.fg },
      }),
      " ",
      h(Button, {
        testid: "add-bad-epoch",
        onClick: () => setSelection({ ...selection, bad: [...selection.bad, { task_id: badTask, epoch: Number(badEpoch) }] }),
      }, "Add"),
    ),
    h(
      "div",
      { "data-testid": "selected-failures" },
      ...selection.lost.map((l) =>
        chip(`lost ${l}`, () => setSelection({ ...selection, lost: selection.lost.filter((x) => x !== l) }), `chip-lost-${l}`),
      ),
      ...selection.workers.map((w) =>
        chip(`lost worker ${w}`, () => setSelection({ ...selection, workers: selection.workers.filter((x) => x !== w) }), `chip-worker-${w}`),
      ),
      ...selection.bad.map((b, i) =>
        chip(`bad ${b.task_id} @ ${b.epoch}`, () => setSelection({ ...selection, bad: selection.bad.filter((_, j) => j !== i) }), `chip-bad-${i}`),
      ),
    ),
  );
}

function failureBody(selection) {
  return {
    failed_tasks: [...selection.failed.values()],
    lost_scratch: selection.lost,
    lost_workers: selection.workers,
    bad_epochs: selection.bad,
  };
}

const emptySelection = () => ({ failed: new Map(), lost: [], workers: [], bad: [], suggested: null });

// -- the plan and the grid -------------------------------------------------------------------

function PlanSummary({ plan, error, loading, order, view }) {
  if (error) return h("div", { role: "alert", "data-testid": "preview-error", style: { color: "#e53e3e" } }, error);
  if (loading && !plan) return h("div", { style: { color: C.muted } }, "Computing the frontiers…");
  if (!plan) return h("div", { "data-testid": "preview-empty", style: { color: C.muted } }, "Pick a failure to see what a recovery would do.");
  const cell = { padding: "2px 10px", borderBottom: `1px solid ${C.border}`, textAlign: "left" };
  return h(
    "div",
    { "data-testid": "plan", "data-plan-id": plan.plan_id, style: { fontSize: 13 } },
    h(
      "div",
      { style: { marginBottom: 8, fontSize: 14 } },
      h("b", { "data-testid": "rerun-count" }, plan.rerun_count),
      " task instances re-run; ",
      (plan.clear_downstream_misses || []).length
        ? h("span", { "data-testid": "clear-cannot" }, "clear-downstream could not recover (it would re-run ",
            h("b", { "data-testid": "clear-count" }, plan.clear_downstream_count),
            ` but not ${plan.clear_downstream_misses.length} re-runs this plan needs)`)
        : h("span", null, "clear-downstream would re-run ", h("b", { "data-testid": "clear-count" }, plan.clear_downstream_count)),
      ` (plan ${plan.plan_id}: ${plan.failures.join("; ")})`,
    ),
    h("div", { style: { color: C.muted, marginBottom: 6 } },
      `Of epochs 1..${plan.last_epoch}, each task keeps the epochs listed as kept, re-runs the listed ones in ` +
      `order, and runs the ones that have not run yet as Airflow schedules them.`),
    h(
      "table",
      { style: { borderCollapse: "collapse" } },
      h("thead", null, h("tr", null, ...["task", "regime", "keeps epochs", "re-runs", "not run yet", "restores", "clear-downstream re-runs"].map((c) => h("th", { key: c, style: cell }, c)))),
      h(
        "tbody",
        null,
        ...[...plan.tasks].sort((a, b) => (order[a.task_id] ?? 1e9) - (order[b.task_id] ?? 1e9)).map((t) =>
          h(
            "tr",
            { key: t.task_id, "data-testid": `frontier-${t.task_id}`, "data-frontier": t.frontier },
            h("td", { style: cell }, t.task_id),
            h("td", { style: cell }, t.regime),
            h("td", { style: cell, "data-testid": `kept-${t.task_id}` }, span(planCells(t, plan, view).kept)),
            h("td", { style: cell }, span(t.rerun)),
            h("td", { style: cell, "data-testid": `not-run-${t.task_id}` }, span(planCells(t, plan, view).notRun)),
            h("td", { style: cell }, t.restores || (t.rerun.length ? "-" : "")),
            h("td", { style: cell }, span(t.clear_downstream)),
          ),
        ),
      ),
    ),
    h(AcrossDags, { plan, cell }),
  );
}

// The DAGs that read, through an Asset, an epoch this plan redoes: the recovery re-runs them
// too, one DAG after the other once this one's redone epochs are committed.
function AcrossDags({ plan, cell }) {
  const across = plan.across || [];
  if (!across.length) return null;
  const more = across.reduce((n, p) => n + p.rerun_count, 0);
  return h(
    "div",
    { "data-testid": "across", style: { marginTop: 12 } },
    h("div", { style: { fontSize: 14, marginBottom: 4 } },
      h("b", { "data-testid": "across-count" }, more),
      ` more task instances re-run in ${across.length === 1 ? "another DAG" : `${across.length} other DAGs`}: ` +
      `they read, through an Asset, epochs this plan redoes. Each replays after the DAG it reads from. ` +
      `(Airflow's clear-downstream stops at this DAG and would leave them as they are.)`),
    h(
      "table",
      { style: { borderCollapse: "collapse" } },
      h("thead", null, h("tr", null, ...["DAG", "task", "keeps epochs", "re-runs", "restores", "you"].map((c) => h("th", { key: c, style: cell }, c)))),
      h(
        "tbody",
        null,
        ...across.flatMap((p) => p.tasks.filter((t) => t.rerun.length).map((t, i) =>
          h(
            "tr",
            { key: `${p.dag_id}-${t.task_id}`, "data-testid": `across-${p.dag_id}-${t.task_id}`, "data-rerun": t.rerun.join(",") },
            h("td", { style: cell }, i === 0 ? h("a", { href: new URL(`dags/${encodeURIComponent(p.dag_id)}/plugin/falkirk`, document.baseURI).href }, p.dag_id) : ""),
            h("td", { style: cell }, t.task_id),
            h("td", { style: cell }, t.frontier > 0 ? `1-${t.frontier}` : "-"),
            h("td", { style: cell }, span(t.rerun)),
            h("td", { style: cell }, t.restores || "-"),
            h("td", { style: { ...cell, color: p.may_replay ? C.muted : "#e53e3e" }, "data-testid": `across-may-${p.dag_id}` },
              i === 0 ? (p.may_replay ? "may replay it" : "may not clear its task instances") : ""),
          ))),
      ),
    ),
  );
}

// What a plan does with each epoch of a task, from the grid: it keeps the committed epochs it
// does not re-run (a stateless task keeps epochs after the one it redoes), re-runs its re-run
// set, and leaves the rest, which never committed (a blocked run, say), to run as Airflow
// schedules them once the re-runs are done.
function planCells(t, plan, view) {
  const rerun = new Set(t.rerun);
  const codes = view.status[t.task_id] || "";
  const kept = [];
  const notRun = [];
  for (let e = 1; e <= plan.last_epoch; e++) {
    if (rerun.has(e)) continue;
    const code = codes[e - view.first_epoch] || "-";
    (code === "-" || code === "I" ? notRun : kept).push(e);
  }
  return { kept, notRun };
}

function span(epochs) {
  if (!epochs.length) return "-";
  const parts = [];
  let start = epochs[0];
  let prev = start;
  for (const e of [...epochs.slice(1), null]) {
    if (e !== prev + 1) {
      parts.push(start === prev ? `${start}` : `${start}-${prev}`);
      start = e;
    }
    prev = e;
  }
  return parts.join(", ");
}

// The grid renders only the epochs in view (plus a margin) and scrolls to the latest epochs
// first, so a DAG with a long history costs what its visible part costs.
const GRID_CSS = `
.fk-cell { position: absolute; box-sizing: border-box; border-radius: 2px; border: 1px solid ${C.border}; }
.fk-G { background: ${STATUS_COLOURS.G}; } .fk-D { background: ${STATUS_COLOURS.D}; }
.fk-S { background: ${STATUS_COLOURS.S}; } .fk-L { background: ${STATUS_COLOURS.L}; }
.fk-I { background: ${STATUS_COLOURS.I}; } .fk-X { background: ${STATUS_COLOURS.X}; }
.fk-rerun { border: 2px solid ${RERUN}; }
.fk-clear { border: 1px dashed ${C.muted}; }
.fk-failed { box-shadow: inset 0 0 0 2px ${AIRFLOW_RINGS.failed}; }
.fk-running { box-shadow: inset 0 0 0 2px ${AIRFLOW_RINGS.running}; }
.fk-unrecorded { box-shadow: inset 0 0 0 2px ${AIRFLOW_RINGS.unrecorded}; }
.fk-upstream-failed { outline: 2px dashed ${AIRFLOW_RINGS.failed}; outline-offset: -3px; }
.fk-waiting { outline: 2px dashed ${AIRFLOW_RINGS.running}; outline-offset: -3px; }
.fk-partial::before { content: ""; position: absolute; left: 1px; right: 1px; bottom: 1px; height: 3px;
  background: ${STATUS_COLOURS.D}; }
.fk-reran::after { content: ""; position: absolute; right: 1px; top: 1px; width: 6px; height: 6px; border-radius: 3px;
  background: ${RERUN}; border: 1px solid #ffffff; }
`;
// Airflow says success, the ledger has no row (plugins/view.py UNRECORDED): it must run again.
const UNRECORDED = "success without ledger row";
// Not started: cleared, scheduled, waiting for a retry, or blocked (depends_on_past, max_active_runs).
const WAITING = ["cleared", "scheduled", "up_for_retry", "restarting"];
const LABEL = 170;
const MARGIN = 12; // epochs rendered beyond each edge of the visible window

// A collapsed partitioned task's cell: the status most in need of attention among its partitions.
const SUMMARY_ORDER = ["X", "-", "I", "S", "L", "D", "G"];
const STATE_ORDER = ["failed", "upstream_failed", "running", "queued", UNRECORDED, "cleared", "scheduled", "up_for_retry", "restarting"];

// The grid's rows: a task, or each partition of a partitioned one (``task[i]``).
function gridRows(view) {
  return view.rows || view.tasks.map((t) => ({ row_id: t.task_id, task_id: t.task_id, partition: null }));
}

function Grid({ view, plan }) {
  const [collapsed, setCollapsed] = useState(new Set());
  const rerun = useMemo(() => new Set((plan?.rerun || []).map(([t, e]) => key(t, e))), [plan]);
  // The latest recovery that finished: its re-runs are marked, so the grid says what it redid.
  const lastRecovery = view.recoveries.find((r) => r.outcome === "finished");
  const reran = useMemo(() => new Set((lastRecovery?.rerun || []).map(([t, e]) => key(t, e))), [lastRecovery]);
  const clear = useMemo(() => new Set((plan?.clear_downstream || []).map(([t, e]) => key(t, e))), [plan]);
  const labels = useMemo(() => Object.fromEntries(view.statuses.map((s) => [s.code, s.label])), [view]);
  const count = view.last_epoch - view.first_epoch + 1;
  const cell = count <= 60 ? 22 : 14;
  const scroller = useRef(null);
  const [windowX, setWindowX] = useState({ left: Number.MAX_SAFE_INTEGER, width: 1200 });
  useEffect(() => {
    const el = scroller.current;
    if (!el) return;
    el.scrollLeft = el.scrollWidth; // the latest epochs first
    setWindowX({ left: el.scrollLeft, width: el.clientWidth });
  }, [count]);
  useEffect(() => {
    const timings = globalThis.__falkirkTimings;
    if (timings && timings.grid === undefined && windowX.left !== Number.MAX_SAFE_INTEGER) timings.grid = performance.now();
  }, [windowX]);
  const onScroll = (e) => setWindowX({ left: e.currentTarget.scrollLeft, width: e.currentTarget.clientWidth });
  const first = Math.max(0, Math.floor(windowX.left / cell) - MARGIN);
  const last = Math.min(count - 1, Math.ceil((windowX.left + windowX.width - LABEL) / cell) + MARGIN);
  const shown = [];
  for (let i = Math.min(first, Math.max(0, count - 1)); i <= last; i++) shown.push(i);
  const every = count <= 60 ? 1 : 5;
  // rows as wide as their cells, so the sticky task labels stay in view however far it scrolls
  const rowStyle = { display: "flex", alignItems: "center", height: cell, width: LABEL + count * cell };
  const label = (content, k) =>
    h("div", { key: k, style: { width: LABEL, flex: "none", position: "sticky", left: 0, background: C.panel, zIndex: 1, fontSize: 12, lineHeight: `${cell}px`,
      overflow: "hidden", textOverflow: "ellipsis", whiteSpace: "nowrap" } }, content);
  const header = h(
    "div",
    { style: rowStyle },
    label(h("span", { style: { fontSize: 11, color: C.muted } }, "task \\ epoch"), "label"),
    h("div", { style: { position: "relative", width: count * cell, height: cell, flex: "none" } },
      ...shown.map((i) => {
        const e = view.first_epoch + i;
        return e % every === 0 || e === view.first_epoch
          ? h("div", { key: e, style: { position: "absolute", left: i * cell, width: cell * every, fontSize: 10, color: C.muted } }, e)
          : null;
      })),
  );
  // One row per task, or per partition of a partitioned task under a header that collapses its
  // partitions into one summary row (a cell there re-runs if any partition's does).
  const cellsOf = (members, rowKey) =>
    h("div", { style: { position: "relative", width: count * cell, height: cell, flex: "none" } },
      ...shown.map((i) => {
        const e = view.first_epoch + i;
        const codes = members.map((m) => (view.status[m] || "")[i] || "-");
        const code = codes.every((c) => c === codes[0]) ? codes[0] : SUMMARY_ORDER.find((c) => codes.includes(c));
        const keys = members.map((m) => key(m, e));
        const hits = keys.filter((k) => rerun.has(k)).length;
        const isRerun = hits > 0;
        const isClear = !isRerun && keys.some((k) => clear.has(k));
        const states = members.map((m) => (view.airflow_states[m] || {})[String(e)]).filter(Boolean);
        const state = STATE_ORDER.find((s) => states.includes(s)) || states[0];
        const classes = ["fk-cell", `fk-${code}`];
        const wasRerun = keys.some((k) => reran.has(k));
        if (wasRerun) classes.push("fk-reran");
        if (isRerun) classes.push("fk-rerun");
        else if (isClear) classes.push("fk-clear");
        if (state === "failed") classes.push("fk-failed");
        else if (state === "upstream_failed") classes.push("fk-upstream-failed");
        else if (state === "running" || state === "queued") classes.push("fk-running");
        else if (WAITING.includes(state)) classes.push("fk-waiting");
        else if (state === UNRECORDED) classes.push("fk-unrecorded");
        const part = members.length > 1 ? `; ${hits} of ${members.length} partitions re-run by the plan` : "";
        // how far an uncommitted epoch got inside itself (checkpoints at (epoch, step))
        const progress = members.length === 1 ? ((view.progress || {})[members[0]] || {})[String(e)] : undefined;
        if (progress) classes.push("fk-partial");
        return h("div", {
          key: e,
          className: classes.join(" "),
          "data-testid": `cell-${rowKey}-${e}`,
          "data-status": code,
          "data-rerun": isRerun ? "true" : undefined,
          "data-reran": wasRerun ? lastRecovery.plan_id : undefined,
          "data-airflow-state": state,
          "data-progress": progress,
          title: `${rowKey} @ epoch ${e}: ${labels[code]}${state ? `; Airflow: ${state}` : ""}` +
            (progress ? `; got to ${progress} (checkpointed)` : "") +
            (members.length > 1 ? part : isRerun ? "; re-run by the plan" : isClear ? "; clear-downstream would re-run it" : "") +
            (wasRerun ? `; re-run by recovery ${lastRecovery.plan_id} (${lastRecovery.by})` : ""),
          style: { left: i * cell + 1, top: 1, width: cell - 2, height: cell - 2 },
        });
      }));
  const swatch = (t) => h(Swatch, { key: "s", colour: REGIME_COLOURS[t.regime_name] || "transparent", dashed: !t.regime_name });
  const rows = [];
  for (const t of view.tasks) {
    const members = gridRows(view).filter((r) => r.task_id === t.task_id);
    if (!t.partitions) {
      rows.push(h(
        "div",
        { key: t.task_id, style: rowStyle, "data-testid": `grid-row-${t.task_id}` },
        label(h("span", { title: `${t.task_id}: ${t.regime || NOT_MANAGED}` }, swatch(t), t.task_id), "label"),
        !t.regime_name
          ? h("div", { "data-testid": `grid-unmanaged-${t.task_id}`, style: { fontSize: 11, color: C.muted, position: "sticky", left: LABEL } },
            "not managed by Falkirk: Airflow alone runs it")
          : cellsOf([t.task_id], t.task_id),
      ));
      continue;
    }
    const open = !collapsed.has(t.task_id);
    const toggle = h("button", {
      key: "t", type: "button", "data-testid": `toggle-${t.task_id}`, "aria-expanded": String(open),
      title: open ? "collapse the partitions into one row" : "show each partition",
      onClick: () => { const next = new Set(collapsed); open ? next.add(t.task_id) : next.delete(t.task_id); setCollapsed(next); },
      style: { border: "none", background: "transparent", cursor: "pointer", padding: 0, marginRight: 4, color: C.fg },
    }, open ? "▾" : "▸");
    const title = h("span", { title: `${t.task_id}: ${t.regime}, ${t.partitions} partitions` }, toggle, swatch(t), t.task_id,
      h("span", { style: { color: C.muted } }, ` ×${t.partitions}`));
    rows.push(h("div", { key: t.task_id, style: rowStyle, "data-testid": `grid-task-${t.task_id}`, "data-partitions": t.partitions },
      label(title, "label"), open ? null : cellsOf(members.map((r) => r.row_id), t.task_id)));
    if (open) {
      for (const r of members) {
        rows.push(h("div", { key: r.row_id, style: rowStyle, "data-testid": `grid-row-${r.row_id}` },
          label(h("span", { title: r.replica ? `${r.replica}: replica ${r.replica.slice(-1)} of partition ${r.partition} of ${t.task_id} (task instance ${r.row_id})`
            : `${r.row_id}: partition ${r.partition} of ${t.task_id}`, style: { paddingLeft: 18 } },
            r.replica ? r.replica.slice(t.task_id.length) : `[${r.partition}]`), "label"),
          cellsOf([r.row_id], r.row_id)));
      }
    }
  }
  return h("div", { "data-testid": "falkirk-grid", "data-epochs": count },
    h("style", null, GRID_CSS),
    h("div", { ref: scroller, onScroll, style: { overflow: "auto", maxHeight: 520, width: "100%" } }, header, ...rows));
}

// -- recovery: confirmation and history ------------------------------------------------------

function ConfirmDialog({ plan, onCancel, onConfirm, busy }) {
  const byEpoch = {};
  for (const [t, e] of plan.rerun) (byEpoch[e] = byEpoch[e] || []).push(t);
  return h(
    "div",
    { role: "dialog", "aria-modal": "true", "data-testid": "confirm-dialog",
      style: { position: "fixed", inset: 0, background: "rgba(0,0,0,0.45)", display: "flex", alignItems: "center", justifyContent: "center", zIndex: 1400 } },
    h(
      "div",
      { style: { background: C.bg, color: C.fg, border: `1px solid ${C.border}`, borderRadius: 8, padding: 20, maxWidth: 640, maxHeight: "80vh", overflow: "auto" } },
      h("h3", { style: { fontWeight: 600, fontSize: 16, marginTop: 0 } }, `Roll back and replay ${plan.dag_id}?`),
      h("p", null, `Failures: ${plan.failures.join("; ")}.`),
      h("p", { "data-testid": "confirm-summary" },
        `This rolls ${plan.tasks.filter((t) => t.rerun.length).map((t) => `${t.task_id} back to ${t.frontier > 0 ? `epoch ${t.frontier}` : "empty state"}`).join(", ")} ` +
        `and clears ${plan.rerun_count} task instances; Airflow re-runs them in epoch order. ` +
        ((plan.clear_downstream_misses || []).length
          ? `Clear-downstream could not have recovered this: it would have re-run ${plan.clear_downstream_count} ` +
            `but not the ${plan.clear_downstream_misses.length} re-runs this plan needs before them.`
          : `Clear-downstream would have re-run ${plan.clear_downstream_count}.`)),
      h("ul", { style: { fontSize: 13, margin: "8px 0 16px 16px", listStyle: "disc" } },
        ...Object.keys(byEpoch).sort((a, b) => a - b).map((e) => h("li", { key: e }, `epoch ${e}: ${byEpoch[e].sort().join(", ")}`))),
      (plan.across || []).length ? h("p", { "data-testid": "confirm-across" },
        `Then, once those are committed: ${plan.across.map((p) => `${p.dag_id}, ${p.rerun_count} task instances`).join("; ")}.`) : null,
      h("div", { style: { display: "flex", gap: 8, justifyContent: "flex-end" } },
        h(Button, { onClick: onCancel, testid: "confirm-cancel" }, "Cancel"),
        h(Button, { onClick: onConfirm, primary: true, disabled: busy, testid: "confirm-replay" }, busy ? "Starting…" : "Roll back and replay")),
    ),
  );
}

// Releasing a lease by hand: for an executor known to be dead (audited with the reason).
function ReleaseDialog({ recovery, onCancel, onConfirm, busy, error }) {
  const [reason, setReason] = useState("");
  return h(
    "div",
    { role: "dialog", "aria-modal": "true", "data-testid": "release-dialog",
      style: { position: "fixed", inset: 0, background: "rgba(0,0,0,0.45)", display: "flex", alignItems: "center", justifyContent: "center", zIndex: 1400 } },
    h(
      "div",
      { style: { background: C.bg, color: C.fg, border: `1px solid ${C.border}`, borderRadius: 8, padding: 20, maxWidth: 560 } },
      h("h3", { style: { fontWeight: 600, fontSize: 16, marginTop: 0 } }, `Release the lease of recovery ${recovery.plan_id}?`),
      h("p", null, `${recovery.by} holds it (expires at ${(recovery.expires_at || "?").replace("T", " ").slice(0, 19)} unless renewed). ` +
        "Release it only if its executor is dead: a live one stops at its next renewal. Replaying the plan again resumes it."),
      h("label", { style: { display: "block", fontSize: 13, marginBottom: 4 } }, "Reason (recorded in the recovery log)"),
      h("input", { "data-testid": "release-reason", value: reason, maxLength: 2000, onChange: (e) => setReason(e.target.value),
        style: { width: "100%", padding: 6, border: `1px solid ${C.border}`, borderRadius: 6, background: "transparent", color: C.fg } }),
      error ? h("div", { role: "alert", "data-testid": "release-error", style: { color: "#e53e3e", marginTop: 8 } }, error) : null,
      h("div", { style: { display: "flex", gap: 8, justifyContent: "flex-end", marginTop: 16 } },
        h(Button, { onClick: onCancel, testid: "release-cancel" }, "Cancel"),
        h(Button, { onClick: () => onConfirm(reason), primary: true, disabled: busy || !reason.trim(), testid: "release-confirm" },
          busy ? "Releasing…" : "Release the lease")),
    ),
  );
}

function History({ recoveries, canRelease, onRelease }) {
  if (!recoveries.length) return h("div", { "data-testid": "history-empty", style: { color: C.muted, fontSize: 13 } }, "No recovery has run on this DAG.");
  const cell = { padding: "2px 10px", borderBottom: `1px solid ${C.border}`, textAlign: "left" };
  return h(
    "table",
    { "data-testid": "history", style: { borderCollapse: "collapse", fontSize: 13 } },
    h("thead", null, h("tr", null, ...["plan", "failures", "re-runs (clear-downstream)", "by", "started", "ended", "outcome", ""].map((c, i) => h("th", { key: i, style: cell }, c)))),
    h("tbody", null, ...recoveries.map((r) =>
      h("tr", { key: r.plan_id, "data-testid": `history-${r.plan_id}`, "data-outcome": r.outcome },
        h("td", { style: cell }, r.plan_id),
        h("td", { style: cell }, r.failures.join("; "),
          (r.across || []).length ? h("div", { "data-testid": `history-across-${r.plan_id}`, style: { color: C.muted } },
            `with ${r.across.map((a) => `${a.dag_id} (plan ${a.plan_id})`).join(", ")}`) : null),
        h("td", { style: cell }, `${r.rerun_count ?? "?"} (${r.clear_downstream_count ?? "?"})`),
        h("td", { style: cell }, r.by),
        h("td", { style: cell }, (r.started_at || "").replace("T", " ").slice(0, 19)),
        h("td", { style: cell }, (r.ended_at || "").replace("T", " ").slice(0, 19)),
        h("td", { style: cell, title: r.detail }, r.outcome + (r.resumptions ? ` (resumed ${r.resumptions}×)` : "")),
        h("td", { style: cell }, r.outcome === "running" && canRelease
          ? h(Button, { testid: `release-${r.plan_id}`, onClick: () => onRelease(r), title: "Release the lease of a dead executor" }, "Release…")
          : null)))),
  );
}

// -- process pairs: where each replica runs, and what happened to them ------------------------

const PAIR_COLOURS = { ACTIVE: "#2f855a", STDBY: "#d69e2e", DEAD: "#c53030" };

function Pairs({ pairs }) {
  const cell = { padding: "2px 10px", borderBottom: `1px solid ${C.border}`, textAlign: "left" };
  const byPartition = new Map();
  for (const r of pairs.replicas) {
    const key = `${r.task_id}[${r.partition}]`;
    if (!byPartition.has(key)) byPartition.set(key, {});
    byPartition.get(key)[r.replica] = r;
  }
  const replicaCell = (r) => h("td", {
    style: cell, "data-testid": `pair-${r.name}`, "data-status": r.status, "data-worker": r.worker,
    title: `${r.name} is task instance ${r.processor}`,
  },
  h("span", { style: { display: "inline-block", minWidth: 52, padding: "0 6px", marginRight: 6, borderRadius: 3,
    color: "#fff", background: PAIR_COLOURS[r.status], fontSize: 11, textAlign: "center" } }, r.status),
  `${r.worker} · g${r.generation}`);
  return h("div", { "data-testid": "pairs" },
    h("table", { style: { borderCollapse: "collapse", fontSize: 13 } },
      h("thead", null, h("tr", null, ...["partition", "replica A", "replica B"].map((c, i) => h("th", { key: i, style: cell }, c)))),
      h("tbody", null, ...[...byPartition.entries()].map(([key, pair]) =>
        h("tr", { key }, h("td", { style: cell }, key), replicaCell(pair.A), replicaCell(pair.B))))),
    pairs.events.length
      ? h("ol", { "data-testid": "pair-events", style: { fontSize: 13, margin: "8px 0 0", paddingLeft: 20 } },
        ...pairs.events.map((e, i) => h("li", { key: i, "data-testid": "pair-event", "data-replica": e.replica, "data-what": e.what },
          `${(e.at || "").replace("T", " ").slice(0, 19)}  ${e.replica} ${e.what} on ${e.worker} (generation ${e.generation})`)))
      : h("div", { "data-testid": "pair-events-empty", style: { color: C.muted, fontSize: 13, marginTop: 8 } },
        "No take-over yet: every replica runs where it was placed."));
}

// -- the view --------------------------------------------------------------------------------

function preselect(view, runId, taskId) {
  const selection = emptySelection();
  const epochOf = Object.fromEntries(view.epochs.map((e) => [e.run_id, e.epoch]));
  if (taskId && runId && epochOf[runId] !== undefined) {
    const epoch = epochOf[runId];
    const state = (view.airflow_states[taskId] || {})[String(epoch)];
    const committed = !["-", "I"].includes(((view.status[taskId] || "")[epoch - view.first_epoch]) || "-");
    // A failed instance whose epoch is committed is an Airflow re-run the operator refused (Clear,
    // backfill): redoing it is a bad epoch. Any other failure is a failed task instance. A
    // successful one preselects nothing; the bad-epoch picker is set to it, one click away.
    if (state === "failed" && committed) selection.bad.push({ task_id: taskId, epoch });
    else if (state === "failed" || state === UNRECORDED) selection.failed.set(key(taskId, epoch), { task_id: taskId, epoch });
    else selection.suggested = { task_id: taskId, epoch };
    return selection;
  }
  for (const f of view.failed) selection.failed.set(key(f.task_id, f.epoch), { task_id: f.task_id, epoch: f.epoch });
  return selection;
}

function FalkirkView({ dagId, runId, taskId }) {
  const [view, setView] = useState(null);
  const [loadError, setLoadError] = useState(null);
  const [selection, setSelection] = useState(null);
  const [plan, setPlan] = useState(null);
  const [planError, setPlanError] = useState(null);
  const [planning, setPlanning] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const [replay, setReplay] = useState(null); // {busy} | {plan_id, status} | {error}
  const [releasing, setReleasing] = useState(null); // {recovery, busy, error}

  const load = useCallback(async (initial) => {
    try {
      const body = await api(`dags/${encodeURIComponent(dagId)}/view`);
      setView(body);
      setLoadError(null);
      if (initial) setSelection(preselect(body, runId, taskId));
    } catch (e) {
      setLoadError(e.message);
    }
  }, [dagId, runId, taskId]);

  useEffect(() => {
    globalThis.__falkirkTimings = { ...globalThis.__falkirkTimings, mounted: performance.now(), grid: undefined };
    load(true);
  }, [load]);


  // A recovery is running: refresh the grid and history until it ends.
  const running = view?.recoveries.some((r) => r.outcome === "running");
  useEffect(() => {
    if (!running) return undefined;
    const timer = setInterval(() => load(false), 3000);
    return () => clearInterval(timer);
  }, [running, load]);

  // The preview follows the selection.
  const body = useMemo(() => (selection ? failureBody(selection) : null), [selection]);
  useEffect(() => {
    if (!body || !view) return undefined;
    if (!body.failed_tasks.length && !body.lost_scratch.length && !body.lost_workers.length && !body.bad_epochs.length) {
      setPlan(null);
      setPlanError(null);
      return undefined;
    }
    let cancelled = false;
    setPlanning(true);
    api(`dags/${encodeURIComponent(dagId)}/preview`, { method: "POST", body: JSON.stringify(body) })
      .then((p) => !cancelled && (setPlan(p), setPlanError(null)))
      .catch((e) => !cancelled && (setPlan(null), setPlanError(e.message)))
      .finally(() => !cancelled && setPlanning(false));
    return () => {
      cancelled = true;
    };
  }, [body, dagId, view?.ledger_version]);

  const startReplay = async () => {
    setReplay({ busy: true });
    try {
      const started = await api(`dags/${encodeURIComponent(dagId)}/recoveries`, {
        method: "POST",
        body: JSON.stringify({ ...body, ledger_version: plan.ledger_version }),
      });
      setReplay(started);
      setConfirming(false);
      setSelection(emptySelection());
      await load(false);
    } catch (e) {
      setReplay({ error: e.message });
      setConfirming(false);
    }
  };

  const releaseLease = async (reason) => {
    setReleasing((r) => ({ ...r, busy: true, error: null }));
    try {
      await api(`dags/${encodeURIComponent(dagId)}/lease/release`, { method: "POST", body: JSON.stringify({ reason }) });
      setReleasing(null);
      await load(false);
    } catch (e) {
      setReleasing((r) => ({ ...r, busy: false, error: e.message }));
    }
  };

  // minmax(0, 1fr): wide children (a long grid) scroll inside the view instead of widening it
  const page = { color: C.fg, padding: 12, display: "grid", gridTemplateColumns: "minmax(0, 1fr)", gap: 12, minWidth: 0 };
  if (loadError && !view) {
    return h("div", { style: page, "data-testid": "falkirk-error", role: "alert" },
      h("p", null, `The Falkirk view could not load: ${loadError}`),
      h("div", null, h(Button, { onClick: () => load(true) }, "Try again")));
  }
  if (!view || !selection) {
    return h("div", { style: { ...page, color: C.muted }, "data-testid": "falkirk-loading" }, "Loading the ledger…");
  }
  if (view.last_epoch === 0) {
    return h("div", { style: page, "data-testid": "falkirk-empty" },
      h("h2", { style: { fontSize: 18, fontWeight: 600 } }, `Falkirk: ${dagId}`),
      h("p", null, "No checkpoints yet: this DAG has not committed an epoch through Falkirk's operator."),
      h(Graph, { tasks: view.tasks, plan: null, view }));
  }
  const barred = (plan?.across || []).filter((p) => !p.may_replay).map((p) => p.dag_id);
  const canReplay = view.can_replay && plan && !planning && !running && !barred.length;
  const why = !view.can_replay
    ? `You (${view.user}) need edit access to this DAG's task instances to replay.`
    : running ? "A recovery of this DAG is running." : !plan ? "Pick a failure first."
    : barred.length ? `You (${view.user}) may not clear the task instances of ${barred.join(", ")}, which this recovery re-runs.`
    : undefined;
  return h(
    "div",
    { style: page, "data-testid": "falkirk-view", "data-ledger-version": view.ledger_version },
    h("div", { style: { display: "flex", justifyContent: "space-between", alignItems: "baseline", flexWrap: "wrap" } },
      h("h2", { style: { fontSize: 18, fontWeight: 600, margin: 0 } }, `Falkirk: ${dagId}`),
      h("span", { style: { fontSize: 12, color: C.muted } },
        `epochs ${view.first_epoch}..${view.last_epoch} · ledger version ${view.ledger_version} · ${view.tasks.length} tasks`)),
    view.beyond && h("p", { "data-testid": "beyond-note", role: "note",
      style: { fontSize: 13, margin: "4px 0", color: AIRFLOW_RINGS.unrecorded } }, view.beyond),
    h(Legend, { statuses: view.statuses }),
    h(Panel, { title: "Tasks by regime", testid: "panel-graph" }, h(Graph, { tasks: view.tasks, plan, view })),
    h(Panel, { title: "Failure", testid: "panel-failure" }, h(FailurePicker, { view, selection, setSelection })),
    h(Panel, {
      title: "Recovery plan",
      testid: "panel-plan",
      right: h(Button, { primary: true, disabled: !canReplay, title: why, testid: "replay-button", onClick: () => setConfirming(true) }, "Roll back and replay"),
    },
    h(PlanSummary, { plan, error: planError, loading: planning, view, order: Object.fromEntries(gridRows(view).map((r, i) => [r.row_id, i])) }),
    replay?.error ? h("div", { role: "alert", "data-testid": "replay-error", style: { color: "#e53e3e", marginTop: 8 } }, replay.error) : null,
    replay?.plan_id ? h("div", { "data-testid": "replay-started", style: { marginTop: 8 } },
      `Recovery ${replay.plan_id} started by ${replay.by}: ${replay.rerun_count} task instances to re-run, ` +
      `carried out by ${replay.recovery ? `${replay.recovery.dag_id} run ${replay.recovery.run_id}` : "Airflow"}.` +
      ((replay.across || []).length ? ` Then: ${replay.across.map((p) => `${p.dag_id} (plan ${p.plan_id}, ${p.rerun_count})`).join(", ")}.` : "")) : null),
    h(Panel, { title: "Checkpoints (epochs × tasks)", testid: "panel-grid" }, h(Grid, { view, plan })),
    view.pairs ? h(Panel, { title: "Process pairs", testid: "panel-pairs" }, h(Pairs, { pairs: view.pairs })) : null,
    h(Panel, { title: "Recoveries", testid: "panel-history" },
      h(History, { recoveries: view.recoveries, canRelease: view.can_replay, onRelease: (r) => setReleasing({ recovery: r }) })),
    view.can_discard ? h(Panel, { title: "Discard epochs run by mistake", testid: "panel-discard" },
      h(DiscardPanel, { view, dagId, onDone: () => load(false) })) : null,
    releasing ? h(ReleaseDialog, { ...releasing, onCancel: () => setReleasing(null), onConfirm: releaseLease }) : null,
    confirming && plan ? h(ConfirmDialog, { plan, busy: replay?.busy, onCancel: () => setConfirming(false), onConfirm: startReplay }) : null,
  );
}

// Withdraw the newest epochs, run by mistake (falkirk discard): preview first, then confirm.
// Shown to users who may delete the DAG's runs; the API checks again.
function DiscardPanel({ view, dagId, onDone }) {
  const beyond = view.beyond ? view.beyond.match(/epochs (\d+)\.\.(\d+)/) : null;
  const [first, setFirst] = useState(beyond ? beyond[1] : String(view.last_epoch));
  const [last, setLast] = useState(beyond ? beyond[2] : String(view.last_epoch));
  const [consumers, setConsumers] = useState(false);
  const [preview, setPreview] = useState(null);
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const body = (extra) => JSON.stringify({ first: Number(first), last: Number(last), consumers, ...extra });
  const look = async () => {
    setError(null); setPreview(null); setBusy(true);
    try {
      setPreview(await api(`dags/${encodeURIComponent(dagId)}/discards/preview`, { method: "POST", body: body() }));
    } catch (e) { setError(e.message); } finally { setBusy(false); }
  };
  const confirm = async () => {
    setError(null); setBusy(true);
    try {
      await api(`dags/${encodeURIComponent(dagId)}/discards`, { method: "POST", body: body({ ledger_version: preview.ledger_version }) });
      setPreview(null);
      onDone();
    } catch (e) { setError(e.message); } finally { setBusy(false); }
  };
  const input = (value, set, testid) => h("input", { type: "number", min: 1, value, "data-testid": testid,
    onChange: (e) => { set(e.target.value); setPreview(null); },
    style: { width: 90, marginRight: 8, padding: 2, border: `1px solid ${C.border}`, background: C.bg, color: C.fg } });
  return h("div", { style: { fontSize: 13 } },
    h("p", { style: { marginTop: 0, color: C.muted } },
      "Withdraw the DAG's newest epochs when their runs were made by mistake: their ledger rows are rolled back, " +
      "their DAG runs deleted, and the discard recorded in the history."),
    h("label", null, "epochs ", input(first, setFirst, "discard-first")), h("label", null, "to ", input(last, setLast, "discard-last")),
    h("label", { style: { marginRight: 8 } }, h("input", { type: "checkbox", checked: consumers, "data-testid": "discard-consumers",
      onChange: (e) => { setConsumers(e.target.checked); setPreview(null); } }),
      " and what other DAGs read from them"),
    h(Button, { onClick: look, disabled: busy, testid: "discard-preview" }, "Preview"),
    preview ? h("pre", { "data-testid": "discard-summary", style: { whiteSpace: "pre-wrap", margin: "8px 0" } }, preview.summary) : null,
    preview ? h(Button, { primary: true, onClick: confirm, disabled: busy, testid: "discard-confirm" },
      `Discard epochs ${preview.first}..${preview.last}`) : null,
    error ? h("div", { role: "alert", "data-testid": "discard-error", style: { color: "#e53e3e", marginTop: 8 } }, error) : null);
}

globalThis.AirflowPlugin = FalkirkView;
export default FalkirkView;
