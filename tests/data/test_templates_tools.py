"""Tools through the templates: the training text equals what a tokenizer's chat template renders for the same
conversation with `tools=` (the exported Jinja for named templates, a Qwen 2.5-style template for the tokenizer
path), and the loss covers the answers, calls included, and none of the tool results."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gym.data.chat_jinja import jinja_chat_template
from gym.data.formats import Example
from gym.data.messages import messages_to_openai
from gym.data.processors import IGNORE_INDEX, encode_supervised
from gym.data.templates import TEMPLATES, ChatFormat, get_chat_format
from gym.data.tools import TOOL_FORMATS, ToolCall

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add numbers",
        "parameters": {"type": "object", "properties": {"values": {"type": "array", "items": {"type": "number"}}}}}},
]
PARIS = ToolCall("get_weather", '{"city": "Paris", "unit": "celsius"}', "call_1")
ROME = ToolCall("get_weather", '{"city": "Rome"}', "call_2")

SINGLE = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [PARIS]},
    {"role": "observation", "content": '{"temperature": 21}'},
    {"role": "assistant", "content": "It is 21 degrees in Paris."},
]
TEXT_THEN_CALL = [
    {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Weather in Rome?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [ROME]},
    {"role": "observation", "content": "25C"},
    {"role": "assistant", "content": "25C in Rome."},
]
PARALLEL = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [PARIS, ROME]},
    {"role": "observation", "content": "21C\n25C", "results": ["21C", "25C"], "tool_call_ids": ["call_1", "call_2"]},
    {"role": "assistant", "content": "Paris 21C, Rome 25C."},
]
CONVERSATIONS = {"single": SINGLE, "text_then_call": TEXT_THEN_CALL, "parallel": PARALLEL}
NAMED = ["qwen", "chatml", "qwen3", "llama3", "llama4", "mistral", "glm4", "default"]


def _hf(messages: list[dict[str, Any]], system: str | None, mapping_arguments: bool) -> list[dict[str, Any]]:
    """The conversation as a client gives it to transformers: OpenAI messages, arguments as a JSON string or as a
    mapping (transformers' own convention)."""
    hf = messages_to_openai(messages, system)
    if mapping_arguments:
        for m in hf:
            for call in m.get("tool_calls") or []:
                call["function"]["arguments"] = ToolCall("x", call["function"]["arguments"]).arguments_value
    return hf


def _training_text(chat: ChatFormat, messages, system, tools) -> str:
    return "".join(p + r for p, r in chat.render_pairs(messages, system, tools))


@pytest.mark.parametrize("name", NAMED)
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("system", [None, "Be brief."])
def test_named_template_training_text_equals_its_exported_jinja(tokenizer, name, conversation, system):
    messages = CONVERSATIONS[conversation]
    chat = get_chat_format(tokenizer, name)
    if conversation == "parallel" and not chat.tool_format.layout.parallel:
        pytest.skip(f"the {chat.tool_format.name} tool format has no parallel calls")
    jinja = jinja_chat_template(TEMPLATES[name], tokenizer.eos_token, None, True)
    text = _training_text(chat, messages, system, TOOLS)
    assert "get_weather" in chat.render_pairs(messages, system, TOOLS)[0][0]  # the tools are in the first prompt
    for mapping_arguments in (False, True):
        hf = _hf(messages, system, mapping_arguments)
        assert tokenizer.apply_chat_template(hf, tools=TOOLS, chat_template=jinja, tokenize=False) == text
        # serving: the prompt for the last answer, with the tools, is the training prefix
        prompt = tokenizer.apply_chat_template(hf[:-1], tools=TOOLS, chat_template=jinja, tokenize=False,
                                               add_generation_prompt=True)
        assert prompt == chat.render_prompt(messages[:-1], system, TOOLS)


@pytest.mark.parametrize("thinking", [True, False])
def test_thinking_template_with_tools_matches_its_jinja(tokenizer, thinking):
    chat = ChatFormat(tokenizer, TEMPLATES["qwen3"], None, thinking)
    jinja = jinja_chat_template(TEMPLATES["qwen3"], tokenizer.eos_token, None, thinking)
    for messages in CONVERSATIONS.values():
        hf = _hf(messages, "S", False)
        assert tokenizer.apply_chat_template(hf, tools=TOOLS, chat_template=jinja, tokenize=False) == \
            _training_text(chat, messages, "S", TOOLS)


def test_family_text_as_llama_factory_writes_it(tokenizer):
    """The pieces that differ per family, spelled out (LLaMA-Factory's template.py and tool_utils.py)."""
    pairs = get_chat_format(tokenizer, "qwen").render_pairs(PARALLEL, None, TOOLS)
    assert pairs[1][0] == ("<|im_start|>user\n<tool_response>\n21C\n</tool_response>\n<tool_response>\n25C\n"
                           "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert pairs[0][0].startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                                  "assistant.\n\n# Tools\n\n")
    pairs = get_chat_format(tokenizer, "llama3").render_pairs(SINGLE, "S", TOOLS)
    assert pairs[0][0].startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSCutting Knowledge")
    assert pairs[0][1] == '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}<|eot_id|>'
    assert pairs[1][0].startswith("<|start_header_id|>ipython<|end_header_id|>\n\n")
    pairs = get_chat_format(tokenizer, "mistral").render_pairs(SINGLE, "S", TOOLS)
    assert pairs[0][0].startswith("<s>[INST] S[AVAILABLE_TOOLS] [")  # system + tools fused into the first user turn
    assert pairs[0][0].endswith("[/AVAILABLE_TOOLS]\n\nWeather in Paris?[/INST]")
    assert pairs[0][1].startswith("[TOOL_CALLS] [{") and pairs[1][0] == '[TOOL_RESULTS] {"content": {"temperature": ' \
        '21}}[/TOOL_RESULTS]'
    pairs = get_chat_format(tokenizer, "glm4").render_pairs(SINGLE, None, TOOLS)
    assert pairs[0][0].startswith("[gMASK]<sop><|system|>\n") and pairs[0][0].endswith("<|user|>\nWeather in "
                                                                                       "Paris?<|assistant|>")
    assert pairs[0][1] == 'get_weather\n{"city": "Paris", "unit": "celsius"}'  # the function slot: no newline
    assert pairs[1] == ('<|observation|>\n{"temperature": 21}<|assistant|>', "\nIt is 21 degrees in Paris.")
    pairs = get_chat_format(tokenizer, "default").render_pairs(SINGLE, None, TOOLS)
    assert "Action: get_weather\nAction Input: {\"city\": \"Paris\", \"unit\": \"celsius\"}" in pairs[0][1]


# A Qwen 2.5-style chat template (written for this test): tools in the system turn, calls as <tool_call> JSON,
# consecutive tool messages as one user turn of <tool_response> blocks.
HERMES_TEMPLATE = (
    "{%- if messages[0].role == 'system' -%}{%- set system = messages[0].content -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system = 'You are a helpful assistant.' -%}{%- set rest = messages -%}{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call>' -}}"
    "{%- endif -%}{{- '<|im_end|>\\n' -}}"
    "{%- for message in rest -%}"
    "{%- if message.role == 'user' -%}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}{{- '<|im_start|>assistant' -}}"
    "{%- if message.content -%}{{- '\\n' + message.content -}}{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set arguments = call.function.arguments if call.function.arguments is string "
    "else (call.function.arguments | tojson) -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + arguments + "
    "'}\\n</tool_call>' -}}{%- endfor -%}{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or rest[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or rest[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def hermes_tokenizer(tokenizer):
    hermes = copy.deepcopy(tokenizer)
    hermes.chat_template = HERMES_TEMPLATE
    return hermes


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_tokenizer_template_with_tools_is_rendered_by_the_tokenizer(hermes_tokenizer, conversation):
    messages = CONVERSATIONS[conversation]
    chat = get_chat_format(hermes_tokenizer)
    assert chat.tool_support().native and chat.tool_format is TOOL_FORMATS["qwen"]  # detected by probing
    hf = _hf(messages, "Be brief.", True)
    text = _training_text(chat, messages, "Be brief.", TOOLS)
    assert text == hermes_tokenizer.apply_chat_template(hf, tools=TOOLS, tokenize=False)
    assert chat.render_prompt(messages[:-1], "Be brief.", TOOLS) == hermes_tokenizer.apply_chat_template(
        hf[:-1], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    # and it is what Gym's named qwen template (LLaMA-Factory's) trains
    assert text == _training_text(get_chat_format(hermes_tokenizer, "qwen"), messages, "Be brief.", TOOLS)


@pytest.mark.parametrize("tokenizer_kind", ["named", "hermes"])
def test_loss_covers_answers_and_calls_and_no_tool_result(tokenizer, hermes_tokenizer, tokenizer_kind):
    tok = hermes_tokenizer if tokenizer_kind == "hermes" else tokenizer
    chat = get_chat_format(tok, "qwen" if tokenizer_kind == "named" else None)
    example = Example("t", TEXT_THEN_CALL + PARALLEL, "S", TOOLS)
    enc = encode_supervised(example, chat, cutoff_len=4096)
    assert enc is not None
    learned = tok.decode([t for t, label in zip(enc["input_ids"], enc["labels"]) if label != IGNORE_INDEX])
    responses = "".join(r for _, r in chat.render_pairs(example.messages, "S", TOOLS))
    assert learned == responses
    assert learned.count("<tool_call>") == 3 and "Let me check." in learned and "Paris 21C, Rome 25C." in learned
    for prompt_text in ("\n25C\n", "\n21C\n", "<tool_response>", 'get_weather", "description', "Weather in Paris"):
        assert prompt_text not in learned
