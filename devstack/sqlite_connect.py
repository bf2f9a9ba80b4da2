"""Connection arguments for the embedded Airflow's SQLite metadata database.

The scheduler, the dag-processor, the API server and every task write the one file. SQLite's
default five-second busy timeout turns a moment of contention on a loaded two-core machine
into a failed request ("database is locked", an HTTP 500 from the REST API); a writer that
waits a little longer is the behaviour a user expects.
"""

CONNECT_ARGS = {"timeout": 60}
