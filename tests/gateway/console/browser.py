"""Headless Chromium (Debian's package) driven by Playwright, for console tests.

No browser is downloaded: Playwright drives /usr/bin/chromium. Each test gets a
fresh profile; every console message and page error is kept so a test can prove
the pages run under their CSP without a single violation.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.components import missing_component

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[3]


def screenshot_dir() -> Path:
    """Where the main pages' screenshots go: $EXECGATE_SCREENSHOTS_DIR or var/screenshots/."""
    path = Path(os.environ.get("EXECGATE_SCREENSHOTS_DIR", REPO / "var" / "screenshots"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Browser:
    page: Any  # playwright.async_api.Page
    messages: list[str] = field(default_factory=list)

    def csp_violations(self) -> list[str]:
        return [m for m in self.messages if "Content Security Policy" in m or "Refused to" in m]

    async def shot(self, name: str, full_page: bool = True) -> Path:
        path = screenshot_dir() / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=full_page)
        return path


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        missing_component("playwright is not installed (pip install playwright)")
    if not os.access(CHROMIUM, os.X_OK):
        missing_component(f"{CHROMIUM} missing (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="execgate-chromium-") as profile:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                args=ARGS,
                headless=True,
                viewport={"width": 1280, "height": 900},
            )
            try:
                page = context.pages[0] if context.pages else await context.new_page()
                browser = Browser(page)
                page.on("console", lambda m: browser.messages.append(f"{m.type}: {m.text}"))
                page.on("pageerror", lambda e: browser.messages.append(f"pageerror: {e}"))
                yield browser
            finally:
                await context.close()
