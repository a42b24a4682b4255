"""The vLLM backend against a fake `vllm` package: Gym's sampling settings become vLLM's, vLLM's cumulative
outputs become Piece events with only what is new, cancel aborts the vLLM request, and one LoRA adapter
rides along on every generate call. The engine runs its own asyncio loop in a thread, as it does for real."""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
import time
import types
from dataclasses import dataclass, field

import pytest

from gym.core.errors import ConfigError
from gym.infer.requests import EngineBusy, Finished, Piece, SamplingParams

TIMEOUT = 2.0  # seconds any wait in these tests may take before it counts as a hang
STOP_IDS = [2, 7]
PROMPT = [11, 12, 13]


@dataclass
class Step:
    """One cumulative vLLM output; `gate` makes the fake wait for the test before yielding it."""
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    gate: threading.Event | None = None


@dataclass
class Call:
    prompt: dict
    sampling: object
    request_id: str
    lora_request: object


@dataclass
class FakeVllm:
    """What the fake `vllm` package saw, and what its engine will answer (`script`, a list of Steps)."""
    script: list[Step] = field(default_factory=list)
    engine_args: list[object] = field(default_factory=list)
    engines: list[object] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    shutdowns: int = 0


def _fake_vllm_modules(state: FakeVllm) -> dict[str, types.ModuleType]:
    class AsyncEngineArgs:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class VllmSamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LoRARequest:
        def __init__(self, lora_name, lora_int_id, lora_path):
            self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path

    class FakeAsyncEngine:
        def __init__(self, args):
            self.args = args
            self.thread = threading.current_thread()  # where from_engine_args ran: the engine's loop thread

        async def generate(self, prompt, sampling_params, request_id, lora_request=None):
            assert threading.current_thread() is self.thread, "generate ran off the engine's loop thread"
            state.calls.append(Call(prompt, sampling_params, request_id, lora_request))
            try:
                for step in list(state.script):
                    if step.gate is not None:
                        deadline = time.monotonic() + TIMEOUT
                        while not step.gate.is_set():
                            if time.monotonic() > deadline:
                                raise TimeoutError("the test never opened the gate")
                            await asyncio.sleep(0.002)
                    else:
                        await asyncio.sleep(0)
                    completion = types.SimpleNamespace(text=step.text, token_ids=tuple(step.token_ids),
                                                       finish_reason=step.finish_reason)
                    yield types.SimpleNamespace(request_id=request_id, outputs=[completion])
            finally:
                state.closed.append(request_id)  # run to the end, or closed by the caller

        async def abort(self, request_id):
            state.aborted.append(request_id)

        def shutdown(self):
            state.shutdowns += 1

    class AsyncLLMEngine:
        @classmethod
        def from_engine_args(cls, args):
            state.engine_args.append(args)
            engine = FakeAsyncEngine(args)
            state.engines.append(engine)
            return engine

    vllm = types.ModuleType("vllm")
    vllm.AsyncEngineArgs, vllm.AsyncLLMEngine, vllm.SamplingParams = AsyncEngineArgs, AsyncLLMEngine, VllmSamplingParams
    lora = types.ModuleType("vllm.lora")
    lora_request = types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = LoRARequest
    vllm.lora, lora.request = lora, lora_request
    return {"vllm": vllm, "vllm.lora": lora, "vllm.lora.request": lora_request}


@pytest.fixture()
def fake(monkeypatch):
    """A fake vllm in sys.modules and gym.infer.vllm_engine imported fresh against it (removed afterwards)."""
    state = FakeVllm(script=[Step("Hel", [101, 102]), Step("Hello wor", [101, 102, 103, 104]),
                             Step("Hello world", [101, 102, 103, 104, 105], "stop")])
    for name, module in _fake_vllm_modules(state).items():
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules.pop("gym.infer.vllm_engine", None)
    state.module = importlib.import_module("gym.infer.vllm_engine")
    yield state
    sys.modules.pop("gym.infer.vllm_engine", None)
    import gym.infer

    if hasattr(gym.infer, "vllm_engine"):
        delattr(gym.infer, "vllm_engine")


@pytest.fixture()
def make_engine(fake):
    engines = []

    def make(adapters=(), max_waiting=8, **kwargs):
        engine = fake.module.VllmEngine("/models/m", list(adapters), STOP_IDS, max_batch_size=4,
                                        max_waiting=max_waiting, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown(timeout=TIMEOUT)


def _events(request) -> list:
    return list(request.events(timeout=TIMEOUT))


def _wait_until(condition) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


# -- sampling settings -----------------------------------------------------------------------------
def test_sampling_params_translate_to_vllm(fake, make_engine):
    engine = make_engine()
    params = SamplingParams(max_new_tokens=7, do_sample=True, temperature=0.5, top_p=0.9, top_k=40,
                            repetition_penalty=1.1, stop=["###", "\nUser:"], seed=3)
    _events(engine.submit(PROMPT, params))
    (call,) = fake.calls
    assert call.prompt == {"prompt_token_ids": PROMPT}
    assert call.sampling.kwargs == {
        "n": 1, "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.1,
        "stop": ["###", "\nUser:"], "stop_token_ids": STOP_IDS, "seed": 3, "skip_special_tokens": True}


@pytest.mark.parametrize("do_sample,temperature", [(False, 0.7), (True, 0.0)])
def test_greedy_is_temperature_zero_and_defaults_map_to_vllm_sentinels(fake, make_engine, do_sample, temperature):
    """Greedy (do_sample off, or temperature 0) -> temperature 0.0; top_k 0 (off) -> vLLM's -1; no stop
    strings -> None; no seed -> None."""
    engine = make_engine()
    _events(engine.submit(PROMPT, SamplingParams(max_new_tokens=5, do_sample=do_sample, temperature=temperature,
                                                 top_k=0)))
    kwargs = fake.calls[0].sampling.kwargs
    assert kwargs["temperature"] == 0.0 and kwargs["top_k"] == -1
    assert kwargs["stop"] is None and kwargs["seed"] is None and kwargs["max_tokens"] == 5


# -- events ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("vllm_reason,reason", [("stop", "stop"), ("length", "length")])
def test_cumulative_outputs_become_pieces_of_new_text_then_finished(fake, make_engine, vllm_reason, reason):
    fake.script[-1].finish_reason = vllm_reason
    engine = make_engine()
    request = engine.submit(PROMPT, SamplingParams(max_new_tokens=5))
    assert _events(request) == [
        Piece("Hel", [101, 102]), Piece("lo wor", [103, 104]), Piece("ld", [105]),
        Finished(reason, prompt_tokens=3, completion_tokens=5, text="Hello world")]
    assert request.text == "Hello world" and request.generated == [101, 102, 103, 104, 105]
    assert fake.aborted == []


def test_each_request_gets_its_own_vllm_request_id(fake, make_engine):
    engine = make_engine()
    for _ in range(3):
        assert isinstance(_events(engine.submit(PROMPT, SamplingParams()))[-1], Finished)
    ids = [call.request_id for call in fake.calls]
    assert len(set(ids)) == 3 and all(isinstance(i, str) and i for i in ids)


def test_cancel_mid_stream_aborts_the_same_vllm_request(fake, make_engine):
    gate = threading.Event()
    fake.script[1].gate = gate  # the second output waits until the test has cancelled
    engine = make_engine()
    request = engine.submit(PROMPT, SamplingParams())
    events = request.events(timeout=TIMEOUT)
    assert next(events) == Piece("Hel", [101, 102])
    request.cancel()
    gate.set()
    rest = list(events)
    assert rest == [Finished("cancelled", prompt_tokens=3, completion_tokens=2, text="Hel")]  # nothing after cancel
    assert fake.aborted == [fake.calls[0].request_id]
    assert engine.load["running"] == 0
    _wait_until(lambda: fake.closed == fake.aborted)  # the abandoned vLLM stream is closed, not left suspended


def test_sink_receives_the_same_events_as_events(fake, make_engine):
    engine = make_engine()
    expected = _events(engine.submit(PROMPT, SamplingParams()))
    seen, threads, done = [], set(), threading.Event()

    def sink(event):
        seen.append(event)
        threads.add(threading.current_thread())
        if isinstance(event, Finished):
            done.set()

    request = engine.submit(PROMPT, SamplingParams(), sink=sink)
    assert done.wait(TIMEOUT)
    assert seen == expected and isinstance(seen[-1], Finished) and len(seen) == 4
    assert threads == {fake.engines[0].thread}  # called from the engine's loop thread
    with pytest.raises(AssertionError, match="reports to a callback"):  # a sink request has no queue to read
        next(request.events(timeout=TIMEOUT))


# -- adapters --------------------------------------------------------------------------------------
def test_more_than_one_adapter_is_a_config_error(fake):
    threads = set(threading.enumerate())
    with pytest.raises(ConfigError, match="one LoRA adapter"):
        fake.module.VllmEngine("/models/m", ["/a1", "/a2"], STOP_IDS, max_batch_size=4, max_waiting=8)
    assert fake.engine_args == [] and set(threading.enumerate()) == threads  # nothing started


def test_an_adapter_with_nan_is_refused_before_vllm_starts(fake, tmp_path):
    # vLLM loads the adapter itself, so the check peft's loading gets is made here: else NaN is served.
    import torch
    from safetensors.torch import save_file

    from gym.core.errors import ModelError

    weights = torch.ones(4, 8)
    weights[1, 2] = float("inf")
    save_file({"base_model.model.q_proj.lora_A.weight": weights}, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(ModelError, match=r"the tensor base_model.model.q_proj.lora_A.weight holds NaN or inf"):
        fake.module.VllmEngine("/models/m", [str(tmp_path)], STOP_IDS, max_batch_size=4, max_waiting=8)
    assert fake.engine_args == []  # nothing started


def test_one_adapter_is_a_lora_request_on_every_generate(fake, make_engine):
    engine = make_engine(adapters=["/adapters/a1"])
    (args,) = fake.engine_args
    assert args.kwargs == {"model": "/models/m", "max_num_seqs": 4, "enable_lora": True, "trust_remote_code": False}
    for _ in range(2):
        _events(engine.submit(PROMPT, SamplingParams()))
    assert len(fake.calls) == 2
    lora = fake.calls[0].lora_request
    assert lora is not None and lora.lora_path == "/adapters/a1" and lora.lora_int_id == 1
    assert all(call.lora_request is lora for call in fake.calls)


def test_no_adapter_no_lora(fake, make_engine):
    engine = make_engine(trust_remote_code=True)
    (args,) = fake.engine_args
    assert args.kwargs == {"model": "/models/m", "max_num_seqs": 4, "enable_lora": False, "trust_remote_code": True}
    _events(engine.submit(PROMPT, SamplingParams()))
    assert fake.calls[0].lora_request is None


# -- load and back-pressure ------------------------------------------------------------------------
def test_submitting_past_max_waiting_in_flight_is_engine_busy(fake, make_engine):
    gate = threading.Event()
    fake.script[0].gate = gate  # every request stays in flight until the gate opens
    engine = make_engine(max_waiting=2)
    first, second = engine.submit(PROMPT, SamplingParams()), engine.submit(PROMPT, SamplingParams())
    assert engine.load == {"running": 2, "waiting": 0}
    with pytest.raises(EngineBusy, match="2 requests are in flight"):
        engine.submit(PROMPT, SamplingParams())
    gate.set()
    for request in (first, second):
        assert _events(request)[-1].reason == "stop"
    assert engine.load == {"running": 0, "waiting": 0}  # counted down before Finished is emitted
    assert _events(engine.submit(PROMPT, SamplingParams()))[-1].reason == "stop"  # room again


# -- shutdown --------------------------------------------------------------------------------------
def test_shutdown_stops_the_loop_thread(fake):
    threads_before = set(threading.enumerate())
    engine = fake.module.VllmEngine("/models/m", [], STOP_IDS, max_batch_size=4, max_waiting=8)
    thread = fake.engines[0].thread
    assert thread is not threading.current_thread() and thread not in threads_before and thread.is_alive()
    assert thread.name == "gym-vllm" and thread.daemon
    _events(engine.submit(PROMPT, SamplingParams()))
    engine.shutdown(timeout=TIMEOUT)
    assert not thread.is_alive() and fake.shutdowns == 1


# -- the guarantees HFEngine gives, kept by this engine too ---------------------------------------
def test_shutdown_finishes_requests_in_flight_and_refuses_new_ones(fake, make_engine):
    from gym.infer.requests import EngineStopped

    gate = threading.Event()  # never opened: the request is mid-stream when the engine shuts down
    fake.script = [Step("Hel", [101, 102]), Step("Hello", [101, 102, 103], "stop", gate=gate)]
    engine = make_engine()
    request = engine.submit(PROMPT, SamplingParams())
    _wait_until(lambda: request.text == "Hel")
    engine.shutdown(timeout=TIMEOUT)
    events = _events(request)
    assert events[-1] == Finished("cancelled", 3, 2, "Hel")
    assert engine.load == {"running": 0, "waiting": 0}
    with pytest.raises(EngineStopped, match="shutting down"):
        engine.submit(PROMPT, SamplingParams())


def test_a_failure_inside_vllm_ends_the_request_and_is_logged(fake, make_engine, caplog):
    fake.script = [Step("Hel", [101, 102]), Step("boom", None)]  # tuple(None) raises inside the fake vLLM
    engine = make_engine()
    events = _events(engine.submit(PROMPT, SamplingParams()))
    assert events[-1].reason == "cancelled" and engine.load["running"] == 0
    assert any("vLLM failed" in r.message for r in caplog.records)


def test_an_aborted_vllm_request_is_cancelled_not_stopped(fake, make_engine):
    fake.script = [Step("Hel", [101, 102], "abort")]
    assert _events(make_engine().submit(PROMPT, SamplingParams()))[-1].reason == "cancelled"


def test_an_empty_prompt_is_refused(fake, make_engine):
    with pytest.raises(ValueError, match="empty"):
        make_engine().submit([], SamplingParams())
