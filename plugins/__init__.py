"""The Airflow integration: the regime-aware operator and the Falkirk plugin (API and views).

Imports ``policies``; never ``spark_jobs``.
"""

import pluggy

# Airflow's cluster-policy marker (``airflow.policies.hookimpl``), made here rather than imported:
# the policy modules are Airflow entry points, and importing Airflow from one of them, when it is
# imported before Airflow, loads the entry points while that module is half-made, so Airflow
# would register it without its hooks.
hookimpl = pluggy.HookimplMarker("airflow.policy")
