"""The tokenizer read without transformers (gym.models.quick_tokenizer): what it computes itself equals what the
transformers tokenizer gives, on the embedded tokenizer and on a template that uses every Jinja feature transformers
gives templates; everything else goes to transformers; folders where the two could differ are not read this way."""

from __future__ import annotations

import copy
import json
import pickle
import random
import shutil
import subprocess
import sys

import jinja2
import pytest

from gym.models.loader import load_tokenizer
from gym.models.quick_tokenizer import QuickTokenizer, full_tokenizer, quick_tokenizer

TEXTS = ["", "Hello", "Hello <|im_start|>user\n wörld  \t 123 <|im_end|> ünïcode 🙂", "  leading and trailing  ",
         "<|im_start|>system\nYou are Gym.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>", "line\n\nbreaks\r\n", "ÿ" * 9,
         "<|endoftext|>x<|im_end|>", "def f(x):\n    return x ** 2  # squares"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye <|im_end|> ünï"}],
    [{"role": "user", "content": "Weather in Oslo?", "name": None}, {"role": "assistant", "content": "",
                                                                      "tool_calls": [CALL]},
     {"role": "tool", "content": "snow", "tool_call_id": "call_1"}, {"role": "assistant", "content": "Snow."}],
    [{"role": "user", "content": "Think."}, {"role": "assistant", "content": "Done.", "reasoning_content": "Hm."}],
]
# Every construct transformers' environment gives templates: loop controls, its tojson (indent, no HTML escaping),
# namespace, dict(), raise_exception, strftime_now, the {% generation %} block, special tokens and extra variables.
RICH_TEMPLATE = """{%- set ns = namespace(count=0) -%}
{%- for message in messages -%}
{%- if message.role == 'stop' %}{% break %}{% endif -%}
{%- set ns.count = ns.count + 1 -%}
<{{ message.role }}>{% if message.role == 'assistant' %}{% generation %}{{ message.content }}{% endgeneration %}
{%- else %}{{ message.content }}{% endif %}{{ eos_token }}
{% if message.tool_calls is defined %}{{ message.tool_calls | tojson(indent=2) }}{% endif -%}
{%- if message.content is not defined %}[no content]{% endif %}
{%- if message.reasoning_content is defined %}thought={{ message.thinking }}/{{ message.reasoning_content }}{% endif %}
    {% if ns.count > 1 %}
  (indented tags lose their indent)
    {% endif %}
{% endfor -%}
{%- if tools %}{{ tools | tojson }}{% endif -%}
{{ dict(a=1, b='<&>') | tojson }}{{ dict.fromkeys(['k'], 0) | tojson }} {{ ns.count }} {{ bos_token }}{{ pad_token }}
{%- if strftime_now('%Y') | length != 4 %}{{ raise_exception('no year') }}{% endif -%}
{%- if extra is defined %} extra={{ extra }}{% endif -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""


@pytest.fixture(scope="module")
def tokenizers(embedded_dir):
    """(quick, transformers) on the embedded tokenizer."""
    quick = quick_tokenizer(embedded_dir, lambda: load_tokenizer(str(embedded_dir)))
    assert isinstance(quick, QuickTokenizer)
    return quick, load_tokenizer(str(embedded_dir))


def _folder(tmp_path, embedded_dir, config_changes=None, template=None):
    folder = tmp_path / "tokenizer"
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(embedded_dir / name, folder / name)
    if config_changes is not None:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config.update(config_changes)
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


def test_encode_and_decode_equal_transformers(tokenizers):
    quick, full = tokenizers
    for text in TEXTS:
        for special in (True, False):
            assert quick.encode(text, add_special_tokens=special) == full.encode(text, add_special_tokens=special)
    rng = random.Random(0)
    specials = [quick.bos_token_id, quick.eos_token_id, quick.unk_token_id]
    sequences = [full.encode(text) for text in TEXTS] + [[], specials, [rng.randrange(len(full)) for _ in range(200)]]
    sequences += [[rng.choice(specials + [rng.randrange(len(full))]) for _ in range(40)] for _ in range(20)]
    for ids in sequences:
        for skip in (True, False):
            assert quick.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
    assert quick.decode(quick.eos_token_id) == full.decode(full.eos_token_id)
    assert len(quick) == len(full) and quick.model_max_length == full.model_max_length


def test_special_tokens_and_template_equal_transformers(tokenizers):
    quick, full = tokenizers
    for name in ("bos_token", "eos_token", "unk_token", "pad_token", "bos_token_id", "eos_token_id", "unk_token_id",
                 "pad_token_id", "chat_template", "special_tokens_map"):
        assert getattr(quick, name) == getattr(full, name), name


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_the_chat_template_renders_as_transformers_renders_it(tokenizers, index):
    quick, full = tokenizers
    conversation = copy.deepcopy(CONVERSATIONS[index])
    for tools in (None, TOOLS):
        for prompt in (True, False):
            kwargs = {"tools": tools, "tokenize": False, "add_generation_prompt": prompt, "enable_thinking": False}
            assert quick.apply_chat_template(conversation, **kwargs) == full.apply_chat_template(conversation, **kwargs)
    assert conversation == CONVERSATIONS[index]  # the caller's messages are not edited


def test_every_jinja_feature_transformers_gives_templates_renders_the_same(tmp_path, embedded_dir):
    folder = _folder(tmp_path, embedded_dir, template=RICH_TEMPLATE)
    quick = quick_tokenizer(folder, lambda: pytest.fail("rendering needs no transformers"))
    full = load_tokenizer(str(folder))
    conversation = [*CONVERSATIONS[2], {"role": "assistant", "content": None, "tool_calls": [CALL]},
                    {"role": "assistant", "content": "Done.", "reasoning": "Hm."},
                    {"role": "stop", "content": "never shown"}, {"role": "user", "content": "x"}]
    for kwargs in ({"add_generation_prompt": True}, {"tools": TOOLS, "extra": [1, "two"]}, {}):
        ours = quick.apply_chat_template(conversation, tokenize=False, **kwargs)
        assert ours == full.apply_chat_template(conversation, tokenize=False, **kwargs)
    assert '"<&>"' in ours and "[no content]" in ours and "never shown" not in ours and "thought=Hm./Hm." in ours
    failing = _folder(tmp_path / "raises", embedded_dir,
                      template="{{ raise_exception('no ' ~ messages[0].role) }}")
    quick = quick_tokenizer(failing, lambda: pytest.fail("rendering needs no transformers"))
    with pytest.raises(jinja2.exceptions.TemplateError, match="no user"):
        quick.apply_chat_template(CONVERSATIONS[0], tokenize=False)
    escaping = _folder(tmp_path / "escapes", embedded_dir,
                       template="{% set ns = namespace() %}{% set ns._secret = 1 %}{{ ns._secret }}")
    quick = quick_tokenizer(escaping, lambda: pytest.fail("rendering needs no transformers"))
    with pytest.raises(jinja2.exceptions.SecurityError):
        quick.apply_chat_template(CONVERSATIONS[0], tokenize=False)


def test_anything_else_is_left_to_the_transformers_tokenizer(tmp_path, embedded_dir):
    folder = _folder(tmp_path, embedded_dir)
    loads = []

    def load():
        loads.append(1)
        return load_tokenizer(str(folder))

    quick = quick_tokenizer(folder, load)
    assert quick is not None and bool(quick)
    quick.encode("Hi")
    quick.decode([1, 2, 3], skip_special_tokens=True)
    quick.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True)
    assert loads == []  # the four need no transformers
    full = load_tokenizer(str(folder))
    assert quick.convert_ids_to_tokens([1, 2]) == full.convert_ids_to_tokens([1, 2]) and loads == [1]
    assert quick("Hi")["input_ids"] == full("Hi")["input_ids"]
    assert quick.encode("Hi", return_tensors="pt").tolist() == full.encode("Hi", return_tensors="pt").tolist()
    tokenized = quick.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True)
    assert tokenized == full.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True)
    assert full_tokenizer(quick) is quick.full and full_tokenizer(full) is full and loads == [1]
    copied = pickle.loads(pickle.dumps(quick))  # a worker process gets transformers' tokenizer
    assert type(copied) is type(full) and copied.encode(TEXTS[2]) == quick.encode(TEXTS[2])
    assert type(copy.deepcopy(quick)) is type(full)
    quick.pad_token = "<|endoftext|>"  # from a change on, transformers' tokenizer answers everything
    assert quick.full.pad_token == "<|endoftext|>" and quick.special_tokens_map["pad_token"] == "<|endoftext|>"
    assert quick.pad_token_id == quick.full.pad_token_id != full.pad_token_id
    quick.chat_template = "[{{ messages[0].content }}]"
    assert quick.chat_template == "[{{ messages[0].content }}]"
    assert quick.apply_chat_template(CONVERSATIONS[0], tokenize=False) == "[Hi]"


@pytest.mark.parametrize("changes, why", [
    ({"add_bos_token": True}, "a setting that changes what is encoded"),
    ({"tokenizer_class": "LlamaTokenizerFast"}, "a class with its own encoding rules"),
    ({"clean_up_tokenization_spaces": True}, "decoded text cleaned up after the Rust tokenizer"),
    ({"chat_template": [{"name": "default", "template": "{{ messages }}"}]}, "named templates"),
    ({"eos_token": "<|not a token|>"}, "a special token the vocabulary lacks"),
    ({"added_tokens_decoder": {"3": {"content": "<repo_name>", "special": False}}}, "an added token's flag changed"),
    ({"added_tokens_decoder": {"49152": {"content": "<new>", "special": True}}}, "a token only the config adds"),
])
def test_folders_where_it_could_differ_go_to_transformers(tmp_path, embedded_dir, changes, why):
    assert quick_tokenizer(_folder(tmp_path, embedded_dir, changes), load_tokenizer) is None, why


def test_no_tokenizer_json_or_switched_off_goes_to_transformers(tmp_path, embedded_dir, monkeypatch):
    same = {"2": {"content": "<|im_end|>", "special": True, "lstrip": False, "rstrip": False, "normalized": False}}
    folder = _folder(tmp_path, embedded_dir, {"added_tokens_decoder": same})
    assert quick_tokenizer(folder, load_tokenizer) is not None  # the config saying what tokenizer.json says
    monkeypatch.setenv("GYM_QUICK_TOKENIZER", "0")
    assert quick_tokenizer(folder, load_tokenizer) is None
    monkeypatch.delenv("GYM_QUICK_TOKENIZER")
    (folder / "tokenizer.json").unlink()
    assert quick_tokenizer(folder, load_tokenizer) is None


@pytest.mark.slow
def test_a_chat_on_the_fast_engine_imports_no_transformers_at_all(embedded_dir):
    """Issue #43's warm start: the embedded model answers on the fast engine without transformers imported, as it
    answers with transformers' tokenizer; a model transformers loads gets transformers' tokenizer."""
    script = f"""
import os, sys
from gym.infer.chat import ChatModel
config = {{"model_name_or_path": {str(embedded_dir)!r}, "do_sample": False, "max_new_tokens": 6}}
quick = ChatModel(config)
answer = quick.chat([{{"role": "user", "content": "Say hi."}}])
print(type(quick.tokenizer).__name__, "transformers" in sys.modules)
os.environ["GYM_QUICK_TOKENIZER"] = "0"
full = ChatModel(config)
again = full.chat([{{"role": "user", "content": "Say hi."}}])
print(type(full.tokenizer).__name__ != "QuickTokenizer", again == answer)
os.environ["GYM_QUICK_TOKENIZER"] = "1"
os.environ["GYM_DIRECT_LOAD"] = "0"
print(type(ChatModel(config).tokenizer).__name__ != "QuickTokenizer")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:3] == ["QuickTokenizer False", "True True", "True"]
