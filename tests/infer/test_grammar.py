"""Constrained decoding (gym.infer.grammar) through the fast and the transformers engines on the embedded
(untrained for the task) SmolLM2: answers match their schema or grammar on every seed, a constrained row
changes nothing for its neighbours in the batch, and bad schemas are one-line ConfigErrors."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from gym.core.errors import ConfigError
from gym.infer import grammar
from gym.infer.fast.engine import FastEngine
from gym.infer.hf_engine import HFEngine
from gym.infer.requests import Request, SamplingParams, admit

# Each kind the issue names: a required string, an integer with a minimum, an enum, an array. Strings and the
# array are bounded so an untrained model sampling at temperature 1 finishes within max_new_tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
PROMPT = "Here is a person, described as JSON:"


@pytest.fixture(scope="module")
def model(embedded_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["fast", "hf"])
def engine(request, model, tokenizer):
    make = FastEngine if request.param == "fast" else HFEngine
    engine = make(model, tokenizer, [tokenizer.eos_token_id], max_batch_size=10, max_waiting=16)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def fast(model, tokenizer):
    engine = FastEngine(model, tokenizer, [tokenizer.eos_token_id], max_batch_size=10, max_waiting=16)
    yield engine
    engine.shutdown()


def sampled(seed: int, constraint: grammar.Constraint | None, max_new_tokens: int = 80) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                          seed=seed, constraint=constraint)


def answers(engine, tokenizer, params: list[SamplingParams], prompt: str = PROMPT):
    """Every request submitted at once (so they share batches), then each one's Finished event."""
    ids = tokenizer.encode(prompt)
    requests = [engine.submit(ids, p) for p in params]
    return [list(r.events(timeout=300))[-1] for r in requests]


def test_json_schema_answers_validate_on_every_seed(engine, tokenizer):
    constraint = grammar.json_schema(SCHEMA)
    done = answers(engine, tokenizer, [sampled(seed, constraint) for seed in range(10)])
    for finished in done:
        assert finished.reason == "stop", finished
        jsonschema.validate(json.loads(finished.text), SCHEMA)
    assert len({f.text for f in done}) > 1  # sampled, not one forced answer


def test_json_object_answers_parse(fast, tokenizer):
    """Any object: nothing bounds it, so the prompt shows one (unprompted, this model may fill a string with
    digits past any limit, which is the model's doing, not the grammar's)."""
    prompt = 'A user record in JSON: {"id": 7, "name": "Ann"}\nAnother user record in JSON:'
    params = [SamplingParams(max_new_tokens=64, do_sample=False, constraint=grammar.json_object())]
    params += [sampled(seed, grammar.json_object(), 64) for seed in range(3)]
    for finished in answers(fast, tokenizer, params, prompt=prompt):
        assert finished.reason == "stop", finished
        assert isinstance(json.loads(finished.text), dict)


def test_lark_prefix_schema_suffix_gives_exactly_that_shape(fast, tokenizer):
    """Tool calls' shape: literal text, JSON for one of two functions' arguments, literal text, one or two
    calls with a newline between them."""
    weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"],
               "additionalProperties": False}
    clock = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}
    choices = [grammar.Tagged(f'<tool_call>\n{{"name": "{name}", "arguments": ', schema, "}\n</tool_call>")
               for name, schema in (("weather", weather), ("clock", clock))]
    calls = grammar.tagged_json(choices, max_count=2, separator="\n")
    done = answers(fast, tokenizer, [sampled(seed, calls, 96) for seed in range(4)], prompt="Calling a tool:\n")
    shape = re.compile(r"<tool_call>\n(\{.*?\})\n</tool_call>")
    for finished in done:
        assert finished.reason == "stop", finished
        found = shape.findall(finished.text)
        assert 1 <= len(found) <= 2 and "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in found) == finished.text
        for call in map(json.loads, found):
            assert set(call) == {"name", "arguments"}
            jsonschema.validate(call["arguments"], weather if call["name"] == "weather" else clock)


def test_a_constrained_row_leaves_its_neighbours_tokens_unchanged(fast, tokenizer):
    ids = tokenizer.encode(PROMPT)
    alone = [fast.generate(ids, sampled(seed, None, 12)) for seed in (1, 2)]
    constrained = fast.submit(ids, sampled(0, grammar.json_schema(SCHEMA), 40))
    together = [fast.submit(ids, sampled(seed, None, 12)) for seed in (1, 2)]
    for solo, request in zip(alone, together):
        assert list(request.events(timeout=300))[-1].text == solo.text
    assert list(constrained.events(timeout=300))[-1].reason == "stop"


def test_grammar_end_stops_the_request_and_the_length_limit_comes_first_when_shorter(model, tokenizer):
    """With no end-of-turn token at all, a finished grammar still ends the answer ("stop"); a limit reached
    before the grammar is finished is "length", as for any request."""
    engine = FastEngine(model, tokenizer, [], max_batch_size=4)
    try:
        ids = tokenizer.encode("Is the sky blue? Answer:")
        done = engine.generate(ids, SamplingParams(max_new_tokens=8, do_sample=False,
                                                   constraint=grammar.lark('start: " yes" | " no"')))
        assert done.reason == "stop" and done.text in (" yes", " no")
        short = engine.generate(ids, SamplingParams(max_new_tokens=3, do_sample=False,
                                                    constraint=grammar.json_schema(SCHEMA)))
        assert short.reason == "length" and short.completion_tokens == 3 and short.text.startswith('{"name"')
    finally:
        engine.shutdown()


def test_the_end_of_turn_token_is_allowed_only_where_the_grammar_accepts(tokenizer):
    eos = tokenizer.eos_token_id
    matcher = grammar.Matcher(grammar.lark(r'start: "1" /[0-9]*/'), tokenizer, [eos])
    logits = torch.zeros(len(tokenizer))
    matcher.mask(logits)
    assert logits[eos] == float("-inf") and not matcher.allows(eos)  # nothing written yet: "1" must come
    matcher.advance(tokenizer.convert_tokens_to_ids("1"))
    logits = torch.zeros(len(tokenizer) + 7)  # a model's padded vocabulary: the extra logits are no tokens
    matcher.mask(logits)
    assert logits[eos] == 0 and matcher.allows(eos) and matcher.accepting
    assert (logits[len(tokenizer):] == float("-inf")).all()


@pytest.mark.parametrize(("make", "words"), [
    (lambda: grammar.json_schema({"type": "strnig"}), "Invalid JSON schema: Invalid type: strnig"),
    (lambda: grammar.json_schema({"type": "integer", "minimum": "ten"}), "minimum"),
    (lambda: grammar.json_schema({"type": "object", "unevaluatedProperties": False}), "unevaluatedProperties"),
    (lambda: grammar.json_schema({"type": "string", "pattern": "(("}), "regex"),
    (lambda: grammar.json_schema({"$ref": "#/$defs/missing"}), "missing"),
    (lambda: grammar.json_schema(["not", "an", "object"]), "must be an object"),
    (lambda: grammar.json_schema({"type": "object", "properties": {"a": {"type": "string"}}, "requried": ["a"]}),
     "'requried' is not a JSON Schema keyword"),
    (lambda: grammar.json_schema({"type": "array", "items": {"type": "string", "maxlength": 3}}),
     "'items.maxlength' is not a JSON Schema keyword (one it does not know is ignored, so it would constrain "
     "nothing). Did you mean 'maxLength'?"),
    (lambda: grammar.json_schema({"anyOf": [{"type": "object", "propertes": {}}]}), "Did you mean 'properties'?"),
    (lambda: grammar.lark("start: undefined_rule"), "undefined_rule"),
    (lambda: grammar.lark(""), "start"),
])
def test_bad_schemas_and_grammars_are_one_line_config_errors(make, words):
    with pytest.raises(ConfigError) as caught:
        make()
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_misspelt_keyword_is_refused_but_names_and_annotations_are_not():
    """A property may be called anything, and keys far from every keyword (OpenAPI's, `x-` extensions) are kept."""
    schema = {"type": "object", "properties": {"requried": {"type": "string", "example": "x", "nullable": True}},
              "required": ["requried"], "x-origin": "openapi", "summary": "a key near no keyword"}
    assert grammar.json_schema(schema).kind is grammar.ConstraintKind.JSON_SCHEMA


# Valid JSON Schema that no finite JSON matches: llguidance compiles it, then gives up at its item limit as soon as
# the text it must force (`{"next": {"next": ...`) has no end.
ENDLESS = {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}},
                              "required": ["next"]}}, "$ref": "#/$defs/node"}


def test_an_answer_the_grammar_gives_up_on_ends_as_an_error_not_a_stop(engine, tokenizer):
    """Not "stop", which says the answer matches its schema: it is `{"`, no JSON at all."""
    [done] = answers(engine, tokenizer, [sampled(0, grammar.json_schema(ENDLESS), 20)])
    assert done.reason == "error" and "Too many items" in done.error, done
    with pytest.raises(grammar.GrammarStopped, match="could not go on .*Too many items.*make the recursion optional"):
        raise grammar.GrammarStopped(done.error, done.completion_tokens)


def test_a_special_token_the_tokenizer_lacks_is_a_config_error_at_submit(fast, tokenizer):
    constraint = grammar.lark('start: "x" <|no_such_token|>')  # only the tokenizer can tell
    with pytest.raises(ConfigError, match="no_such_token"):
        fast.submit(tokenizer.encode("Hi"), SamplingParams(constraint=constraint))


def test_an_engine_that_cannot_constrain_refuses_rather_than_ignores():
    """vLLM's submit admits without a matcher: a constrained request must not come back unconstrained."""
    with pytest.raises(ConfigError, match="fast, transformers"):
        admit([1, 2], SamplingParams(constraint=grammar.json_object()), None, running=True, queued=0, limit=4,
              queued_as="in flight")
    assert isinstance(admit([1, 2], SamplingParams(), None, running=True, queued=0, limit=4, queued_as="x"), Request)


@pytest.mark.parametrize("text", ['say "hi"\\n', "line\nnext\ttab\r", "\x01 control", "é 😀 ü", ""])
def test_lark_literal_matches_exactly_its_text(tokenizer, text):
    matcher = grammar.Matcher(grammar.lark("start: " + grammar.lark_literal(text)), tokenizer, [])
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert not matcher.error and not matcher._matcher.is_stopped()
        matcher.advance(token)
    assert matcher.accepting and not matcher.error


def test_lark_literal_writes_special_tokens_as_tokens(tokenizer):
    expression = grammar.lark_literal("a<|im_start|>b", special_tokens=["<|im_start|>"])
    assert expression == '("a" <|im_start|> "b")'
    matcher = grammar.Matcher(grammar.lark("start: " + expression), tokenizer, [])
    for token in tokenizer.encode("a", add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_start|>")]:
        assert not matcher.advance(token)
    assert not matcher.error


@pytest.mark.parametrize(("low", "high", "allowed"), [(1, 1, {1}), (0, 1, {0, 1}), (1, 3, {1, 2, 3}),
                                                      (2, None, {2, 3, 4}), (0, None, {0, 1, 2, 3, 4})])
def test_tagged_json_repeats_between_its_counts(tokenizer, low, high, allowed):
    constraint = grammar.tagged_json([grammar.Tagged("[", {"type": "integer"}, "]")], min_count=low, max_count=high,
                                     separator=",")
    for count in range(5):
        matcher = grammar.Matcher(constraint, tokenizer, [])
        for token in tokenizer.encode(",".join(["[7]"] * count), add_special_tokens=False):
            matcher.advance(token)
        assert (matcher.accepting and not matcher.error) == (count in allowed), count


def test_sample_rows_never_picks_a_disallowed_token_even_for_a_zero_draw(tokenizer, monkeypatch):
    """Inverse-CDF sampling with a draw of exactly 0 lands on token 0 whatever its probability."""
    from gym.infer import sampling

    request = Request([1], SamplingParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, seed=0))
    request.matcher = grammar.Matcher(grammar.lark('start: "{"'), tokenizer, [])
    monkeypatch.setattr(sampling.torch, "rand", lambda *a, **k: torch.zeros(1))
    token = sampling.sample_rows([request], torch.zeros(1, len(tokenizer)))[0]
    assert tokenizer.decode([token]) == "{"
