"""The docs site builds without a warning (a broken cross-reference or image is one), and what
it quotes from the software is what the software says: each command's ``--help``, and each
message shown with ``falkirk-message``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

from falkirk_docs import command_help, message_of  # noqa: E402

COMMANDS = ["", "trigger", "plan", "replay", "discard", "keep", "gc", "release", "delivered", "pairs", "watch", "new-job",
            "solve"]
MESSAGE = re.compile(r"```\{falkirk-message\}\n(.*?)```", re.S)


def _build(builder: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, str(DOCS),
                           str(out)], capture_output=True, text=True, timeout=600)


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def text_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs-text")
    built = _build("text", out)
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def test_the_site_builds_without_a_warning_and_its_links_resolve(tmp_path: Path) -> None:
    built = _build("html", tmp_path / "html")
    warnings = [line for line in built.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert built.returncode == 0 and not warnings, built.stderr[-3000:]
    assert (tmp_path / "html" / "getting-started.html").is_file()
    assert (tmp_path / "html" / "reference" / "cli.html").is_file()
    checked = _build("linkcheck", tmp_path / "links")  # what `make docs` runs after the build
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    broken = [line for line in (tmp_path / "links" / "output.txt").read_text().splitlines() if "broken" in line]
    assert not broken, broken


def test_each_commands_help_in_the_reference_is_the_commands_own(text_build: Path) -> None:
    page = _flat((text_build / "reference" / "cli.txt").read_text())
    for command in COMMANDS:
        own = command_help(command)
        assert own.startswith("usage: falkirk"), (command, own[:200])
        assert _flat(own) in page, f"falkirk {command} --help differs from docs/reference/cli.md"
    documented = set(re.findall(r"^## falkirk ([a-z-]+)$", (DOCS / "reference" / "cli.md").read_text(), re.M))
    assert documented == set(COMMANDS) - {""}, "a command of `falkirk --help` is missing from the reference"


def test_each_quoted_message_is_the_codes_own(text_build: Path) -> None:
    quoted = 0
    for source in sorted(DOCS.rglob("*.md")):
        if "_build" in source.parts:
            continue
        built = _flat((text_build / source.relative_to(DOCS).with_suffix(".txt")).read_text())
        for code in MESSAGE.findall(source.read_text()):
            message = message_of(code)
            assert _flat(message) in built, (source, message[:200])
            quoted += 1
    assert quoted >= 5
    # and no error text typed by hand: a refusal or a plan's note quoted outside the directive
    for source in sorted(DOCS.rglob("*.md")):
        text = MESSAGE.sub("", source.read_text())
        for phrase in ("already completed (committed by run", "would leave epochs", "past the DAG's latest run"):
            assert phrase not in text, f"{source}: quote {phrase!r} with falkirk-message, from the code"
