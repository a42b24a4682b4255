"""The page: a header and one tab per door (Train, Chat, Deltas & variants, Soup, Export, Evaluate), in a black
monochrome theme with system fonts, served by Gradio with nothing that reaches past the server: no analytics,
no share link, no server-side rendering node process, no MCP, no external fonts or scripts."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from gym.core.version import __version__
from gym.webui.common import CSS, FORCE_DARK, UI, theme
from gym.webui.jobs import JobStore

logger = logging.getLogger(__name__)


def _quiet_gradio() -> None:
    """Gradio's own phoning home (analytics, update checks) off before it is imported."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    os.environ.setdefault("GRADIO_SSR_MODE", "False")
    for host in ("127.0.0.1", "localhost"):  # the page's own server, never through a proxy
        if host not in os.environ.get("NO_PROXY", ""):
            os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), host]))


def build_app(runs_dir: str = "saves/webui", dataset_dir: str = "data") -> Any:
    _quiet_gradio()
    import gradio as gr

    from gym.webui import tab_chat, tab_tools, tab_train

    ui = UI(store=JobStore(runs_dir), dataset_dir=dataset_dir)
    with gr.Blocks(title="Gym", analytics_enabled=False) as demo:
        gr.Markdown(f"# GYM\nFine-tune, align, compress, personalize and serve · v{__version__} · runs in "
                    f"`{ui.store.root}`", elem_classes="gym-title")
        tabs = [("Train", "train", tab_train.build), ("Chat", "chat", tab_chat.build),
                ("Deltas & variants", "deltas", tab_tools.build_deltas), ("Soup", "soup", tab_tools.build_soup),
                ("Export", "export", tab_tools.build_export), ("Evaluate", "evaluate", tab_tools.build_evaluate)]
        with gr.Tabs():
            for title, name, build in tabs:
                with gr.Tab(title, elem_id=f"tab-{name}"):
                    build(ui, demo)
    return demo


def serve(host: str = "127.0.0.1", port: int = 7860, auth: tuple[str, str] | None = None,
          runs_dir: str = "saves/webui", dataset_dir: str = "data", block: bool = True) -> Any:
    """Build and launch; with block=False, return (the app, its local URL) and leave it running in threads."""
    if host in ("0.0.0.0", "::") and auth is None:
        warnings.warn(f"gym webui listens on {host} without --auth: anyone who can reach this machine can start "
                      "jobs and read its files. Add --auth user:password.", stacklevel=2)
        logger.warning("Listening on %s without --auth: anyone who can reach this machine can run jobs.", host)
    demo = build_app(runs_dir, dataset_dir)
    # Polling timers and long jobs must not queue behind each other.
    demo.queue(default_concurrency_limit=None)
    _, url, _ = demo.launch(server_name=host, server_port=port, auth=auth, share=False, ssr_mode=False,
                            mcp_server=False, pwa=False, footer_links=[], show_error=True, quiet=not block,
                            prevent_thread_lock=not block, theme=theme(), css=CSS, js=FORCE_DARK,
                            allowed_paths=[str(JobStore(runs_dir).root)], enable_monitoring=False)
    return demo, url
