"""`gym export --format ollama`: the GGUF and a Modelfile whose Go TEMPLATE renders the trained chat format.

The TEMPLATE is rendered here by a small interpreter of the Go text/template constructs it uses (if / else if /
range / eq / and, and the .System, $.System, $m.Role, $m.Content fields), and compared with Gym's own rendering
for every named template."""

from __future__ import annotations

import json
import re

import pytest

from gym.cli import main
from gym.data.templates import TEMPLATES, ChatFormat
from gym.export.ollama import go_chat_template

ACTION = re.compile(r"(\{\{.*?\}\})", re.DOTALL)


def _parse(tokens: list[str], at: int = 0) -> tuple[list, int, str | None]:
    nodes: list = []
    while at < len(tokens):
        token = tokens[at]
        at += 1
        if not (token.startswith("{{") and token.endswith("}}")):
            if token:
                nodes.append(("text", token))
            continue
        action = token[2:-2].strip()
        if action in ("end", "else") or action.startswith("else if "):
            return nodes, at, action
        if action.startswith("if "):
            branches, condition = [], action[3:]
            while True:
                body, at, stop = _parse(tokens, at)
                branches.append((condition, body))
                if stop == "end":
                    break
                condition = "true" if stop == "else" else stop[len("else if "):]
            nodes.append(("if", branches))
        elif action == "range $i, $m := .Messages":
            body, at, _ = _parse(tokens, at)
            nodes.append(("range", body))
        else:
            nodes.append(("out", action))
    return nodes, at, None


def _value(expr: str, env: dict):
    expr = expr.strip()
    if expr == "true":
        return True
    if expr.startswith("(") and expr.endswith(")"):
        return _value(expr[1:-1], env)
    if expr.startswith("and "):
        a, b = re.match(r"and (\(.*?\)) (\S+)$", expr).groups()
        return _value(a, env) and _value(b, env)
    if expr.startswith("eq "):
        a, b = expr[3:].split(" ", 1)
        return _value(a, env) == _value(b, env)
    if expr.startswith('"'):
        return expr.strip('"')
    return {".System": env["system"], "$.System": env["system"], "$i": env.get("i"),
            "$m.Role": env.get("m", {}).get("role"), "$m.Content": env.get("m", {}).get("content")}.get(expr, int(expr)
                                                                                                     if expr.isdigit()
                                                                                                     else None)


def _run(nodes: list, env: dict) -> str:
    out = []
    for kind, *rest in nodes:
        if kind == "text":
            out.append(rest[0])
        elif kind == "out":
            out.append(str(_value(rest[0], env)))
        elif kind == "if":
            for condition, body in rest[0]:
                if _value(condition, env):
                    out.append(_run(body, env))
                    break
        else:
            for i, message in enumerate(env["messages"]):
                out.append(_run(rest[0], {**env, "i": i, "m": message}))
    return "".join(out)


def render_go(template: str, system: str | None, messages: list[dict[str, str]]) -> str:
    nodes, _, _ = _parse(ACTION.split(template))
    return _run(nodes, {"system": system or "", "messages": [
        {"role": "tool" if m["role"] == "observation" else m["role"], "content": m["content"]} for m in messages]})


CONVERSATIONS = [
    ([{"role": "user", "content": "Hi"}], None),
    ([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}],
     "Be brief."),
    ([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
      {"role": "observation", "content": "42"}], "S"),
]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("thinking", [True, False])
def test_go_template_renders_the_trained_prompt(tokenizer, name, thinking):
    chat = ChatFormat(tokenizer, TEMPLATES[name], None, thinking)
    go = go_chat_template(TEMPLATES[name], tokenizer.eos_token, tokenizer.bos_token, thinking)
    for messages, system in CONVERSATIONS:
        if TEMPLATES[name].thinking and thinking and len(messages) > 1:
            continue  # Go templates cannot test for "<think>" in a past answer (docs/export.md)
        expected = chat.render_prompt(messages, system)
        assert render_go(go, system or TEMPLATES[name].default_system, messages) == expected, (name, messages)


def test_a_bos_opening_every_user_turn_is_left_to_llama_cpp_on_the_first(tokenizer):
    """Llama 2 opens every user turn with <s>: at the prompt's start llama.cpp adds its own, and the Modelfile wrote a
    second one; later turns keep theirs (Ollama's Llama 2 template writes </s><s> after each answer)."""
    chat = ChatFormat(tokenizer, TEMPLATES["llama2"], None)
    go = go_chat_template(TEMPLATES["llama2"], "</s>", "<s>")
    for messages, system in CONVERSATIONS[:2]:
        expected = chat.render_prompt(messages, system).replace(tokenizer.eos_token, "</s>")
        assert expected.startswith("<s>[INST] ") and render_go(go, system, messages) == expected[len("<s>"):]
    assert render_go(go, None, CONVERSATIONS[1][0]).count("<s>[INST]") == 1  # the second turn's
    # ChatML opens its turns with SmolLM2's BOS text, but after its system turn: nothing is taken from it.
    assert go_chat_template(TEMPLATES["chatml"], tokenizer.eos_token, tokenizer.bos_token) == \
        go_chat_template(TEMPLATES["chatml"], tokenizer.eos_token, None)


def test_ollama_export_writes_the_gguf_and_its_modelfile(trained_run, tmp_path, tokenizer):
    out = tmp_path / "ollama"
    assert main(["export", "--output_dir", str(trained_run), "--format", "ollama", "--quantization", "q8_0",
                 "--export_dir", str(out)]) == 0
    modelfile = (out / "Modelfile").read_text()
    [gguf_file] = out.glob("*.gguf")
    assert modelfile.startswith(f"FROM ./{gguf_file.name}\n")
    assert 'SYSTEM """Answer briefly."""' in modelfile and "PARAMETER temperature 0.3" in modelfile
    template = re.search(r'TEMPLATE """(.*?)"""', modelfile, re.DOTALL).group(1)
    chat = ChatFormat(tokenizer, TEMPLATES["llama3"], "Answer briefly.")
    question = [{"role": "user", "content": "What is 2+2?"}]
    assert render_go(template, "Answer briefly.", question) == chat.render_prompt(question)
    manifest = json.loads((out / "gym_manifest.json").read_text())
    assert sorted(manifest["files"]) == ["Modelfile", gguf_file.name]
    # An --overwrite at another type replaces the folder: no GGUF of the first type is left behind.
    assert main(["export", "--output_dir", str(trained_run), "--format", "ollama", "--quantization", "f16",
                 "--export_dir", str(out), "--overwrite"]) == 0
    assert [p.name for p in out.glob("*.gguf")] == [gguf_file.name.replace("Q8_0", "F16")]


def test_ollama_export_never_writes_into_a_folder_gym_did_not_write(trained_run, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    for extra in ([], ["--overwrite"]):
        assert main(["export", "--output_dir", str(trained_run), "--format", "ollama", "--export_dir", str(mine),
                     *extra]) == 2
        assert str(mine) in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_the_tokenizers_own_template_is_matched_to_a_named_one(tiny_model_dir, tmp_path):
    out = tmp_path / "own"
    assert main(["export", "--model_name_or_path", str(tiny_model_dir), "--format", "ollama", "--export_dir",
                 str(out)]) == 0
    modelfile = (out / "Modelfile").read_text()
    assert "<|im_start|>system\n{{ .System }}<|im_end|>" in modelfile  # SmolLM's own template is ChatML
    assert 'SYSTEM """You are a helpful AI assistant named SmolLM, trained by Hugging Face"""' in modelfile


GO_RENDER = """package main

import (
	"encoding/json"
	"os"
	"text/template"
)

type Message struct {
	Role    string
	Content string
}

func main() {
	var input struct {
		Template string
		System   string
		Messages []Message
	}
	if err := json.NewDecoder(os.Stdin).Decode(&input); err != nil {
		panic(err)
	}
	t := template.Must(template.New("ollama").Parse(input.Template))
	if err := t.Execute(os.Stdout, input); err != nil {
		panic(err)
	}
}
"""


@pytest.mark.skipif(__import__("shutil").which("go") is None, reason="needs Go (apt-get install golang-go)")
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_go_text_template_itself_renders_the_trained_prompt(tokenizer, name, tmp_path):
    """Go's own text/template (what Ollama runs) renders the TEMPLATE as Gym renders the format."""
    import json
    import subprocess

    (tmp_path / "render.go").write_text(GO_RENDER)
    binary = tmp_path / "render"
    subprocess.run(["go", "build", "-o", str(binary), str(tmp_path / "render.go")], check=True, cwd=tmp_path,
                   env={**__import__("os").environ, "GOCACHE": str(tmp_path / "cache"), "GO111MODULE": "off"})
    chat = ChatFormat(tokenizer, TEMPLATES[name], None, False)
    go = go_chat_template(TEMPLATES[name], tokenizer.eos_token, tokenizer.bos_token, False)
    for messages, system in CONVERSATIONS:
        payload = {"Template": go, "System": system or TEMPLATES[name].default_system or "",
                   "Messages": [{"Role": "tool" if m["role"] == "observation" else m["role"], "Content": m["content"]}
                                for m in messages]}
        rendered = subprocess.run([str(binary)], input=json.dumps(payload), capture_output=True, text=True,
                                  check=True).stdout
        assert rendered == chat.render_prompt(messages, system), (name, messages)
