"""The tiny model as a ChatModel, for the `gym api` apps the tests start (tests/conftest.py: serve_app)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_chat(tiny_model_dir):
    from gym.infer.chat import ChatModel

    model = ChatModel({"model_name_or_path": str(tiny_model_dir), "max_new_tokens": 12}, max_batch_size=8,
                      max_waiting=64)
    yield model
    model.close()
