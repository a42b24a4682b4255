"""What every tab shares: the job store, the runs folder, the look, and running a quick `gym` command."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import wraps
from typing import Any

from gym.core.errors import GymError
from gym.webui.jobs import Job, JobStore


@dataclass
class UI:
    """The state the server holds (everything else is on disk)."""

    store: JobStore
    dataset_dir: str = "data"

    def outputs(self) -> list[str]:
        """Finished and running outputs of this UI's training jobs, newest first."""
        return [job.output for job in self.store.list("train") if job.output]


def user_errors(fn: Any) -> Any:
    """A GymError (a bad key, a missing dataset ...) becomes the page's error message, not a traceback; works for
    handlers that stream (generators) too, which Gradio tells apart by the wrapper's own kind."""
    import gradio as gr

    if inspect.isgeneratorfunction(fn):
        @wraps(fn)
        def streaming(*args: Any, **kwargs: Any) -> Any:
            try:
                yield from fn(*args, **kwargs)
            except GymError as exc:
                raise gr.Error(str(exc)) from None
        return streaming

    @wraps(fn)
    def plain(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GymError as exc:
            raise gr.Error(str(exc)) from None
    return plain


def run_gym(args: Sequence[str], timeout: float = 600) -> str:
    """A quick `gym ...` (inspect, list, status) run to completion; its output, or its error as one line."""
    try:
        done = subprocess.run([sys.executable, "-m", "gym.cli", *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GymError(f"gym {' '.join(args)} did not answer within {timeout:.0f} s.") from None
    if done.returncode != 0:
        message = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise GymError(message.removeprefix("gym: error: "))
    return done.stdout


def job_status(job: Job | None) -> str:
    """Markdown: the job, its state and the command it runs."""
    if job is None:
        return "No job yet."
    code = job.exit_code
    ended = f" (exit status {code})" if code not in (None, 0) else ""
    return f"**{job.title}** · `{job.id}` · **{job.status}**{ended}\n\n`{job.command}`"


def choices(jobs: list[Job]) -> list[tuple[str, str]]:
    return [(job.label(), job.id) for job in jobs]


# Monochrome: black surfaces, white text, grey lines; system fonts only (nothing fetched from elsewhere).
SYSTEM_FONTS = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica", "Arial",
                "sans-serif")
MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "Liberation Mono", "monospace")

CSS = """
footer {display: none !important}
.gym-title h1 {letter-spacing: 0.08em; margin: 0}
:focus-visible {outline: 2px solid #fff !important; outline-offset: 2px}
"""

# Gradio follows the browser's light/dark preference; the theme is black either way.
FORCE_DARK = "() => { document.body.classList.add('dark'); }"


def theme() -> Any:
    import gradio as gr

    grey = gr.themes.colors.neutral
    base = gr.themes.Base(primary_hue=grey, secondary_hue=grey, neutral_hue=grey, font=list(SYSTEM_FONTS),
                          font_mono=list(MONO_FONTS), radius_size=gr.themes.sizes.radius_sm)
    black, panel, line, text, dim = "#000000", "#0b0b0b", "#3a3a3a", "#f2f2f2", "#a8a8a8"
    values = {
        "body_background_fill": black, "body_text_color": text, "body_text_color_subdued": dim,
        "background_fill_primary": black, "background_fill_secondary": panel, "block_background_fill": panel,
        "block_border_color": line, "block_label_text_color": dim, "block_title_text_color": text,
        "border_color_primary": line, "input_background_fill": black, "input_border_color": line,
        "button_primary_background_fill": text, "button_primary_text_color": black,
        "button_primary_background_fill_hover": "#ffffff", "button_secondary_background_fill": panel,
        "button_secondary_text_color": text, "button_secondary_border_color": line,
        "color_accent": text, "color_accent_soft": "#1f1f1f", "link_text_color": text,
        "table_even_background_fill": black, "table_odd_background_fill": panel, "checkbox_background_color": black,
    }
    return base.set(**values, **{f"{k}_dark": v for k, v in values.items() if k != "color_accent"})
