"""The OpenAI request bodies Gym accepts, as pydantic models, and the error shape it answers with.

Unknown fields are ignored (clients send extras such as `user`), but features Gym does not have
(tools, logprobs, penalties other than 0) are refused with a 400 naming the parameter rather than
silently dropped: a client that asked for them would otherwise get an answer it did not ask for.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
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
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported by this server; use repetition_penalty instead.",
                               param=name)
        if self.logprobs not in (None, False, 0):
            raise ApiError(400, "logprobs are not supported by this server.", param="logprobs")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true.", param="stream_options")

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class TextPart(BaseModel):
    type: Literal["text"]
    text: str

    _text = field_validator("*")(valid_text)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    _text = field_validator("*")(valid_text)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: Any = None
    functions: Any = None
    top_logprobs: Any = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        for name in ("tools", "functions", "top_logprobs"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported by this server.", param=name)

    def conversation(self) -> tuple[list[dict[str, str]], str | None]:
        """(messages, system): system/developer messages become the system prompt, as training saw it."""
        system = [m.text() for m in self.messages if m.role in ("system", "developer")]
        turns = [{"role": m.role, "content": m.text()} for m in self.messages if m.role in ("user", "assistant")]
        if not turns or turns[-1]["role"] != "user":
            raise ApiError(400, "The last message must come from the user.", param="messages")
        return turns, ("\n".join(system) if system else None)


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


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: the ids a chat or a prompt becomes, exactly as generation would see them."""
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[Message] | None = None
    prompt: str | None = None

    _text = field_validator("*")(valid_text)
