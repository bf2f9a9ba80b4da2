"""The reference application: a clickstream analytics pipeline with one regime per part.

Its shape lives here, beside the jobs, so that the DAG (``dags/falkirk_figure1.py``) and the
jobs that need the whole graph (``events`` acknowledging its source) share one definition.
"""

import os

from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint
from falkirk.policies.planning.chains import TaskGraph

REGIMES = {"events": Ephemeral(), "popularity": Batch(log_outputs=True), "rank": LazyCheckpoint(every=3),
           "answers": Ephemeral(), "stats": EagerCheckpoint()}
EDGES = [("events", "popularity"), ("events", "rank"), ("popularity", "answers"), ("rank", "answers"),
         ("answers", "stats")]
GRAPH = TaskGraph.of(REGIMES, EDGES)


def local_file(env_var: str, durable_uri: str, dag_id: str, name: str, holds: str) -> str:
    """The path of a small file the application keeps per DAG outside Delta: ``$env_var``
    (``{dag_id}`` in it is replaced), or ``{durable}/{dag_id}/{name}`` when the durable tier is a
    local path. Its directory is created.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> local_file("FALKIRK_UNSET_EXAMPLE", root, "d", "x.json", "examples").endswith("/d/x.json")
    True
    >>> local_file("FALKIRK_UNSET_EXAMPLE", "s3://lake", "d", "x.json", "examples")
    Traceback (most recent call last):
    ...
    ValueError: FALKIRK_UNSET_EXAMPLE is not set and the durable tier 's3://lake' is not a local path: set FALKIRK_UNSET_EXAMPLE to the file that holds examples
    """
    path = os.environ.get(env_var, "").replace("{dag_id}", dag_id)
    if not path:
        if "://" in durable_uri:
            raise ValueError(f"{env_var} is not set and the durable tier {durable_uri!r} is not a local path: "
                             f"set {env_var} to the file that holds {holds}")
        path = os.path.join(durable_uri, dag_id, name)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return path
