"""`gym export --format ollama`: the GGUF (gym.export.gguf) plus a Modelfile, so `ollama create NAME -f Modelfile`
serves the model in the chat format it was trained with.

The Modelfile's TEMPLATE is Go text/template, written from Gym's template (a named one, or the named template
that renders exactly what the tokenizer's own template renders: gym.data.templates.named_equivalent):
`.System` in the system turn (or before the first user message, for formats without one), then each of
`.Messages` in its user / tool / assistant turn. The user turn ends with the assistant header, so a prompt
ending with a user message asks for the answer. SYSTEM holds the default system prompt; PARAMETER stop the
end-of-turn tokens; the other PARAMETERs the decoding settings training saved.
A BOS the prefix would write is left to llama.cpp, which adds it per the GGUF's add_bos_token; so is the one a
format with neither prefix nor system turn opens every user turn with (Llama 2's `<s>[INST]`): the first user
turn goes without it, later ones keep it, as Ollama's own Llama 2 template writes them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError
from gym.core.files import building_folder, refuse_overwrite, write_manifest
from gym.data.templates import EMPTY_THOUGHT, Template, _fill, named_equivalent
from gym.export.config import ExportArguments
from gym.export.gguf import write_model_gguf
from gym.export.spelling import option

MODELFILE = "Modelfile"
_PARAMETERS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
               "repetition_penalty": "repeat_penalty", "max_new_tokens": "num_predict"}


def _turn(fmt: str, eos: str, content: str) -> str:
    before, _, after = _fill(fmt, "\0", eos).partition("\0")
    return before + content + after


def go_chat_template(template: Template, eos: str, bos: str | None = None, enable_thinking: bool = True) -> str:
    """The template as Go text/template over Ollama's .System and .Messages (no whitespace trimming: every
    character outside the actions is the format's own)."""
    t = template
    content = "{{ $m.Content }}"
    first_user = content
    if not t.system:  # formats without a system turn put the system text before the first user message
        first_user = ("{{ if and (eq $i 0) $.System }}" + _turn(t.system_in_user, eos, "{{ $.System }}") + "{{ end }}"
                      + content)
    user = _turn(t.user, eos, first_user)
    if bos and not t.prefix and not t.system and user.startswith(bos):
        # The first user turn opens the prompt, where llama.cpp puts its own BOS: a second one would follow it.
        user = "{{ if eq $i 0 }}" + user[len(bos):] + "{{ else }}" + user + "{{ end }}"
    if t.thinking and not enable_thinking:
        user += EMPTY_THOUGHT
    parts = [t.prefix if t.prefix and t.prefix != bos else ""]
    if t.system:
        parts.append("{{ if .System }}" + _turn(t.system, eos, "{{ .System }}") + "{{ end }}")
    parts.append('{{ range $i, $m := .Messages }}{{ if eq $m.Role "user" }}' + user)
    tool = _turn(t.observation or t.user, eos, content)  # formats without a tool turn render it as a user turn
    if t.thinking and not enable_thinking:
        tool += EMPTY_THOUGHT
    parts.append('{{ else if eq $m.Role "tool" }}' + tool)
    parts.append('{{ else if eq $m.Role "assistant" }}' + _turn(t.assistant, eos, content) + "{{ end }}{{ end }}")
    return "".join(parts)


def _quoted(text: str) -> str:
    if '"""' in text:
        raise ConfigError(f'The chat format contains """, which a Modelfile cannot quote; export with '
                          f'{option("export_format", "gguf")}.')
    return f'"""{text}"""'


def modelfile(gguf_name: str, chat: Any, decoding: dict[str, Any]) -> str:
    tokenizer = chat.tokenizer
    if chat.template is not None:
        template, default_system = chat.template, chat.default_system or chat.template.default_system
    else:
        found = named_equivalent(tokenizer)
        if found is None:
            raise ConfigError("This tokenizer's chat template matches none of Gym's named templates, so it cannot be "
                              "written as an Ollama TEMPLATE: train or export with `template:` set, or use "
                              f"{option('export_format', 'gguf')} (Ollama then reads the GGUF's own chat template).")
        template, default_system = found
        default_system = chat.default_system or default_system
    go = go_chat_template(template, tokenizer.eos_token or "", tokenizer.bos_token, chat.enable_thinking)
    lines = [f"FROM ./{gguf_name}", f"TEMPLATE {_quoted(go)}"]
    if default_system:
        lines.append(f"SYSTEM {_quoted(default_system)}")
    for stop in sorted({tokenizer.convert_ids_to_tokens(i) for i in chat.stop_token_ids()}):
        lines.append(f'PARAMETER stop "{stop}"')
    if decoding.get("do_sample") is False:
        lines.append("PARAMETER temperature 0")
    for key, name in _PARAMETERS.items():
        if key in decoding and not (key == "temperature" and decoding.get("do_sample") is False):
            lines.append(f"PARAMETER {name} {decoding[key]}")
    return "\n".join(lines) + "\n"


def export_ollama(args: ExportArguments, config: dict[str, Any]) -> Path:
    """The GGUF and its Modelfile, built in a temporary folder and renamed into place as one folder with its
    manifest, as every folder Gym writes: a folder Gym did not write is never written into, and an --overwrite
    replaces the whole folder (no GGUF of another --type is left beside the new one)."""
    assert args.export_dir is not None
    folder = Path(args.export_dir)
    if folder.suffix == ".gguf":
        raise ConfigError(f"{option('export_format', 'ollama')} writes a folder (the GGUF and its Modelfile): give "
                          f"{option('export_dir')} a folder.")
    how = option("export_overwrite", True)
    refuse_overwrite(folder, args.export_overwrite, how, folder=True)  # before the model loads
    with building_folder(folder, args.export_overwrite, how) as tmp:
        path, chat, decoding = write_model_gguf(replace(args, export_dir=str(tmp), export_overwrite=False), config)
        (tmp / MODELFILE).write_text(modelfile(path.name, chat, decoding), encoding="utf-8")
        write_manifest(tmp, {"what": "ollama", "made_by": "gym export", "format": "ollama", "gguf": path.name,
                             "type": args.export_type, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return folder / MODELFILE
