"""`gym api`'s start-up against a hostile pass (issue #39): a port another program holds, or one that cannot exist,
is one line and exit status 2 before the model loads (it used to load the whole model, then exit 3 with uvicorn's
line); the port checked is the port served, so nothing can take it in between."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
from tests.gym_cli import assert_only_an_error_line, gym_process

import gym.serve.server as server
from gym.cli import main


@pytest.fixture()
def no_model_load(monkeypatch):
    """Fail the test if `gym api` gets as far as loading a model."""
    loaded: list[object] = []

    def refuse(*args, **kwargs):
        loaded.append(args)
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(server, "ChatModel", refuse)
    return loaded


def test_a_taken_port_is_one_line_before_the_model_loads(tiny_model_dir, capsys, no_model_load):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--port", str(port)]) == 2
    assert_only_an_error_line(capsys.readouterr().err, f"port {port}", "in use", "--port")
    assert no_model_load == []


@pytest.mark.parametrize("port", ["70000", "-1", "0", "65536"])
def test_an_impossible_port_is_one_line(port, tiny_model_dir, capsys, no_model_load):
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--port", port]) == 2
    assert_only_an_error_line(capsys.readouterr().err, f"--port {port}", "1 to 65535")
    assert no_model_load == []


@pytest.mark.parametrize("host", ["256.1.1.1", "192.0.2.1"])
def test_a_host_it_cannot_listen_on_is_one_line(host, tiny_model_dir, capsys, no_model_load):
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--host", host, "--port", "8123"]) == 2
    assert_only_an_error_line(capsys.readouterr().err, f"--host {host}")
    assert no_model_load == []


@pytest.mark.parametrize(("args", "message"), [
    (["--max_wating", "3"], "Unknown config key 'max_wating'. Did you mean '--max_waiting'?"),
    (["--api_kee", "x"], "Did you mean '--api-key'?"),
    (["--nonsense_option_here", "1"], "The command's own options: --host, --port, --api-key"),
])
def test_a_misspelt_flag_is_named_against_the_commands_own_options(args, message, tiny_model_dir, capsys,
                                                                   no_model_load):
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), *args]) == 2
    assert_only_an_error_line(capsys.readouterr().err, message)
    assert no_model_load == []


def test_either_spelling_of_a_flag_is_that_flag(tiny_model_dir, capsys, no_model_load):
    """The documents write --api-key and --max_batch_size; --api_key and --max-batch-size are the same flags (and
    --flag=value their same values): here the port, checked last, is what stops the start."""
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--api_key", "k", "--max-batch-size", "4",
                 "--served-model-name=m", "--allow_remote_media", "--port", "70000"]) == 2
    assert_only_an_error_line(capsys.readouterr().err, "--port 70000", "1 to 65535")
    assert no_model_load == []


def test_a_taken_port_as_a_process_exits_2_at_once(tiny_model_dir):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        started = time.monotonic()
        done = gym_process("api", "--model_name_or_path", tiny_model_dir, "--port", port, timeout=120)
    assert done.returncode == 2, done.stderr
    assert_only_an_error_line(done.stderr, f"port {port}", "in use")
    assert time.monotonic() - started < 60


def test_the_port_is_held_while_the_model_loads(tiny_model_dir, monkeypatch):
    """The socket bound before loading is the one uvicorn serves on: another program that tries the port while the
    model loads finds it taken, and the server then answers on it."""
    import threading

    from gym.infer.chat import ChatModel

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    taken_during_load: list[bool] = []

    def loading(*args, **kwargs):
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port))
                taken_during_load.append(False)
            except OSError:
                taken_during_load.append(True)
        return ChatModel(*args, **kwargs)

    monkeypatch.setattr(server, "ChatModel", loading)
    servers: list[server.DrainingServer] = []
    real_server = server.DrainingServer

    class Recorded(real_server):  # type: ignore[misc, valid-type]
        def __init__(self, config):
            super().__init__(config)
            servers.append(self)

    monkeypatch.setattr(server, "DrainingServer", Recorded)
    thread = threading.Thread(target=server.serve, args=({"model_name_or_path": str(tiny_model_dir),
                                                          "max_new_tokens": 2},),
                              kwargs={"port": port, "graceful_seconds": 1}, daemon=True)
    # uvicorn installs signal handlers only in the main thread; in a thread it serves without them.
    thread.start()
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                assert response.status == 200
            break
        except OSError:
            assert thread.is_alive() and time.time() < deadline, "gym api did not come up"
            time.sleep(0.1)
    assert taken_during_load == [True]
    servers[0].should_exit = True
    thread.join(60)
    assert not thread.is_alive()


@pytest.mark.parametrize(("options", "message"), [
    ('{"training": {"stage": "dpo"}}', "--job_options: training.stage is set by the job itself; remove it."),
    ('{"training": {"max_stepz": 3}}', "--job_options: training: Unknown config key 'max_stepz'. Did you mean "
                                       "'max_steps'?"),
    ('{"delta_method": "int3"}', "--job_options: Unknown DeltaQuant method 'int3'"),
    ('{"delta_options": {"distil_steps": 3}}', "--job_options: delta_options for bitdelta: Unknown BitDeltaConfig "
                                               "field 'distil_steps'. Did you mean 'distill_steps'?"),
])
def test_job_options_a_job_would_refuse_are_refused_at_start(options, message, tiny_model_dir, tmp_path, capsys,
                                                             no_model_load):
    # Each was accepted, then failed in every worker's claim: the worker crashed and restarted, jobs stayed queued.
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--variants", str(tmp_path / "store"),
                 "--job_options", options]) == 2
    err = capsys.readouterr().err
    assert_only_an_error_line(err, message)
    assert not err.rstrip().endswith("?.")  # the option's own error ends its sentence
    assert no_model_load == []


@pytest.mark.parametrize("flag", [["--guard-threshold", "0.3"], ["--guard-window", "4"]])
def test_guard_settings_without_a_guard_are_refused(flag, tiny_model_dir, capsys, no_model_load):
    # They were ignored: the server answered unfiltered while its operator believed it guarded.
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), *flag]) == 2
    assert_only_an_error_line(capsys.readouterr().err, "give --guard SPEC too")
    assert no_model_load == []


def test_a_safety_gate_given_twice_is_refused(tiny_model_dir, tmp_path, capsys, no_model_load):
    # --safety-gate silently replaced --job_options' safety_gate.
    options = '{"safety_gate": {"dataset": "safety_demo", "max_rise": 0.1}}'
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--variants", str(tmp_path / "store"),
                 "--safety-gate", "safety_demo", "--job_options", options]) == 2
    assert_only_an_error_line(capsys.readouterr().err, "given twice, by --safety-gate and by --job_options")
    assert no_model_load == []


@pytest.mark.parametrize("size", ["0", "99999999999"])
def test_a_batch_size_the_engine_cannot_hold_is_refused_at_start(size, tiny_model_dir, capsys, no_model_load):
    # 0 was taken as 1; 10**11 reached the fast engine, which sized its cache for that many rows and crashed.
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--max_batch_size", size]) == 2
    assert_only_an_error_line(capsys.readouterr().err, f"--max_batch_size must be from 1 to 1024 (the rows decoded "
                                                       f"together), got {size}.")
    assert no_model_load == []
