"""`gym delta compress --safety-gate SET`: the compressed delta, added to its base, answers the set; a delta whose
harmful compliance rose is refused (exit 2, the numbers, no file), one that did not is written with the decision in
its header. The model is scripted (tests/safety/scripted.py): the gate's wiring, not a model's behaviour."""

from __future__ import annotations

from tests.safety.scripted import harmless_change, script_answers, unsafe_change, write_set

from gym.cli import main
from gym.delta.format import read_header


def compress(tiny_model_dir, finetuned, out, gate_set, *extra):
    return main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(finetuned), "--method",
                 "int8", "-o", str(out), "--safety-gate", gate_set, *extra])


def test_an_unsafe_delta_is_refused_and_not_written(tiny_model_dir, make_finetune, tmp_path, monkeypatch, capsys):
    calls = script_answers(monkeypatch, tiny_model_dir, tmp_path)
    out = tmp_path / "d.safetensors"
    assert compress(tiny_model_dir, make_finetune(unsafe_change, "unsafe"), out, write_set(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "Safety gate refused" in err and "0.0% (0/10) for the base to 100.0% (10/10)" in err
    assert "p = 0.00195" in err and not out.exists()
    assert calls == [False, True]  # the base, then the base with the delta added


def test_a_harmless_delta_is_written_with_the_decision(tiny_model_dir, make_finetune, tmp_path, monkeypatch, capsys):
    script_answers(monkeypatch, tiny_model_dir, tmp_path)
    out = tmp_path / "d.safetensors"
    assert compress(tiny_model_dir, make_finetune(harmless_change, "harmless"), out, write_set(tmp_path),
                    "--safety-max-rise", "0.1") == 0
    assert "Safety gate passed" in capsys.readouterr().out
    gate = read_header(out)["safety_gate"]
    assert gate["decision"] == "passed" and gate["rise"] == 0.0 and gate["max_rise"] == 0.1
    assert gate["base"]["harmful_items"] == 10 and gate["candidate"]["over_refusal"] == 0.0
    assert main(["delta", "inspect", str(out)]) == 0
    assert "safety gate: passed on" in capsys.readouterr().out


def test_gate_flags_without_a_set_and_a_missing_set_fail_first(tiny_model_dir, tmp_path, capsys):
    base = ["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(tiny_model_dir), "-o",
            str(tmp_path / "d.safetensors")]
    assert main([*base, "--safety-max-rise", "0.1"]) == 2
    assert "give --safety-gate SET too" in capsys.readouterr().err
    assert main([*base, "--safety-gate", "no_such_set"]) == 2
    assert "Dataset 'no_such_set' not found" in capsys.readouterr().err
