"""Sphinx configuration of the falkirk-airflow docs (``make docs``).

Pages are Markdown (MyST). What the docs quote from the software (each command's ``--help``,
the messages a user meets) is produced by the software itself while the docs build, through
the directives of ``_ext/falkirk_docs.py``; ``tests/unit/test_docs.py`` builds the site and
compares. Warnings are errors (``-W``), so a broken cross-reference fails the build.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
# autodoc imports the package, and with it Airflow, which writes a configuration into its home:
# one of the build's own, never the reader's ~/airflow.
os.environ["AIRFLOW_HOME"] = str(HERE / "_build" / "airflow-home")

project = "falkirk-airflow"
author = "falkirk-airflow contributors"
copyright = "2026, falkirk-airflow contributors"
release = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "falkirk_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nitpicky = False  # autodoc's type hints name Airflow's and pyarrow's classes, which are not documented here
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
suppress_warnings: list[str] = []

html_theme = "furo"
html_title = "falkirk-airflow"
html_static_path: list[str] = []

# The site links to itself and to files of this repository; external pages (Airflow's, Spark's)
# are not fetched by `make docs` (CI has no general internet access): `linkcheck` checks the rest.
linkcheck_ignore = [r"https?://"]
