"""Directives that put the software's own words into the docs while they build.

``falkirk-help`` shows a command's ``--help`` as ``falkirk`` prints it::

    ```{falkirk-help} plan
    ```

``falkirk-message`` shows a message as the code writes it: the directive's lines are Python,
``import`` lines first, then one expression that gives the message::

    ```{falkirk-message}
    from falkirk.policies.job_spec import JobSpec, completed_epoch_refusal
    completed_epoch_refusal(JobSpec(dag_id="orders", task_id="ingest", epoch=6, ...), "epoch-6", 1)
    ```

Nothing quoted this way can drift from the code; ``tests/unit/test_docs.py`` checks the built
pages against the commands and messages again.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def command_help(command: str) -> str:
    """``falkirk COMMAND --help`` (``falkirk --help`` for ``""``) as the command prints it."""
    from falkirk.plugins.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*command.split(), "--help"])
    return out.getvalue().rstrip()


def message_of(code: str) -> str:
    """The message ``code`` gives: its ``import`` lines run, its last line is the expression."""
    lines = [line for line in code.strip().splitlines() if line.strip()]
    namespace: dict[str, Any] = {}
    body = [line for line in lines[:-1]]
    exec("\n".join(body), namespace)  # noqa: S102 (the docs' own code)
    value = eval(lines[-1], namespace)  # noqa: S307
    return str(value)


class FalkirkHelp(SphinxDirective):
    optional_arguments = 10
    has_content = False

    def run(self) -> list[nodes.Node]:
        command = " ".join(self.arguments)
        text = command_help(command)
        block = nodes.literal_block(text, text, language="text")
        block["classes"].append("falkirk-help")
        return [block]


class FalkirkMessage(SphinxDirective):
    has_content = True
    option_spec = {"prefix": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        text = self.options.get("prefix", "") + message_of("\n".join(self.content))
        block = nodes.literal_block(text, text, language="text")
        block["classes"].append("falkirk-message")
        return [block]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("falkirk-help", FalkirkHelp)
    app.add_directive("falkirk-message", FalkirkMessage)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
