"""report.html and the dashboard in a real browser: Debian's chromium, driven headless by
playwright (``executable_path``: no browser download). Images load, tables render, the console
has no errors, the answer (recommendation, interval, error rate, what is undecided) is on the
first screen; a screenshot of each is saved (docs/example-report/report-chromium.png and
dashboard-chromium.png were made this way: TUNER_SCREENSHOTS=docs/example-report pytest
tests/test_browser.py; first-screen.png by scripts/example-report.sh)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.report_journals import REPO, simulated_night

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "scripts/test.sh installs Debian's chromium (apt-get install chromium)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    from tuner.morning.report import write_report

    folder = simulated_night(tmp_path_factory.mktemp("browser"), arms=24)
    write_report(folder)
    return folder


def _open(browser, url: str, shot: Path, wait_for: str | None = None):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="load")
    if wait_for:
        page.wait_for_selector(wait_for, timeout=30_000)
    page.screenshot(path=str(shot), full_page=False)
    return page, errors


def _keep(shot: Path) -> None:
    dest = os.environ.get("TUNER_SCREENSHOTS")
    if dest:
        shutil.copy(shot, Path(dest) / shot.name)


def test_report_html_in_chromium(browser, night, tmp_path):
    shot = tmp_path / "report-chromium.png"
    page, errors = _open(browser, (night / "report.html").as_uri(), shot)
    imgs = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth, e.alt])")
    assert len(imgs) == 3 and all(done and width > 100 for done, width, _ in imgs), imgs
    tables = page.eval_on_selector_all("table", "ts => ts.map(t => [t.rows.length, t.rows[0].cells.length])")
    assert len(tables) >= 5 and all(rows >= 2 and cols >= 2 for rows, cols in tables), tables
    assert page.title() == "Morning report: report-night"
    headings = page.eval_on_selector_all("h2", "hs => hs.map(h => h.textContent)")
    assert "Arms" in " ".join(headings) or len(headings) >= 5
    assert not page.eval_on_selector_all("a[href^='javascript:']", "as => as.length")
    assert errors == [], errors
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    _keep(shot)
    page.close()


def test_the_answer_is_on_the_first_screen(browser, night, tmp_path):
    """At 1280 x 900 the recommendation, its interval and error rate, and what is still
    undecided are in view before any scrolling; the plots are drawn at 1,600 px or more."""
    shot = tmp_path / "first-screen.png"
    page, errors = _open(browser, (night / "report.html").as_uri(), shot)
    seen = page.eval_on_selector_all("p", """ps => ps.map(p => {
        const r = p.getBoundingClientRect(); return [p.textContent, r.top, r.bottom]; })""")
    height = page.viewport_size["height"]
    first = [text for text, top, bottom in seen if bottom <= height]
    rec = next((x for x in first if x.startswith("Recommendation: ")), None)
    assert rec, seen[:4]
    assert "against the start" in first[first.index(rec)] or "keep" in rec
    if "with the change(s) below" in rec:
        assert re.search(r"[+-]\d+\.\d% \[[+-]\d+\.\d%, [+-]\d+\.\d%\]", rec) and "error rate" in rec, rec
        items = page.eval_on_selector_all("h2 + p + ul li", "ls => ls.map(l => l.getBoundingClientRect().bottom)")
        assert items and max(items) <= height
    assert any(x.startswith("Still undecided") for x in first), first
    assert any(" of simulated time " in x for x in first), "the simulated night's time is said as such"
    widths = page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth)")
    assert len(widths) == 3 and min(widths) >= 1600, widths
    assert errors == [], errors
    page.close()


def test_dashboard_in_chromium(browser, night, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "dashboard", str(night), "--port", str(port)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/studies", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the dashboard did not come up"
            time.sleep(0.3)
        shot = tmp_path / "dashboard-chromium.png"
        page, errors = _open(browser, f"http://127.0.0.1:{port}/dashboard", shot, wait_for="text=report-night")
        # the study's page: its trials are listed
        page.click("text=report-night")
        page.wait_for_url(re.compile(r"/studies/\d+"), timeout=30_000)
        page.wait_for_load_state("networkidle", timeout=30_000)
        text = page.inner_text("body")
        assert "report-night" in text and "Trial" in text
        page.screenshot(path=str(shot))
        errors = [e for e in errors if "favicon" not in e]
        assert errors == [], errors
        _keep(shot)
        page.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
