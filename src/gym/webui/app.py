"""The page: a header and one tab per door (Train, Chat, Deltas & variants, Soup, Export, Evaluate), in a black
monochrome theme with system fonts, served by Gradio with nothing that reaches past the server: no analytics,
no share link, no server-side rendering node process, no MCP, no external fonts or scripts.

Anyone who reaches the page can start `gym` commands on this machine and read the runs folder, so it refuses to
listen beyond the machine without --auth unless told --insecure-no-auth; the host, the port and the runs folder
are checked before Gradio is imported, so a mistake in them is one line, not a traceback after the page was built.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from gym.core import heap
from gym.core.errors import ConfigError
from gym.core.network import check_port, host_addresses, is_loopback
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


def build_app(runs_dir: str | JobStore = "saves/webui", dataset_dir: str = "data") -> Any:
    _quiet_gradio()
    import gradio as gr

    from gym.webui import tab_chat, tab_service, tab_tools, tab_train

    ui = UI(store=runs_dir if isinstance(runs_dir, JobStore) else JobStore(runs_dir), dataset_dir=dataset_dir)
    with gr.Blocks(title="Gym", analytics_enabled=False) as demo:
        gr.Markdown(f"# GYM\nFine-tune, align, compress, personalize and serve · v{__version__} · runs in "
                    f"`{ui.store.root}`", elem_classes="gym-title")
        tabs = [("Train", "train", tab_train.build), ("Chat", "chat", tab_chat.build),
                ("Deltas & variants", "deltas", tab_tools.build_deltas), ("Soup", "soup", tab_tools.build_soup),
                ("Export", "export", tab_tools.build_export), ("Evaluate", "evaluate", tab_tools.build_evaluate),
                ("Fine-tuning jobs", "service", lambda _ui, blocks: tab_service.build(blocks))]
        with gr.Tabs():
            for title, name, build in tabs:
                with gr.Tab(title, elem_id=f"tab-{name}"):
                    build(ui, demo)
    return demo


def build_service_app(login: Any) -> Any:
    """`gym webui --service URL`: the page for a fine-tuning service's key holders, and nothing of this machine's
    own (no Train, Export ... tabs, which would run commands here): the Fine-tuning jobs tab, signed in by key."""
    _quiet_gradio()
    import gradio as gr

    from gym.webui import tab_service

    with gr.Blocks(title="Gym", analytics_enabled=False) as demo:
        gr.Markdown(f"# GYM\nFine-tuning service at `{login.url}` · v{__version__}", elem_classes="gym-title")
        with gr.Tabs(), gr.Tab("Fine-tuning jobs", elem_id="tab-service"):
            tab_service.build(demo, login)
    return demo


def check_exposure(host: str, auth: tuple[str, str] | None, insecure_no_auth: bool = False) -> None:
    """Refuse a page reachable from other machines without a password; with insecure_no_auth, say it once."""
    if auth is not None or is_loopback(host):
        return
    where = ", ".join(host_addresses(host))
    if not insecure_no_auth:
        raise ConfigError(f"gym webui --host {host} ({where}) would be reachable from other machines without "
                          "--auth: anyone who reaches it could run commands here and read its files. Add --auth "
                          "user:password, or --insecure-no-auth to serve it unprotected anyway.")
    logger.warning("Listening on %s (%s) without --auth (--insecure-no-auth): anyone who can reach this machine can "
                   "run jobs and read their files.", host, where)


def serve(host: str = "127.0.0.1", port: int = 7860, auth: tuple[str, str] | None = None,
          runs_dir: str = "saves/webui", dataset_dir: str = "data", block: bool = True,
          insecure_no_auth: bool = False, service: str | None = None) -> Any:
    """Build and launch; with block=False, return (the app, its local URL) and leave it running in threads.
    `service`: a `gym api --variants` server's URL: the page signs people in with that server's API keys."""
    login: Any = None
    if service is not None:
        if auth is not None:
            raise ConfigError("--service signs people in with the service's API keys; drop --auth.")
        from gym.webui.tab_service import KeyLogin

        login = KeyLogin(service)
    else:
        check_exposure(host, auth, insecure_no_auth)
    check_port(host, port)
    store = JobStore(runs_dir)
    demo = build_app(store, dataset_dir) if login is None else build_service_app(login)
    # Polling timers and long jobs must not queue behind each other.
    demo.queue(default_concurrency_limit=None)
    message = ("Sign in with your API key: your user id as the user name (admin for an admin's key), the key as the "
               "password.") if login is not None else None
    heap.work_begins()  # a page served for days collects its garbage as CPython always does
    try:
        # Quiet: Gradio's own start-up lines end with "set `share=True` in `launch()`", which Gym refuses; the
        # page's address is said once, below, in Gym's words.
        _, url, _ = demo.launch(server_name=host, server_port=port, auth=login or auth, auth_message=message,
                                share=False, ssr_mode=False,
                                mcp_server=False, pwa=False, footer_links=[], show_error=True, quiet=True,
                                prevent_thread_lock=True, theme=theme(), css=CSS, js=FORCE_DARK,
                                allowed_paths=[] if login is not None else [str(store.root)],
                                enable_monitoring=False)
    except OSError:
        check_port(host, port)  # another program took the port while the page was built: the same one line
        raise
    if block:
        print(f"Gym web UI on {url} (Ctrl-C stops it).", flush=True)
        demo.block_thread()
    return demo, url
