"""A live `gym api` app on 127.0.0.1 (uvicorn in a thread) around the tiny model, for the real openai client."""

from __future__ import annotations

import socket
import threading
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def serve_app():
    """serve_app(chat_model, name, api_key, **create_app_options) -> base URL of a running server; all are stopped
    after the module."""
    import uvicorn

    from gym.serve.app import create_app

    servers = []

    def start(chat_model, name: str = "tiny", api_key: str | None = None, **options) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(chat_model, name, api_key, **options), host="127.0.0.1",
                                               port=port,
                                               log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 30
        while not server.started:
            assert thread.is_alive() and time.time() < deadline, "the server did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def tiny_chat(tiny_model_dir):
    from gym.infer.chat import ChatModel

    model = ChatModel({"model_name_or_path": str(tiny_model_dir), "max_new_tokens": 12}, max_batch_size=8,
                      max_waiting=64)
    yield model
    model.close()
