"""Connection arguments for Airflow's SQLite metadata database in the embedded deployment.

Airflow imports this module by name (``[database] sql_alchemy_connect_args``), so it imports
nothing. SQLite's default busy timeout is 5 s: on a loaded two-core machine the scheduler can
hold the write lock longer than that, and a REST call such as ``clearTaskInstances`` then fails
with "database is locked". Waiting up to a minute turns that failure into a delay.
"""

CONNECT_ARGS: dict[str, object] = {"timeout": 60}
