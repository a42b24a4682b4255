"""The web UI end to end in a real browser (headless Chromium driven by Playwright): pick a local model and the
demo dataset, train, watch the loss chart gain points, reload mid-run and find the run again, see it finish, chat
with the result, and check that the page never asked anything of another origin. Screenshots of every tab are
saved in the test's folder. From the Deltas and Evaluate tabs it also compresses the run into a BitDelta, inspects it
and scores the run on the demo multiple-choice task.

`GYM_WEBUI_SCREENSHOTS=docs/images/webui GYM_WEBUI_MODEL=smollm2-135m` runs the same test on the embedded model
and writes the screenshots docs/webui.md shows.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TABS = {"Train": "train", "Chat": "chat", "Deltas & variants": "deltas", "Soup": "soup", "Export": "export",
        "Evaluate": "evaluate"}


def _ensure_chromium() -> str:
    """Debian's chromium, installed here when missing (as `make test` does); skipped, saying why, where it cannot be."""
    if Path(CHROMIUM).is_file():
        return CHROMIUM
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{CHROMIUM} is missing and this user cannot apt-get install chromium")
    subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True, capture_output=True, timeout=900)
    return CHROMIUM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def server(tmp_path):
    from gym.webui.app import serve

    demo, url = serve(port=_free_port(), runs_dir=str(tmp_path / "runs"), dataset_dir=str(REPO / "data"),
                      block=False)
    yield url
    demo.close()


def _fill(page, selector: str, text: str) -> None:
    # Tab out of the previous field may land on a dropdown, which opens its list on focus and covers the fields
    # below it (the layout decides which, so it moves as the form gains fields): close it first.
    page.keyboard.press("Escape")
    box = page.locator(f"{selector} input, {selector} textarea").first
    box.click()
    box.fill(text)
    box.press("Enter")
    box.press("Tab")


def _status(page) -> str:
    return page.locator("#train-status").inner_text()


def _wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _ended(page, selector: str) -> bool:
    return any(state in page.locator(selector).inner_text() for state in ("finished", "failed", "stopped", "lost"))


def _line_points(page) -> int:
    """How many points the loss chart's line has (its SVG path: a move, then one line-to per further point)."""
    path = page.locator("#plot-loss .mark-line path")
    if not path.count():
        return 0
    d = path.first.get_attribute("d") or ""
    return d.count("L") + 1 if d.startswith("M") else 0


@pytest.mark.slow
def test_train_watch_reload_chat_in_a_real_browser(server, tiny_model_dir, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (in the dev extra)")
    chromium = _ensure_chromium()
    shots = Path(os.environ.get("GYM_WEBUI_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    model = os.environ.get("GYM_WEBUI_MODEL") or str(tiny_model_dir)
    steps = "40" if os.environ.get("GYM_WEBUI_MODEL") else "150"
    origin = urlparse(server).netloc
    elsewhere: list[str] = []

    def note(url: str) -> None:
        parsed = urlparse(url)
        if parsed.scheme not in ("data", "blob", "about") and parsed.netloc != origin:
            elsewhere.append(url)

    with playwright.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(tempfile.mkdtemp(dir=tmp_path), executable_path=chromium,
                                                       headless=True, args=FLAGS,
                                                       viewport={"width": 1400, "height": 1000})
        browser.on("request", lambda request: note(request.url))
        page = browser.new_page()
        page.on("websocket", lambda ws: note(ws.url))
        page.goto(server)
        page.wait_for_selector("#tab-train", state="attached", timeout=60_000)

        # Pick the model and the demo dataset; a run long enough to be caught running.
        _fill(page, "#train-model", model)
        _fill(page, "#train-dataset", "identity")
        _fill(page, "#train-max_steps", steps)
        _fill(page, "#train-cutoff_len", "128")
        _fill(page, "#train-learning_rate", "0.001")
        page.locator("#train-start").click()
        _wait_for(lambda: "running" in _status(page), 60, "the run to start")
        runs = tmp_path / "runs"

        # The loss chart gains points as the run logs steps (Gradio draws it as SVG: one path per run).
        loss = page.locator("#plot-loss")
        first = _wait_for(lambda: _line_points(page), 240, "the loss chart's first points")
        _wait_for(lambda: _line_points(page) > first + 1, 180, "the loss chart to gain points")
        step_shown = lambda: int(_status(page).split("step ")[1].split(" of")[0].strip("*"))  # noqa: E731
        assert step_shown() >= first
        page.screenshot(path=str(shots / "train.png"), full_page=True)

        # A reload mid-run finds the run on disk and keeps following it.
        assert "running" in _status(page)
        page.reload()
        page.wait_for_selector("#tab-train", state="attached", timeout=60_000)
        _wait_for(lambda: "running" in _status(page) or "finished" in _status(page), 30, "the run after the reload")
        _wait_for(lambda: "finished" in _status(page), 600, "the run to finish", poll=1)
        assert _wait_for(loss.is_visible, 30, "the loss chart after the reload")
        output = next(runs.glob("*/output"))
        assert (output / "gym_manifest.json").is_file() and (output.parent / "config.yaml").is_file()

        # Chat with the result.
        page.get_by_role("tab", name="Chat").click()
        _fill(page, "#chat-model", str(output))
        page.locator("#chat-load").click()
        _wait_for(lambda: "Loaded" in page.locator("#chat-loaded").inner_text(), 120, "the model to load")
        page.locator("#chat-input textarea").fill("Who are you?")
        page.locator("#chat-send").click()
        answer = page.locator("#chat-box .bot, #chat-box [data-testid='bot']").last
        _wait_for(lambda: answer.count() and answer.inner_text().strip(), 120, "an answer")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "chat.png"), full_page=True)

        # Compress the run into a BitDelta, inspect it, and score the run on the demo multiple-choice task:
        # each a `gym` job started from its tab, followed to its end in the page.
        page.get_by_role("tab", name="Deltas & variants").click()
        _fill(page, "#delta-finetuned", str(output))
        # The base follows the chosen run by a round trip to the server; compressing before it arrives would take
        # the delta against the embedded model (a loaded machine showed it).
        base_box = page.locator("#delta-base input, #delta-base textarea").first
        _wait_for(lambda: base_box.input_value() == model, 60, "the run's base in the base field")
        page.locator("#delta-compress").click()
        _wait_for(lambda: _ended(page, "#delta-status"), 300, "the delta", poll=1)
        assert "finished" in page.locator("#delta-status").inner_text(), "\n".join(
            p.read_text() for p in runs.glob("*/console.log"))
        delta = next(runs.glob("*/delta.safetensors"))
        _fill(page, "#delta-file", str(delta))
        page.locator("#delta-inspect").click()
        _wait_for(lambda: "bitdelta" in page.locator("#delta-inspected").inner_text().lower(), 120, "the inspection")
        page.screenshot(path=str(shots / "deltas.png"), full_page=True)

        page.get_by_role("tab", name="Evaluate").click()
        _fill(page, "#eval-model", str(output))
        _fill(page, "#eval-limit", "2")
        page.locator("#eval-start").click()
        _wait_for(lambda: _ended(page, "#eval-status"), 300, "the evaluation", poll=1)
        assert "finished" in page.locator("#eval-status").inner_text(), page.locator("#eval-console").inner_text()
        assert "acc" in page.locator("#eval-console textarea").input_value()
        assert json.loads(next(runs.glob("*/results.json")).read_text())["results"]["mc_demo"]
        page.screenshot(path=str(shots / "evaluate.png"), full_page=True)

        for name, file in TABS.items():
            if file not in ("train", "chat", "deltas", "evaluate"):
                page.get_by_role("tab", name=name).click()
                page.wait_for_timeout(800)
                page.screenshot(path=str(shots / f"{file}.png"), full_page=True)
        browser.close()

    assert elsewhere == [], f"the page asked other origins: {elsewhere}"
    assert {p.stem for p in shots.glob("*.png")} >= set(TABS.values())
