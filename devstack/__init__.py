"""Local deployments of the real components (Airflow, Spark standalone, an S3-compatible server)
for the demo and the integration tests."""
