"""How a request that does not validate is answered (gym.serve.protocol.invalid_request), without a server: the
field named as the client wrote it, and an unknown field matched against the fields beside it, however deep."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from gym.serve.protocol import invalid_request


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str
    detail: str | None = None


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    parts: list[Part] | None = None
    limit: int = 1


def problems(body: dict) -> list:
    """The errors FastAPI hands its handler: pydantic's, located under `body`."""
    try:
        Body.model_validate(body)
    except ValidationError as exc:
        return [{**p, "loc": ("body", *p["loc"])} for p in exc.errors()]
    raise AssertionError("the body validated")


def test_an_unknown_field_is_named_with_the_closest_beside_it():
    error = invalid_request(problems({"model": "m", "limt": 3}), Body)
    assert (error.status, error.param) == (400, "limt")
    assert error.message == "Unrecognized request argument supplied: limt. Did you mean 'limit'?"
    nested = invalid_request(problems({"model": "m", "parts": [{"text": "a"}, {"text": "b", "detial": "x"}]}), Body)
    assert nested.param == "parts.1.detial"
    assert nested.message.endswith("parts.1.detial. Did you mean 'detail'?")
    # an unknown field is reported before the other problems of the same body
    both = invalid_request(problems({"limit": "x", "zzz": 1}), Body)
    assert both.param == "zzz" and both.message == "Unrecognized request argument supplied: zzz."


def test_a_wrong_value_or_query_names_its_field_and_is_a_400():
    error = invalid_request(problems({"model": "m", "limit": "many"}), Body)
    assert (error.status, error.param, error.type) == (400, "limit", "invalid_request_error")
    assert error.message.startswith("limit: Input should be a valid integer")
    query = invalid_request([{"type": "int_parsing", "loc": ("query", "limit"), "msg": "Input should be a valid "
                              "integer, unable to parse string as an integer", "input": "abc"}])
    assert (query.status, query.param) == (400, "limit") and query.message.startswith("limit: ")
    assert invalid_request([{"type": "json_invalid", "loc": ("body", 1), "msg": "JSON decode error"}]).message == \
        "The request body is not valid JSON."


def test_a_body_that_is_not_an_object_is_named_as_the_body():
    """No field is at fault, so none is named: the message began with ": Input should be a valid dictionary"."""
    array = invalid_request([{"type": "model_attributes_type", "loc": ("body",), "msg": "Input should be a valid "
                              "dictionary or object to extract fields from", "input": [1]}], Body,
                            "application/json")
    assert (array.status, array.param) == (400, None)
    assert array.message == "The request body must be a JSON object."
    empty = invalid_request([{"type": "missing", "loc": ("body",), "msg": "Field required"}], Body, None)
    assert empty.message == ("The request body is missing; send a JSON object. It was sent without a Content-Type: "
                             "set the header Content-Type: application/json.")


def test_a_message_without_content_is_refused_unless_an_assistant_calls_tools():
    """A user message with no content was read as an empty one, and the model answered a prompt never written."""
    import pytest

    from gym.serve.protocol import ApiError, Message, conversation

    for role in ("user", "system", "tool"):
        with pytest.raises(ApiError, match=f"messages.0: a {role} message needs content") as refused:
            conversation([Message(role=role), Message(role="user", content="Hi")])
        assert (refused.value.status, refused.value.param) == (400, "messages.0.content")
    with pytest.raises(ApiError, match="messages.1: an assistant message needs content or tool_calls"):
        conversation([Message(role="user", content="Hi"), Message(role="assistant"), Message(role="user", content="?")])
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    turns, _ = conversation([Message(role="user", content="Hi"), Message(role="assistant", tool_calls=[call]),
                             Message(role="tool", tool_call_id="call_1", content="42")])
    assert turns
