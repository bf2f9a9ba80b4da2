"""A directory's checksum: what the hostile-input tests compare before and after a refusal."""

from __future__ import annotations

import hashlib
from pathlib import Path


def checksum(root: Path) -> str:
    """SHA-256 over every path under ``root`` and every file's bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()
