"""The OpenAI request bodies Gym accepts, as pydantic models, and the error shape it answers with.

Fields that do not change an answer (`user`, `metadata`, `store`, ...) are accepted. Features Gym does not have
(logprobs, logit_bias, penalties other than 0, the legacy `functions`) are refused with a 400 naming the parameter
rather than silently dropped: a client that asked for them would otherwise get an answer it did not ask for. Any
other field is refused as OpenAI refuses it ("Unrecognized request argument supplied"), with the closest field a
request has: a misspelt `max_token` would otherwise leave the length at its default without a word. A request that
does not validate at all (a wrong type, a missing field, `limit=abc` in a query, an unknown field of a strict body
such as a fine-tuning job's) is OpenAI's 400 too, naming the field (`invalid_request`), never FastAPI's 422.

Tools (`tools`, `tool_choice`, `parallel_tool_calls`) and structured outputs (`response_format`) are passed to
the ChatModel as OpenAI wrote them (gym.infer.tool_choice reads them and names the field it cannot use); the
messages, tool calls and tool results included, are read by gym.data.messages, as training reads a dataset.

A user message's content may hold `image_url` parts (for a vision-language model): each becomes an `<image>`
placeholder where it stands in the text, and its URL is fetched by gym.serve.media under the server's rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gym.core.errors import DataError
from gym.core.names import did_you_mean
from gym.data.messages import Message as InternalMessage
from gym.data.messages import messages_from_openai

# A seed is a signed 64-bit integer (what torch's and vLLM's generators take); choice i of n uses seed + i.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


def valid_text(value: Any) -> Any:
    """Text must be encodable: JSON can carry lone surrogates (\ud800) that no tokenizer can take, and that no
    answer can echo (an error naming the model a request asked for is encoded as UTF-8 too). Every string field
    of every request goes through here, in lists and objects as well."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("contains an invalid Unicode code point (a lone surrogate)") from None
    elif isinstance(value, (list, tuple)):
        for item in value:
            valid_text(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            valid_text(key)
            valid_text(item)
    return value


class ApiError(Exception):
    """An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def unrecognized(name: str, known: Iterable[str]) -> ApiError:
    """OpenAI's refusal of a field a request does not have (`name`, dotted when nested: `method.typ`), with the
    closest of the `known` fields beside it: a misspelt field would otherwise leave its setting at the default."""
    hint = did_you_mean(name.rsplit(".", 1)[-1], known)
    return ApiError(400, f"Unrecognized request argument supplied: {name}.{hint}", param=name)


def invalid_request(problems: Sequence[Any], body: Any = None, content_type: str | None = None) -> ApiError:
    """A request FastAPI could not validate (its RequestValidationError's `errors()`: the body, the query, the
    path), as OpenAI answers one: a 400 naming the field at fault, an unknown field before any other. `body`: the
    route's body model, whose fields an unknown one is matched against; `content_type`: the request's header."""
    if any(p.get("type") == "json_invalid" for p in problems):
        return ApiError(400, "The request body is not valid JSON.")
    if not problems:
        return ApiError(400, "The request is not valid.")
    whole = next((p for p in problems if tuple(p.get("loc", ())) == ("body",)), None)
    if whole is not None:
        # The body as a whole, not a field of it: none, a JSON array or null, or a body that was never read as JSON
        # (`curl -d` sends form data): no field to name (pydantic's own words came after an empty one), so say what
        # the body must be.
        kind = (content_type or "").split(";")[0].strip().lower()
        sent = "" if kind == "application/json" else \
            f" It was sent as {kind!r}, not read as JSON: set the header Content-Type: application/json." if kind \
            else " It was sent without a Content-Type: set the header Content-Type: application/json."
        if whole.get("type") == "missing":
            return ApiError(400, f"The request body is missing; send a JSON object.{sent}")
        return ApiError(400, f"The request body must be a JSON object.{sent}")
    unknown = next((p for p in problems if p.get("type") == "extra_forbidden"), None)
    if unknown is not None:
        return unrecognized(_where(unknown), _fields_at(body, list(unknown.get("loc", ()))[1:-1]))
    # Of a union's members (content as text, or as a list of parts), the one that got deepest into the value is
    # the one the client meant: its field is named, not the shallow "should be a valid string" of the others.
    deepest = max(problems, key=lambda p: len(p.get("loc", ())))
    message = "; ".join(f"{_where(p)}: {p.get('msg')}" for p in problems)
    return ApiError(400, message, param=_where(deepest) or None)


def _where(problem: Any) -> str:
    """A validation error's location as the client wrote it: `messages.0.content.0.text`, `limit` (without
    pydantic's `body` or `query` prefix and the union member it tried, such as `list[...]` or a content part's
    model, `TextPart`: field names are lower case, models CamelCase)."""
    loc = list(problem.get("loc", ()))
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    parts = [str(part) for part in loc]
    return ".".join(part for part in parts if "[" not in part and part not in ("str", "int", "float", "bool")
                    and not part[:1].isupper())


def _fields_at(annotation: Any, path: Sequence[Any]) -> list[str]:
    """The fields of the model found at `path` inside the body model `annotation` (through lists, optionals and
    unions): what a misspelt field there may have meant. None found: no fields."""
    for part in path:
        models = _models_in(annotation)
        member = next((m for m in models if m.__name__ == part), None)  # the union member pydantic tried
        owner = next((m for m in models if part in m.model_fields), None)
        if member is not None:
            annotation = member
        elif owner is not None:
            annotation = owner.model_fields[part].annotation
    models = _models_in(annotation)
    return list(models[0].model_fields) if models else []


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


# OpenAI request fields that leave the answer as it is: bookkeeping, caching, routing.
NO_EFFECT_FIELDS = ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key")
# OpenAI's (and vLLM's) fields that would change the answer, which this server does not implement.
UNSUPPORTED_FIELDS = ("logit_bias", "prediction", "audio", "modalities", "web_search_options", "reasoning_effort",
                      "verbosity", "min_p", "min_tokens", "ignore_eos", "stop_token_ids", "use_beam_search",
                      "length_penalty", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


class StreamOptions(BaseModel):
    """OpenAI's `stream_options`. A misspelt `include_usag` would otherwise stream without the usage chunk, and the
    string "false" (truthy as it stood) with it: the keys are read as the body's are."""
    model_config = ConfigDict(extra="allow")  # kept to be named, as the body's own unknown fields are

    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI's padding of chunks against length side channels: none here

    @model_validator(mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return valid_text(value)  # the keys too: an unknown one is named back in the error


UNSUPPORTED_STREAM_OPTIONS = ("continuous_usage_stats",)  # vLLM's usage in every chunk


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")  # kept to be named below, not dropped

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: Any = None
    # Extensions, as vLLM and LLaMA-Factory name them.
    top_k: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)

    _text = field_validator("*")(valid_text)

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise ApiError(400, "At most 4 stop sequences are allowed.", param="stop")
        return [s for s in stops if s]

    def refuse_unsupported(self) -> None:
        for name in self.model_extra or {}:
            if name in NO_EFFECT_FIELDS:
                continue
            if name in UNSUPPORTED_FIELDS:
                raise ApiError(400, f"{name} is not supported by this server.", param=name)
            raise unrecognized(name, [*type(self).model_fields, *NO_EFFECT_FIELDS])
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported by this server; use repetition_penalty instead.",
                               param=name)
        if self.logprobs not in (None, False, 0):
            raise ApiError(400, "logprobs are not supported by this server.", param="logprobs")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true.", param="stream_options")
        for name in (self.stream_options.model_extra or {}) if self.stream_options is not None else ():
            if name in UNSUPPORTED_STREAM_OPTIONS:
                raise ApiError(400, f"stream_options.{name} is not supported by this server.",
                               param=f"stream_options.{name}")
            raise unrecognized(f"stream_options.{name}", StreamOptions.model_fields)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    type: Literal["text"]
    text: str

    _text = field_validator("*")(valid_text)


class ImageURL(BaseModel):
    model_config = ConfigDict(extra="ignore")

    url: str
    detail: str | None = None  # OpenAI's low/high/auto: accepted; the model's processor decides the resolution

    _text = field_validator("*")(valid_text)


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL | str

    _text = field_validator("*")(valid_text)

    @property
    def url(self) -> str:
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url


IMAGE_PLACEHOLDER = "<image>"  # gym.data.media's placeholder, which the model's processor expands


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImagePart] | None = None
    # An assistant's calls (OpenAI's shape; gym.data.tools reads them and says what is wrong with one) and the id
    # of the call a tool message answers.
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    _text = field_validator("*")(valid_text)

    def text(self) -> str:
        """The text, with an image placeholder where each image part is."""
        if isinstance(self.content, list):
            return "".join(part.text if isinstance(part, TextPart) else IMAGE_PLACEHOLDER for part in self.content)
        return self.content or ""

    def image_urls(self, index: int) -> list[tuple[str, str]]:
        """(field, url) of each image part; `index`: the message's place in the request, for the field's name."""
        if not isinstance(self.content, list):
            return []
        return [(f"messages.{index}.content.{j}.image_url", part.url)
                for j, part in enumerate(self.content) if isinstance(part, ImagePart)]

    def openai(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def conversation(messages: list[Message]) -> tuple[list[InternalMessage], str | None]:
    """(messages, system): every system/developer message becomes the system prompt, as training saw it; the rest,
    tool calls and results included, become gym.data.messages' turns. The last turn must ask for an answer: a user
    message, or tool results."""
    for i, m in enumerate(messages):
        if m.role != "user" and m.image_urls(i):
            raise ApiError(400, f"messages.{i}: images go in user messages; a {m.role} message holds text only.",
                           param=f"messages.{i}.content")
        # As OpenAI: only an assistant message that calls tools may leave its content out. Without this a message
        # with no content was read as an empty one, and the model answered a prompt the client never wrote.
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            need = "an assistant message needs content or tool_calls" if m.role == "assistant" else \
                f"a {m.role} message needs content"
            raise ApiError(400, f"messages.{i}: {need}.", param=f"messages.{i}.content")
    _check_tool_results(messages)
    system = [m.text() for m in messages if m.role in ("system", "developer")]
    # The system prompt stays first, so an error's message index is the client's when it sent one system message
    # at the start (as clients do).
    rest = [m.openai() for m in messages if m.role not in ("system", "developer")]
    if not rest or rest[-1]["role"] not in ("user", "tool"):
        raise ApiError(400, "The last message must come from the user (or be a tool's result).", param="messages")
    try:
        _, turns = messages_from_openai(([{"role": "system", "content": ""}] if system else []) + rest)
    except DataError as e:
        raise ApiError(400, str(e), param="messages") from None
    return turns, ("\n".join(system) if system else None)


def _check_tool_results(messages: list[Message]) -> None:
    """A tool message answers a call of the assistant message before it, as OpenAI requires: one with nothing to
    answer (first, or after a user) or an id no call has was taken for the result of whatever call came last. The
    id may be left out (results then answer the calls in order, as local clients send them)."""
    calls: list[str] | None = None  # the ids of the calls a tool message may answer now; None: no call to answer
    for i, m in enumerate(messages):
        if m.role == "assistant":
            calls = [str(c.get("id")) for c in m.tool_calls if isinstance(c, dict)] if m.tool_calls else None
        elif m.role == "user":
            calls = None
        elif m.role == "tool":
            if calls is None:
                raise ApiError(400, f"messages.{i}: a tool message must answer a preceding assistant message's "
                               "tool_calls.", param=f"messages.{i}")
            if m.tool_call_id is not None and calls and m.tool_call_id not in calls:
                raise ApiError(400, f"messages.{i}.tool_call_id: {m.tool_call_id!r} is not the id of a call of the "
                               f"assistant message before it ({', '.join(map(repr, calls))}).",
                               param=f"messages.{i}.tool_call_id")


class ChatCompletionRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # Read by the ChatModel (gym.infer.tool_choice), which names the field it cannot use.
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    functions: Any = None
    top_logprobs: Any = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.functions:
            raise ApiError(400, "functions (OpenAI's deprecated form) is not supported by this server; send tools.",
                           param="functions")
        if self.top_logprobs:
            raise ApiError(400, "top_logprobs is not supported by this server.", param="top_logprobs")

    def conversation(self) -> tuple[list[InternalMessage], str | None]:
        return conversation(self.messages)

    def image_urls(self) -> list[tuple[str, str]]:
        """(field, url) of every image part, in the order their placeholders appear in the prompt."""
        return image_urls(self.messages)

    @property
    def constrained_by(self) -> str | None:
        """The field that asks for constrained decoding (named when the engine cannot do it)."""
        if self.tools and (self.tool_choice == "required" or isinstance(self.tool_choice, dict)):
            return "tool_choice"
        if self.response_format and self.response_format.get("type") != "text":
            return "response_format"
        return None


def image_urls(messages: list[Message]) -> list[tuple[str, str]]:
    return [found for i, m in enumerate(messages) for found in m.image_urls(i)]


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.suffix:
            raise ApiError(400, "suffix (insertion) is not supported by this server.", param="suffix")
        if self.best_of not in (None, 1):
            raise ApiError(400, "best_of is not supported by this server.", param="best_of")


class ModerationRequest(BaseModel):
    """OpenAI's /v1/moderations: a string, a list of strings (one result each), or a list of content parts (one
    input; only text parts: the guards here read text)."""
    model_config = ConfigDict(extra="ignore")

    input: str | list[str] | list[dict[str, Any]]
    model: str | None = None

    def texts(self) -> list[str]:
        if isinstance(self.input, str):
            return [self.input]
        if not self.input:
            raise ApiError(400, "input is empty: give a string or a list of strings.", param="input")
        if all(isinstance(item, str) for item in self.input):
            return [str(item) for item in self.input]
        parts: list[str] = []
        for i, part in enumerate(self.input):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(400, f"input.{i}: only text parts can be moderated here (got {kind!r}); this "
                                    "server's guard reads text.", param=f"input.{i}")
            parts.append(part["text"])
        return ["\n".join(parts)]

    _text = field_validator("*")(valid_text)


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: the ids a chat or a prompt becomes, exactly as generation would see them."""
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)  # as a chat request's: never empty
    prompt: str | None = None
    tools: list[Any] | None = None  # described in the prompt as a chat request with them would be

    _text = field_validator("*")(valid_text)
