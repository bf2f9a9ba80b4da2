"""The reference application: a clickstream analytics pipeline with one regime per part.

Its shape lives here, beside the jobs, so that the DAG (``dags/falkirk_figure1.py``) and the
jobs that need the whole graph (``events`` acknowledging its source) share one definition.
"""

from policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint
from policies.checkpoint_chains import DataEdge, TaskGraph

REGIMES = {"events": Ephemeral(), "popularity": Batch(log_outputs=True), "rank": LazyCheckpoint(every=3),
           "answers": Ephemeral(), "stats": EagerCheckpoint()}
EDGES = [("events", "popularity"), ("events", "rank"), ("popularity", "answers"), ("rank", "answers"),
         ("answers", "stats")]
GRAPH = TaskGraph(tuple(REGIMES), tuple(DataEdge(up, "output", down) for up, down in EDGES))
