"""The web UI's tests need Gradio (the `webui` extra, in `dev`); the browser test also needs Chromium."""

from __future__ import annotations

import pytest

pytest.importorskip("gradio", reason="the web UI needs Gradio: pip install 'zoo-gym[webui]'")
