"""What the sources cite is in the repository or a paper: no comment or docstring points to a
section of a design document beside the repository (the papers are named with their sections,
as docs/internals/papers.md lists them)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("policies", "plugins", "spark_jobs", "devstack", "dags", "benchmarks", "tests")
OUTSIDE = re.compile(r"research/\w+\.md|falkirk-spec|ARCHITECTURE\.md|\bspec §|\bseeds? 00\d|\[FW\]|\[FT\]")


def test_no_source_cites_a_section_of_a_document_outside_the_repository() -> None:
    files = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if p.name != "test_sources.py"]
    files += [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "CHANGELOG.md"]
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for path in files
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]
    assert found == [], "\n".join(found)
