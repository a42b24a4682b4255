"""Issue #39, Training-Free GRPO: a hostile endpoint, config, state file or library never hangs and never shows a
traceback. Endpoints here are real HTTP servers on 127.0.0.1 (threads of this process) that answer as a broken or
slow server would: a byte a second, a body that is not JSON, a chat completion of the wrong shape."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

from gym.cli import main
from gym.core.errors import ConfigError, DataError
from gym.tfgrpo.config import GRPOConfig
from gym.tfgrpo.library import ExperienceLibrary
from gym.tfgrpo.llm import LLMUnavailable, OpenAIEndpoint
from gym.tfgrpo.tasks import build_scorer
from gym.tfgrpo.trainer import TrainingFreeGRPO

HELLO = [{"role": "user", "content": "easy: say 1"}]
GOOD = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "\\boxed{1}"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class RawServer:
    """A socket server on 127.0.0.1 that answers every connection with `respond(conn, n)`, the n-th connection
    counting from 0: bytes of our choosing, as slowly as we like (http.server cannot trickle a status line)."""

    def __init__(self, respond) -> None:
        self.respond, self.connections, self.stop = respond, 0, threading.Event()
        self.first_request = 0.0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by close()
                return
            n, self.connections = self.connections, self.connections + 1
            self.first_request = self.first_request or time.monotonic()
            threading.Thread(target=self._answer, args=(conn, n), daemon=True).start()

    def _answer(self, conn: socket.socket, n: int) -> None:
        with conn, contextlib.suppress(OSError):  # the client hung up: what a deadline or close() does
            _read_request(conn)
            self.respond(conn, n, self.stop)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += _received(conn)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += _received(conn)


def _received(conn: socket.socket) -> bytes:
    """The next bytes of a request. A client that hangs up before its request is whole (a deadline, close())
    ends the connection's thread: recv would return b"" at once, forever, and the loop would spin for the rest of
    the pytest worker's life (it did: 8 threads, a core and the GIL, through every later test on that worker)."""
    chunk = conn.recv(65536)
    if not chunk:
        raise ConnectionResetError("the client hung up before its request was whole")
    return chunk


def http(status: int, body: bytes, **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X", "Content-Type: application/json", f"Content-Length: {len(body)}",
             "Connection: close", *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def answering(*responses: bytes):
    """Connection n gets responses[n] (the last one again after that)."""
    def respond(conn, n, stop):
        conn.sendall(responses[min(n, len(responses) - 1)])
    return respond


def trickling(what: str):
    """One byte a second, forever: of the headers ("head": a status line, then a header that never ends), or of
    a body that claims a gigabyte ("body")."""
    def respond(conn, n, stop):
        if what == "head":
            head = b"HTTP/1.1 200 OK\r\nX-Padding: "
        else:
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{"
        for byte in head:
            conn.sendall(bytes([byte]))
            if stop.wait(1.0 if what == "head" else 0):
                return
        while not stop.wait(1.0):
            conn.sendall(b"a" if what == "head" else b" ")
    return respond


@pytest.fixture()
def raw_server():
    servers = []

    def start(respond):
        servers.append(RawServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _in_thread(fn, limit: float):
    """fn() in a thread, given `limit` seconds: a hang fails the test instead of hanging the suite."""
    outcome: dict[str, object] = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the test as it is
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    started = time.perf_counter()
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still running after {limit} s"
    return outcome, time.perf_counter() - started


# ---------------------------------------------------------------- 1. a trickling endpoint

@pytest.mark.parametrize("what", ["head", "body"])
def test_a_trickling_endpoint_is_abandoned_at_the_timeout(raw_server, what):
    server = raw_server(trickling(what))
    endpoint = OpenAIEndpoint(server.base_url, "m", "key", timeout=1.5, max_retries=0)
    outcome, elapsed = _in_thread(lambda: endpoint.complete(HELLO, temperature=0.0, max_tokens=8), limit=10)
    assert isinstance(outcome.get("error"), LLMUnavailable), outcome
    assert "no complete answer within the 1.5 s timeout" in str(outcome["error"])
    assert elapsed < 1.5 + 1.0


def test_the_deadline_is_per_call_and_a_retry_gets_a_fresh_one(raw_server):
    server = raw_server(trickling("head"))
    endpoint = OpenAIEndpoint(server.base_url, "m", timeout=1.0, max_retries=1, retry_delay=0.0)
    outcome, elapsed = _in_thread(lambda: endpoint.complete(HELLO, temperature=0.0, max_tokens=8), limit=10)
    assert "failed 2 times" in str(outcome.get("error")) and server.connections == 2
    assert 2.0 <= elapsed < 2.0 + 1.0


def test_close_abandons_the_calls_in_flight_and_the_retry_waits(raw_server):
    server = raw_server(trickling("head"))
    endpoint = OpenAIEndpoint(server.base_url, "m", timeout=60, max_retries=3, retry_delay=30)
    threading.Timer(0.5, endpoint.close).start()
    outcome, elapsed = _in_thread(lambda: endpoint.complete(HELLO, temperature=0.0, max_tokens=8), limit=10)
    assert "the call was abandoned, the endpoint was closed" in str(outcome.get("error")) and elapsed < 2
    with pytest.raises(LLMUnavailable, match="the endpoint was closed"):
        endpoint.complete(HELLO, temperature=0.0, max_tokens=8)


def test_close_leaves_the_tasks_the_http_library_spawned_to_end_with_their_call():
    """CI once failed here (the CLI test below): close() cancelled every task on the endpoint's loop, one of them
    a connection attempt anyio had spawned but not yet started, and anyio's wrapper then dropped its coroutine
    un-awaited: a RuntimeWarning, or at the interpreter's exit a traceback. The loop is held here so that the
    call spawns its child in the same turn as close() sweeps the loop, the order the race needs."""
    import asyncio
    import gc
    import types
    import warnings

    import anyio

    spawned_waiting, ready = threading.Event(), {}

    async def connect_attempt():
        await asyncio.sleep(60)

    class Completions:
        async def create(self, **request):
            ready["go"] = asyncio.get_running_loop().create_future()
            spawned_waiting.set()
            await ready["go"]
            async with anyio.create_task_group() as tg:  # what httpx's connect does under the openai client
                tg.start_soon(connect_attempt)
                await asyncio.sleep(60)

    async def close_client():
        pass

    endpoint = OpenAIEndpoint("http://127.0.0.1:9/v1", "m", timeout=60, max_retries=0)
    endpoint.client = types.SimpleNamespace(close=close_client, chat=types.SimpleNamespace(
        completions=types.SimpleNamespace(with_raw_response=Completions())))
    loop, outcome = endpoint._loop, {}

    def call():
        try:
            endpoint.complete(HELLO, temperature=0.0, max_tokens=8)
        except LLMUnavailable as exc:
            outcome["error"] = exc

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert spawned_waiting.wait(5)
    held, release = threading.Event(), threading.Event()
    loop.call_soon_threadsafe(lambda: (held.set(), release.wait(10)))
    assert held.wait(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop.call_soon_threadsafe(ready["go"].set_result, None)  # the call spawns its child in the next turn...
        closer = threading.Thread(target=endpoint.close, daemon=True)
        closer.start()

        def sweep_queued():  # ...and close()'s sweep of the loop is queued behind it
            return any(getattr(getattr(handle, "_callback", None), "__qualname__", "").startswith(
                "run_coroutine_threadsafe") for handle in list(loop._ready))

        deadline = time.monotonic() + 5
        while not sweep_queued() and time.monotonic() < deadline:
            time.sleep(0.001)
        release.set()
        closer.join(10)
        caller.join(10)
        gc.collect()
    assert not closer.is_alive() and not caller.is_alive()
    assert "the call was abandoned, the endpoint was closed" in str(outcome.get("error"))
    assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]


def test_an_endpoint_dropped_without_close_stops_its_thread():
    import gc

    def endpoint_threads():
        return [t for t in threading.enumerate() if t.name == "endpoint http://127.0.0.1:9/v1"]

    before = len(endpoint_threads())
    endpoint = OpenAIEndpoint("http://127.0.0.1:9/v1", "m")
    assert len(endpoint_threads()) == before + 1
    del endpoint
    gc.collect()
    deadline = time.monotonic() + 5
    while len(endpoint_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(endpoint_threads()) == before


def test_after_a_call_fails_the_queued_calls_are_dropped():
    calls = []

    class Down:
        name = "down"

        def complete(self, messages, *, temperature, max_tokens, seed=None):
            calls.append(seed)
            time.sleep(0.2)  # what a timeout costs, shortened
            raise LLMUnavailable("the endpoint is down")

    build_scorer("accuracy")  # the verifier's imports (torch among them) before the clock starts
    trainer = TrainingFreeGRPO(Down(), GRPOConfig(group_size=5, batch_size=8, max_concurrency=2, max_epochs=1))
    outcome, elapsed = _in_thread(lambda: trainer.train([{"question": f"q{i}", "answer": "1"} for i in range(8)]),
                                  limit=10)
    assert isinstance(outcome.get("error"), LLMUnavailable)
    assert len(calls) <= 4 and elapsed < 1.5  # not 40 rollouts, 0.2 s each, 2 at a time


@pytest.mark.slow
def test_gym_tfgrpo_train_against_a_trickling_endpoint_exits_2_in_time(raw_server, tmp_path):
    server = raw_server(trickling("head"))
    config = _config(tmp_path, server.base_url, timeout=3, max_retries=0, max_concurrency=2)
    process = subprocess.Popen([sys.executable, "-m", "gym.cli", "tfgrpo", "train", str(config)], cwd=tmp_path,
                               stderr=subprocess.PIPE, text=True)
    lines = []  # (when, line): the error line is timed from the first request (Python's start and torch are not)
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in process.stderr),
                              daemon=True)
    reader.start()
    try:
        assert process.wait(timeout=120) == 2
    finally:
        process.kill()
    reader.join(5)
    errors = [(when, line) for when, line in lines if line.startswith("gym: error: ")]
    assert len(errors) == 1 and "Traceback" not in "".join(line for _, line in lines)
    when, line = errors[0]
    assert "no complete answer within the 3 s timeout" in line
    assert when - server.first_request < 3 + 1.5  # not the next call's 3 s, nor the minutes of a trickle


def test_a_prompt_endpoint_still_answers(raw_server):
    server = raw_server(answering(http(200, json.dumps(GOOD).encode())))
    answer = OpenAIEndpoint(server.base_url, "m", timeout=5, max_retries=0).complete(
        HELLO, temperature=0.0, max_tokens=8)
    assert answer.text == "\\boxed{1}" and answer.prompt_tokens == 3 and answer.completion_tokens == 1


# ---------------------------------------------------------------- 4. what an endpoint answers

def test_retry_after_nan_is_ignored_for_the_backoff(raw_server):
    server = raw_server(answering(http(429, b'{"error": {"message": "slow down"}}', Retry_After="nan"),
                                  http(200, json.dumps(GOOD).encode())))
    endpoint = OpenAIEndpoint(server.base_url, "m", timeout=5, max_retries=2, retry_delay=0.01)
    assert endpoint.complete(HELLO, temperature=0.0, max_tokens=8).text == "\\boxed{1}"
    assert server.connections == 2


def _with_choices(choices) -> bytes:
    return json.dumps({**GOOD, "choices": choices}).encode()


BROKEN = {
    "garbage": (http(200, b"<html>proxy error</html>"), "not a chat completion"),
    "choices_string": (http(200, _with_choices("x")), "'choices' is not a list"),
    "choice_not_object": (http(200, _with_choices([7])), "'choices[0]' is not an object"),
    "message_null": (http(200, _with_choices([{"index": 0, "message": None}])),
                     "'choices[0].message' is not an object"),
    "content_number": (http(200, _with_choices([{"index": 0, "message": {"role": "assistant", "content": 5}}])),
                       "'choices[0].message.content' is 5, not text"),
    "not_an_object": (http(200, b"[1, 2]"), "not a chat completion"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_malformed_answer_is_a_clear_error_through_the_cli(raw_server, tmp_path, capsys, monkeypatch, case):
    response, fragment = BROKEN[case]
    server = raw_server(answering(response))
    monkeypatch.chdir(tmp_path)
    assert main(["tfgrpo", "train", str(_config(tmp_path, server.base_url, max_retries=0))]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert "answered with something that is not a chat completion" in err and fragment in err


def test_a_malformed_answer_is_not_retried(raw_server):
    server = raw_server(answering(BROKEN["choices_string"][0]))
    with pytest.raises(LLMUnavailable, match="'choices' is not a list"):
        OpenAIEndpoint(server.base_url, "m", max_retries=3, retry_delay=0.0).complete(HELLO, temperature=0,
                                                                                       max_tokens=8)
    assert server.connections == 1  # the same server would send it again


def test_a_null_content_is_an_empty_answer(raw_server):
    server = raw_server(answering(http(200, _with_choices([{"index": 0, "message": {"role": "assistant",
                                                                                       "content": None}}]))))
    assert OpenAIEndpoint(server.base_url, "m", max_retries=0).complete(HELLO, temperature=0, max_tokens=8).text == ""


# ---------------------------------------------------------------- 4. the config and the state file

@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("retry_delay", float("nan"), "'retry_delay' must be a number >= 0, got nan"),
    ("retry_delay", float("inf"), "'retry_delay' must be a number >= 0, got inf"),
    ("timeout", -5, "'timeout' must be a number of seconds above 0, got -5"),
    ("timeout", 0, "'timeout' must be a number of seconds above 0, got 0"),
    ("timeout", float("nan"), "'timeout' must be a number of seconds above 0, got nan"),
    ("temperature_train", float("nan"), "'temperature_train' must be in [0, 2], got nan"),
    ("updater_base_url", "localhost", "'updater_base_url' must be an http:// or https:// address"),
])
def test_config_values_that_cannot_work_exit_2(tmp_path, capsys, monkeypatch, key, value, fragment):
    monkeypatch.chdir(tmp_path)
    assert main(["tfgrpo", "train", str(_config(tmp_path, "http://127.0.0.1:9/v1", **{key: value}))]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and fragment in err and "Traceback" not in err
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        GRPOConfig(**{key: value})


@pytest.mark.parametrize(("content", "fragment"), [
    ('{"config": {"group_size": 4', "not valid JSON"),
    ("[1, 2, 3]", "not a TF-GRPO state"),
    ('{"config": null, "next": "x"}', "not a TF-GRPO state"),
    ("", "not valid JSON"),
])
def test_a_broken_state_file_exits_2_and_is_left_as_it_was(tmp_path, capsys, monkeypatch, fake_openai, scripted,
                                                           content, fragment):
    monkeypatch.chdir(tmp_path)
    server = fake_openai(scripted())
    (tmp_path / "run").mkdir()
    state = tmp_path / "run" / "tfgrpo_state.json"
    state.write_text(content)
    assert main(["tfgrpo", "train", str(_config(tmp_path, server.base_url))]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and fragment in err and "Traceback" not in err
    assert str(state) in err and "overwrite_output_dir: true" in err
    assert state.read_text() == content and server.requests == 0


def test_a_state_file_with_other_settings_is_refused_whatever_its_next(tmp_path, fake_openai, scripted, capsys,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    server = fake_openai(scripted())
    config = _config(tmp_path, server.base_url)
    assert main(["tfgrpo", "train", str(config)]) == 0
    state = tmp_path / "run" / "tfgrpo_state.json"
    saved = json.loads(state.read_text())
    saved["next"] = [0, "one"]
    state.write_text(json.dumps(saved))
    capsys.readouterr()
    assert main(["tfgrpo", "train", str(config)]) == 2
    assert "not a TF-GRPO state" in capsys.readouterr().err


@pytest.mark.parametrize(("verb", "suggestion"), [("trian", "train"), ("evl", "eval"), ("tain", "train")])
def test_a_mistyped_sub_command_names_the_closest(capsys, verb, suggestion):
    assert main(["tfgrpo", verb, "cfg.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and f"Did you mean '{suggestion}'?" in err
    assert f"unknown tfgrpo command '{verb}'" in err


def test_an_unknown_sub_command_far_from_any_lists_them(capsys):
    assert main(["tfgrpo", "frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Choose train or eval." in err


# ---------------------------------------------------------------- 5. the library `gym api --experiences` loads

@pytest.mark.parametrize(("step", "fragment"), [
    ('"abc"', "'step' must be a whole number >= 0, got 'abc'"),
    ("1e400", "'step' must be a whole number >= 0, got inf"),
    ("-3", "'step' must be a whole number >= 0, got -3"),
    ("2.5", "'step' must be a whole number >= 0, got 2.5"),
    ("[1]", "'step' must be a whole number >= 0, got [1]"),
])
def test_a_library_with_a_bad_step_is_refused_at_load(tmp_path, capsys, step, fragment):
    path = tmp_path / "experiences.json"
    path.write_text(f'{{"step": {step}, "experiences": {{"0": "Check the units."}}}}')
    with pytest.raises(DataError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        ExperienceLibrary.load(path)
    # gym api loads the library before the model: the error comes first, the model is never loaded
    assert main(["api", "model_name_or_path=/nonexistent", "--experiences", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and str(path) in err and fragment in err and "Traceback" not in err


def test_whole_number_steps_still_load(tmp_path):
    for step, expected in (("3", 3), ("3.0", 3), ("null", 0), ('"4"', 4)):
        path = tmp_path / "experiences.json"
        path.write_text(f'{{"step": {step}, "experiences": ["Check the units."]}}')
        assert ExperienceLibrary.load(path).step == expected


# ---------------------------------------------------------------- helpers

def _config(tmp_path, base_url, **overrides):
    data = [{"question": f"mix {i}", "answer": "1"} for i in range(4)]
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "queries.json").write_text(json.dumps(data))
    config = {"model": "m", "base_url": base_url, "api_key": "k", "dataset": str(tmp_path / "data" / "queries.json"),
              "reward_funcs": "accuracy", "group_size": 2, "max_epochs": 1, "batch_size": 2, "max_concurrency": 1,
              "retry_delay": 0.0, "output_dir": str(tmp_path / "run"), **overrides}
    path = tmp_path / "tfgrpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(("content", "fragment"), [
    (b"\xff\xfe\x00binary", "not a JSON text file"),
    (b'{"step": 1' + b"9" * 5000 + b', "experiences": []}', "not a JSON text file"),
    (b"[1, 2]", "expected {\"experiences\""),
])
def test_a_library_file_that_is_not_one_is_refused_at_load(tmp_path, content, fragment):
    path = tmp_path / "experiences.json"
    path.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(fragment)):
        ExperienceLibrary.load(path)
    with pytest.raises(DataError, match="a folder"):
        ExperienceLibrary.load(tmp_path)


@pytest.mark.parametrize("verb", ["train", "eval"])
def test_an_empty_dataset_is_named_whichever_verb_reads_it(tmp_path, capsys, monkeypatch, verb):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    key = "dataset" if verb == "train" else "eval_dataset"
    assert main(["tfgrpo", verb, str(_config(tmp_path, "http://127.0.0.1:9/v1", **{key: "empty.jsonl"}))]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "empty.jsonl holds no queries" in err and "to train on" not in err


def test_a_base_url_that_is_no_http_address_exits_2_before_any_call(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    assert main(["tfgrpo", "train", str(_config(tmp_path, "127.0.0.1:8000/v1", retry_delay=1.0))]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "'base_url' must be an http:// or https:// address" in err
    assert time.monotonic() - started < 30  # not after every retry


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("val_size", -1, "'val_size' is a fraction in [0, 1) or a whole number of rows, got -1"),  # held one row out
    ("val_size", 1.5, "'val_size' is a fraction in [0, 1) or a whole number of rows, got 1.5"),  # held one out
    ("max_samples", 0, "'max_samples' must be a whole number of at least 1 or None, got 0"),  # read every row
])
@pytest.mark.parametrize("verb", ["train", "eval"])
def test_held_out_and_sample_counts_that_mean_nothing_exit_2(tmp_path, capsys, monkeypatch, verb, key, value,
                                                            fragment):
    monkeypatch.chdir(tmp_path)
    assert main(["tfgrpo", verb, str(_config(tmp_path, "http://127.0.0.1:9/v1", **{key: value}))]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and fragment in err and "Traceback" not in err
