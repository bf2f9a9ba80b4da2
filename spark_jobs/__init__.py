"""Spark jobs and the job runtime. Imports ``policies``; never ``plugins``."""
