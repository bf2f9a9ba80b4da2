"""The headless browser the view's tests drive: Debian's Chromium through Playwright, signed in
through Airflow's own login form, and screenshots of the Falkirk view kept in ``ARTIFACTS``
(``$FALKIRK_ARTIFACTS``, default ``artifacts/falkirk-view``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from devstack.airflow import USERS

ARTIFACTS = Path(os.environ.get("FALKIRK_ARTIFACTS", Path(__file__).resolve().parents[2] / "artifacts" / "falkirk-view"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def chromium() -> Iterator[Any]:
    """A Chromium browser, closed when the generator is (the ``browser`` fixture)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield b
        b.close()


def sign_in(browser: Any, base_url: str, user: str, theme: str = "light") -> tuple[Any, Any]:
    """A new browser context signed in as ``user`` through Airflow's own login form, and its page."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme=theme)
    page = context.new_page()
    page.goto(f"{base_url}/auth/login/")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", USERS[user][1])
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)
    return context, page


def shot(page: Any, name: str) -> None:
    """The Falkirk view, whole: the window grows to fit it, as Airflow's page scrolls inside."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    height = page.get_by_test_id("falkirk-view").evaluate("el => el.scrollHeight")
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], height + 400)})
    page.get_by_test_id("falkirk-view").screenshot(path=str(ARTIFACTS / f"{name}.png"))
    page.set_viewport_size(size)
