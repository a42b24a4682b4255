"""infer_backend: llamacpp. The errors run everywhere; the engine itself runs where llama-cpp-python is
installed (`make test-llamacpp` installs it and runs this file), on the embedded model's own GGUF: the
tokens are llama.cpp's own greedy tokens, seeds reproduce, a cached prompt prefix changes nothing, and
every queued request is answered."""

from __future__ import annotations

import importlib.util
import threading

import pytest

from gym.core.errors import ConfigError
from gym.infer.chat import ChatModel
from gym.infer.requests import Piece, SamplingParams

HAVE_LLAMACPP = importlib.util.find_spec("llama_cpp") is not None
needs_llamacpp = pytest.mark.skipif(not HAVE_LLAMACPP, reason="llama-cpp-python is not installed: make test-llamacpp")

QUESTION = [{"role": "user", "content": "Name three colors."}]


def test_missing_llama_cpp_python_is_a_config_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(ConfigError, match=r"llama-cpp-python.*zoo-gym\[llamacpp\]"):
        ChatModel({"infer_backend": "llamacpp"})


@needs_llamacpp
def test_a_model_folder_is_refused_with_the_way_forward(tiny_model_dir):
    with pytest.raises(ConfigError, match="serves a GGUF file"):
        ChatModel({"model_name_or_path": str(tiny_model_dir), "infer_backend": "llamacpp"})


@pytest.fixture(scope="module")
def served():
    model = ChatModel({"infer_backend": "llamacpp"})
    yield model
    model.close()


@needs_llamacpp
def test_greedy_tokens_are_llama_cpp_own(served):
    prompt = served.render(QUESTION)
    request = served.engine.submit(prompt, SamplingParams(max_new_tokens=16, do_sample=False))
    ours = [token for event in request.events() if isinstance(event, Piece) for token in event.token_ids]

    import llama_cpp

    from gym.models.loader import embedded_gguf_path

    reference = llama_cpp.Llama(model_path=str(embedded_gguf_path()), n_ctx=1024, verbose=False)
    theirs = []
    for token in reference.generate(prompt, top_k=1, temp=0.0, min_p=0.0, top_p=1.0):
        theirs.append(token)
        if len(theirs) == 16:
            break
    reference.close()
    assert ours == theirs[:len(ours)] and len(ours) >= 8


@needs_llamacpp
def test_seeded_sampling_reproduces_and_a_cached_prefix_changes_nothing(served):
    params = dict(max_new_tokens=20, do_sample=True, temperature=0.9, top_p=0.9)
    first = served.chat(QUESTION, seed=11, **params)
    served.chat([{"role": "user", "content": "Something else entirely, to change the cached context."}],
                max_new_tokens=5)
    assert served.chat(QUESTION, seed=11, **params) == first  # fresh prefill of the shared prefix
    assert served.chat(QUESTION, seed=11, **params) == first  # the whole prompt but one token cached
    assert served.chat(QUESTION, seed=12, **params) != first


@needs_llamacpp
def test_stop_strings_and_queued_requests(served):
    text = served.chat(QUESTION, do_sample=False, max_new_tokens=30)
    cut = text[len(text) // 2:len(text) // 2 + 3]
    assert served.chat(QUESTION, do_sample=False, max_new_tokens=30, stop=cut) == text[:text.index(cut)]
    answers: dict[int, str] = {}

    def client(i: int) -> None:
        answers[i] = served.chat(QUESTION, seed=i, max_new_tokens=8, do_sample=True)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(answers) == [0, 1, 2, 3] and all(answers.values())
    assert answers[0] == served.chat(QUESTION, seed=0, max_new_tokens=8, do_sample=True)
