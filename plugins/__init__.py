"""The Airflow integration: the regime-aware operator and the Falkirk plugin (API and views).

Imports ``policies``; never ``spark_jobs``.
"""
