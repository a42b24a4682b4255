"""`gym api`: an OpenAI-compatible HTTP server (FastAPI) in front of a ChatModel's engine.

Routes: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions, and vLLM's
POST /tokenize (the prompt ids a request becomes; how a client checks the chat template). Chat
prompts are rendered by the ChatModel with the template the model was trained with. A server with
variants (`gym api --variants STORE`) also answers `model: "<base>:<user>"` with that user's variant, in
the same batches as the base; /v1/models lists them (with `parent`: the base, as vLLM lists adapters).
With a guard (`gym api --guard SPEC`, gym.serve.guarding), requests are checked before they decode, answers as
they stream, and POST /v1/moderations answers in OpenAI's shape.

Chat requests may offer tools and ask for structured output (gym.infer.tool_choice): calls the model writes in its
template family's format come back as `message.tool_calls` with `finish_reason: "tool_calls"`; while streaming, text
that may be a call is held back until the answer ends, then sent as `delta.tool_calls` (a call's id, name and whole
arguments in its first chunk), so no client ever sees a raw call as content.

A vision-language model also takes `image_url` content parts in user messages: data: URLs always, file:// and
http(s) URLs only as the server's MediaPolicy allows (gym.serve.media: --media-dir, --allow-remote-media). Each
image is checked (gym.data.media.load_image: a real image, not truncated, under the pixel limit) before anything
decodes it; every bad one is a 400 naming its field, and a text model is sent none.

Tenants (gym.serve.tenancy, docs/service.md): a variant store whose database holds API keys answers only
requests with one; a user's key sees the base and that user's own variant (another user's is a 404, as a model
that does not exist), an admin's sees all. The same store's files are served as OpenAI's Files API
(gym.serve.files) and its jobs as OpenAI's fine-tuning API (gym.serve.fine_tuning); a job's model answers as its
`ft:<base>:<user>:<suffix>:<id>` name as soon as the job succeeds, to its owner (and admins) only.

Every failure answers OpenAI's error JSON with a 4xx status (400 a bad value, a body or query that does not
validate, an unknown field, or a variant that cannot be loaded, with `param` naming the field; 401 key, 404
route, model or file, 409 a file in use, 429 queue full, 503 shutting down); the engine's bounded queue is what
keeps memory bounded under load. `usage` counts the prompt's ids and every generated token, end-of-turn token
included.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers import AutoConfig

from gym.core.errors import ConfigError
from gym.data.media import MediaError, load_image
from gym.infer.chat import ChatModel, ChatTurn
from gym.infer.fast.bank import VariantBank, VariantNotFound, VariantUnavailable
from gym.infer.grammar import Constraint, GrammarStopped
from gym.infer.requests import EngineBusy, EngineStopped, Event, Finished, Media, Piece, SamplingParams
from gym.infer.tool_choice import CallStream, RequestFieldError
from gym.safety.verdict import Message
from gym.serve.files import file_routes
from gym.serve.fine_tuning import fine_tuning_routes
from gym.serve.guarding import GuardPolicy, guard_conversation, moderation_routes
from gym.serve.limits import DEFAULT_MAX_BODY_BYTES, BodyLimit, check_text_length
from gym.serve.media import MediaPolicy
from gym.serve.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
    _Request,
    conversation,
    image_urls,
    invalid_request,
)
from gym.serve.tenancy import Caller, Gate, caller, refused
from gym.service.db import DatabaseUnavailable
from gym.service.jobs import parse_fine_tuned_model
from gym.service.keys import Principal
from gym.service.queue import JobQueue
from gym.service.service import Service
from gym.tfgrpo.library import ExperienceLibrary, with_experiences

# How often a non-streaming request asks whether its client is still there: one that hung up frees its rows within this.
HANG_UP_POLL_SECONDS = 0.05

_STATUS_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 405: "invalid_request_error", 409: "invalid_request_error", 413: "invalid_request_error",
                 429: "rate_limit_error", 500: "server_error",
                 503: "service_unavailable"}


def create_app(chat_model: ChatModel, model_name: str, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, experiences: ExperienceLibrary | None = None,
               media: MediaPolicy | None = None, service: Service | None = None,
               guard: GuardPolicy | None = None) -> FastAPI:
    """The app for one loaded ChatModel. `api_key` (if set) is required as a bearer token on /v1, /tokenize
    and /openapi.json (the browser pages /docs and /redoc, which cannot send it, are then off). `experiences`:
    a Training-Free GRPO library appended to the system prompt of every chat request (base and variants alike),
    as the library was shown in training; /v1/completions take raw text and are left as sent. `media`: where
    image URLs may be read from (default: data: URLs only). `service`: the variant store's database and files
    (gym.service): its API keys make the server multi-tenant (gym.serve.tenancy) and /v1/files serves its files.
    `guard`: a guard that checks every request and answer (gym.serve.guarding) and answers /v1/moderations."""
    server = _Server(chat_model, model_name, media or MediaPolicy(), guard)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(chat_model.close)  # the engine finishes its step and releases waiters

    gate = Gate(api_key, service.db if service is not None else None)
    # A store's keys may appear while the server runs: its docs pages are then answered per request below.
    public_docs = api_key is None and service is None
    app = FastAPI(title="Gym", lifespan=lifespan, openapi_url="/openapi.json" if public_docs else None,
                  docs_url="/docs" if public_docs else None, redoc_url="/redoc" if public_docs else None)
    app.state.server = server
    # /v1/files streams its own body under its own (larger) limit; every other route's is read here.
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, exempt=("/v1/files",) if service is not None else ())

    app.state.gate = gate  # what the `Caller` dependency of every keyed route asks (gym.serve.tenancy)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(DatabaseUnavailable)
    async def database_unavailable(request: Request, exc: DatabaseUnavailable) -> JSONResponse:
        # fail closed: no key can be checked, so nothing is answered; a client's retry may find it back
        error = ApiError(503, str(exc), type="service_unavailable", code="database_unavailable")
        return JSONResponse(error.body(), status_code=503)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"Unknown route {request.method} {request.url.path}." if exc.status_code == 404 else str(exc.detail)
        error = ApiError(exc.status_code, message, type=_STATUS_TYPES.get(exc.status_code, "invalid_request_error"))
        return JSONResponse(error.body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        route = request.scope.get("route")
        body = getattr(getattr(route, "body_field", None), "field_info", None)
        error = invalid_request(exc.errors(), getattr(body, "annotation", None), request.headers.get("content-type"))
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        error = ApiError(500, f"Internal error: {type(exc).__name__}: {exc}", type="server_error")
        return JSONResponse(error.body(), status_code=500)

    if not public_docs:
        @app.get("/openapi.json", dependencies=[Depends(caller)], include_in_schema=False)
        async def openapi() -> dict[str, Any]:
            return app.openapi()

    if service is not None:
        # The browser pages cannot send a key: they are there while the server needs none, 401 once it does.
        def open_pages() -> None:
            if not gate.open:
                raise refused()

        @app.get("/docs", dependencies=[Depends(open_pages)], include_in_schema=False)
        async def docs() -> HTMLResponse:
            return get_swagger_ui_html(openapi_url="/openapi.json", title="Gym")

        @app.get("/redoc", dependencies=[Depends(open_pages)], include_in_schema=False)
        async def redoc() -> HTMLResponse:
            return get_redoc_html(openapi_url="/openapi.json", title="Gym")

        app.include_router(file_routes(service.files))
        app.include_router(fine_tuning_routes(service.jobs, model_name))
        server.jobs = service.jobs
    app.include_router(moderation_routes(guard))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, **chat_model.engine.load}

    @app.get("/v1/models")
    async def models(who: Caller) -> dict[str, Any]:
        mine = await asyncio.to_thread(server.listed, who)  # a user's key lists that user's models only
        return {"object": "list", "data": [server.model_card()] + [server.model_card(name) for name in mine]}

    @app.get("/v1/me")
    async def me(who: Caller) -> dict[str, Any]:
        """Whose key this is (not an OpenAI route): what a front end signing a person in by key needs to know."""
        return {"object": "api_key", "id": who.key_id, "user": who.user_id, "admin": who.admin}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, who: Caller) -> dict[str, Any]:
        variant = await asyncio.to_thread(server.check_model, name, who)
        return server.model_card(None if variant is None else name)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request,
                               who: Caller) -> Any:
        variant = await server.load_variant(body.model, who)
        body.refuse_unsupported()
        check_text_length([(f"messages.{i}.content", m.text()) for i, m in enumerate(body.messages)],
                          server.context_length)
        messages, system = body.conversation()
        context = guard_conversation(body.messages)
        if guard is not None:
            await guard.check_input(context, "messages")
        urls = body.image_urls()
        # Fetching, checking and expanding images is blocking work (files, the network, the processor): off the loop.
        images = await asyncio.to_thread(server.load_images, urls) if urls else []
        try:
            prepare = functools.partial(chat_model.prepare, messages, with_experiences(system, experiences),
                                        tools=body.tools, tool_choice=body.tool_choice,
                                        parallel_tool_calls=body.parallel_tool_calls,
                                        response_format=body.response_format)
            turn = await asyncio.to_thread(prepare, images=images) if images else prepare()
        except RequestFieldError as e:
            raise ApiError(400, str(e), param=e.field) from None
        params = server.params(body, len(turn.prompt), max_tokens=body.max_completion_tokens or body.max_tokens,
                               variant=variant, constraint=turn.constraint, prompt_field="messages")
        return await server.respond(body, [turn.prompt], params, request, turn=turn, contexts=[context])

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request, who: Caller) -> Any:
        variant = await server.load_variant(body.model, who)
        body.refuse_unsupported()
        texts = [body.prompt] if isinstance(body.prompt, str) else [p for p in body.prompt if isinstance(p, str)]
        check_text_length([("prompt", t) for t in texts], server.context_length)
        prompts = server.encode_prompts(body.prompt)
        contexts: list[list[Message]] = []
        if guard is not None:
            contexts = [[{"role": "user", "content": chat_model.tokenizer.decode(p)}] for p in prompts]
            for i, context in enumerate(contexts):
                await guard.check_input(context, "prompt" if len(prompts) == 1 else f"prompt.{i}")
        params = server.params(body, max(len(p) for p in prompts), max_tokens=body.max_tokens, variant=variant,
                               prompt_field="prompt")
        return await server.respond(body, prompts, params, request, contexts=contexts)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, who: Caller) -> dict[str, Any]:
        if body.model is not None:
            server.check_model(body.model, who)
        if (body.messages is None) == (body.prompt is None):
            raise ApiError(400, "Give either messages or prompt.", param="messages")
        texts = [m.text() for m in body.messages or []] + ([body.prompt] if body.prompt else [])
        check_text_length([("messages" if body.messages else "prompt", t) for t in texts], server.context_length)
        if body.messages is not None:
            messages, system = conversation(body.messages)
            urls = image_urls(body.messages)
            images = await asyncio.to_thread(server.load_images, urls) if urls else []
            try:
                tokens = (await asyncio.to_thread(chat_model.prepare, messages, with_experiences(system, experiences),
                                                  tools=body.tools, images=images)).prompt
            except RequestFieldError as e:
                raise ApiError(400, str(e), param=e.field) from None
        else:
            tokens = chat_model.tokenizer.encode(body.prompt)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": server.context_length}

    return app


class _Server:
    def __init__(self, chat_model: ChatModel, model_name: str, media: MediaPolicy,
                 guard: GuardPolicy | None = None) -> None:
        self.chat_model = chat_model
        self.guard = guard
        self.model_name = model_name
        self.media = media
        self.created = int(time.time())
        self.context_length = _context_length(chat_model)
        engine_variants = getattr(chat_model.engine, "variants", None)
        self.variants: VariantBank | None = engine_variants if isinstance(engine_variants, VariantBank) else None
        self.jobs: JobQueue | None = None  # the store's fine-tuning jobs: their models answer as ft:... names

    def listed(self, who: Principal) -> list[str]:
        """The model ids `who` may use besides the base: `<base>:<user>` variants and fine-tuned `ft:` models."""
        if self.variants is None:
            return []
        names = self.variants.names()
        # a job's entry (user+suffix+job id) is listed under its ft: name, for its job's owner only
        ids = [f"{self.model_name}:{user}" for user in names if "+" not in user and who.may_see(user)]
        if self.jobs is not None:
            entries = set(names)
            ids += [name for name, owner in self.jobs.fine_tuned_models().items()
                    if who.may_see(owner) and parse_fine_tuned_model(name).variant in entries
                    and parse_fine_tuned_model(name).base == self.model_name]
        return ids

    def model_card(self, model_id: str | None = None) -> dict[str, Any]:
        """A model object: the base (None), or a variant's or fine-tuned model's id as the client names it."""
        if model_id is None:
            return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "gym"}
        return {"id": model_id, "object": "model", "created": self.created, "owned_by": "gym",
                "root": self.model_name, "parent": self.model_name}

    def check_model(self, name: str, who: Principal) -> str | None:
        """The variant `name` asks for (None: the base); 404 for a model this server does not serve, and for
        another user's variant (a 403 would tell a caller which users have one)."""
        if name == self.model_name:
            return None
        if name.startswith("ft:") and self.jobs is not None and self.variants is not None:
            # a job's model: its owner (the job's user, not the name's) and admins only, once it succeeded
            found, owner = self.jobs.owner_of_model(name)
            if found and who.may_see(owner) and parse_fine_tuned_model(name).base == self.model_name:
                entry = parse_fine_tuned_model(name).variant
                if self.variants.has(entry):
                    return entry
        base, _, user = name.rpartition(":")  # user ids never hold ':'
        # a job's entry (user+suffix+job id) answers by its ft: name only, which checks the job's owner: a key whose
        # user id happened to spell an entry must not reach it this way
        job_entry = "+" in user and not who.admin
        if base == self.model_name and self.variants is not None and not job_entry and who.may_see(user) \
                and self.variants.has(user):
            return user
        served = f"'{self.model_name}'" + (f" and its variants '{self.model_name}:<user>'" if self.variants else "")
        raise ApiError(404, f"The model '{name}' does not exist; this server serves {served}.",
                       param="model", code="model_not_found")

    async def load_variant(self, name: str, who: Principal) -> str | None:
        """check_model, with the variant loaded (off the event loop: a first use reads its file)."""
        user = await asyncio.to_thread(self.check_model, name, who)  # an ft: name is looked up in the database
        if user is not None:
            assert self.variants is not None
            try:
                await asyncio.to_thread(self.variants.get, user)
            except VariantNotFound:
                raise ApiError(404, f"The model '{name}' does not exist (its variant was just deleted).",
                               param="model", code="model_not_found") from None
            except VariantUnavailable as exc:
                raise _unloadable(name, exc) from None
        return user

    def load_images(self, urls: list[tuple[str, str]]) -> list[Any]:
        """Each (field, url) -> the image, opened but not decoded, once the policy allowed reading it and
        gym.data.media found it sound; a 400 naming the field otherwise. Blocking: run it in a thread."""
        if self.chat_model.media is None:
            raise ApiError(400, f"{urls[0][0]}: the model is a text model ({self.model_name}); it takes no images. "
                                "Send text only, or serve a vision-language model.", param=urls[0][0])
        images = []
        for where, url in urls:
            try:
                images.append(load_image(self.media.fetch(url, where), where=where))
            except MediaError as e:
                raise ApiError(400, str(e), param=e.where) from None
        return images

    def encode_prompts(self, prompt: str | list[str] | list[int]) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise ApiError(400, "The prompt is empty.", param="prompt")
        token_ids = [p for p in prompt if isinstance(p, int)]
        if len(token_ids) == len(prompt):
            vocab = len(self.chat_model.tokenizer)
            if any(not 0 <= p < vocab for p in token_ids):
                raise ApiError(400, f"Token ids must lie in [0, {vocab}).", param="prompt")
            return [token_ids]
        encoded = [self.chat_model.tokenizer.encode(p) for p in prompt]
        if any(not ids for ids in encoded):
            raise ApiError(400, "A prompt encodes to no tokens.", param="prompt")
        return encoded

    def params(self, body: _Request, prompt_len: int, max_tokens: int | None, variant: str | None = None,
               constraint: Constraint | None = None, prompt_field: str = "messages") -> list[SamplingParams]:
        """One SamplingParams per choice; with a seed, choice i samples with seed + i (distinct, reproducible).
        `prompt_field`: the field that holds the prompt (`messages`, or a completion's `prompt`), named when it
        is too long."""
        room = self.context_length - prompt_len
        if room < 1:
            raise ApiError(400, f"The prompt is {prompt_len} tokens; this model's context is {self.context_length}.",
                           param=prompt_field, code="context_length_exceeded")
        if max_tokens is not None and max_tokens > room:
            raise ApiError(400, f"This model's maximum context length is {self.context_length} tokens; the prompt "
                                f"({prompt_len}) plus max_tokens ({max_tokens}) exceeds it.",
                           param="max_tokens", code="context_length_exceeded")
        overrides: dict[str, Any] = {"top_p": body.top_p, "top_k": body.top_k,
                                     "repetition_penalty": body.repetition_penalty}
        if body.temperature is not None:  # OpenAI semantics: temperature 0 is greedy, anything else samples
            overrides.update(temperature=body.temperature, do_sample=body.temperature > 0)
        max_new = max_tokens or min(self.chat_model.decoding["max_new_tokens"], room)
        stops = body.stops()
        return [self.chat_model.sampling_params(stop=stops, seed=None if body.seed is None else body.seed + i,
                                                max_new_tokens=max_new, variant=variant, constraint=constraint,
                                                **overrides)
                for i in range(body.n)]

    async def respond(self, body: _Request, prompts: list[list[int]], params: list[SamplingParams],
                      request: Request, turn: ChatTurn | None = None,
                      contexts: list[list[Message]] | None = None) -> Any:
        """Completions for `prompts`; a chat completion's one prompt is `turn`'s, whose tool format reads calls.
        `contexts`: each prompt's conversation, as the guard judges the answers (with one)."""
        chat = turn is not None
        jobs = [(prompt, p) for prompt in prompts for p in params]  # choice index = prompt index * n + j
        admits = getattr(self.chat_model.engine, "max_waiting", None)
        if isinstance(admits, int) and len(jobs) > admits:
            # More than the queue ever admits at once: a 429's "retry later" would never come true.
            raise ApiError(400, f"This request asks for {len(jobs)} completions ({len(prompts)} prompt(s) x n="
                                f"{len(params)}); this server admits at most {admits} at once (its --max_waiting). "
                                "Send fewer prompts or a smaller n.", param="n" if len(prompts) == 1 else "prompt")
        events, handles = self._submit(jobs, getattr(body, "constrained_by", None),
                                       media=turn.media if turn is not None else None)
        screening: asyncio.Task[None] | None = None
        if self.guard is not None and contexts:
            events, screening = self.guard.filter(events, handles, [contexts[i // len(params)]
                                                                    for i in range(len(jobs))])
        kind = "chatcmpl" if chat else "cmpl"
        # OpenAI echoes the model asked for: a variant's or an ft: model's own name, never only the base's
        model = self.model_name if params[0].variant is None else body.model
        response_id = f"{kind}-{uuid.uuid4().hex}"
        prompt_tokens = sum(len(p) for p in prompts)
        echo = [self.chat_model.tokenizer.decode(p) if getattr(body, "echo", False) else "" for p in prompts]
        if body.stream:
            stream = self._stream(events, handles, jobs, response_id, turn, prompt_tokens, body.include_usage, echo,
                                  len(params), model, screening, getattr(body, "constrained_by", None))
            return StreamingResponse(stream, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        finished: dict[int, Finished] = {}
        loop = asyncio.get_running_loop()
        check_at = loop.time() + HANG_UP_POLL_SECONDS
        try:
            while len(finished) < len(jobs):
                try:
                    index, event = await asyncio.wait_for(events.get(), timeout=HANG_UP_POLL_SECONDS)
                except asyncio.TimeoutError:
                    pass
                else:
                    if isinstance(event, Finished):
                        finished[index] = event
                # By the clock, not only when no token came: pieces arrive every step, so a check made only in a
                # quiet moment never ran, and a client that hung up held its rows until max_tokens.
                if loop.time() >= check_at:
                    if await request.is_disconnected():
                        return None
                    check_at = loop.time() + HANG_UP_POLL_SECONDS
        finally:
            for handle in handles:
                handle.cancel()
            if screening is not None:
                screening.cancel()
        if any(f.reason == "cancelled" for f in finished.values()):
            raise ApiError(503, "The server is shutting down; retry on another instance.", type="service_unavailable")
        stopped = next((f for f in finished.values() if f.reason == "error"), None)
        if stopped is not None:
            raise _grammar_stopped(stopped, getattr(body, "constrained_by", None))
        completion_tokens = sum(f.completion_tokens for f in finished.values())
        choices = []
        for index in range(len(jobs)):
            done = finished[index]
            if turn is not None:
                reply = turn.reply(done)
                message: dict[str, Any] = {"role": "assistant", "content": reply.content}
                if reply.calls:
                    message["content"] = reply.content or None  # OpenAI's null when an answer only calls
                    message["tool_calls"] = [call.openai() for call in reply.calls]
                choices.append({"index": index, "message": message, "logprobs": None,
                                "finish_reason": reply.finish_reason})
            else:
                choices.append({"index": index, "text": echo[index // len(params)] + done.text, "logprobs": None,
                                "finish_reason": done.reason})
        return {"id": response_id, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model, "choices": choices,
                "usage": _usage(prompt_tokens, completion_tokens)}

    def _submit(self, jobs: list[tuple[list[int], SamplingParams]], constrained_by: str | None = None,
                media: Media | None = None) -> tuple[asyncio.Queue[tuple[int, Event]], list[Any]]:
        """Submit every job; `constrained_by`: the request field that asked for constrained decoding (named in the
        400 of an engine that cannot do it); `media`: the images' tensors every job's prompt holds the tokens of."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        handles = []

        def sink_for(i: int) -> Callable[[Event], None]:
            def sink(event: Event) -> None:
                loop.call_soon_threadsafe(events.put_nowait, (i, event))
            return sink

        try:
            for index, (prompt, params) in enumerate(jobs):
                # media only where there are some: a text request reaches the engine exactly as before images
                extra: dict[str, Any] = {"media": media} if media else {}
                handles.append(self.chat_model.engine.submit(prompt, params, sink=sink_for(index), **extra))
        except EngineBusy as exc:
            for handle in handles:
                handle.cancel()
            raise ApiError(429, f"The server is busy ({exc}).", type="rate_limit_error",
                           code="rate_limit_exceeded") from None
        except EngineStopped:
            for handle in handles:
                handle.cancel()
            raise ApiError(503, "The server is shutting down.", type="service_unavailable") from None
        except VariantNotFound as exc:
            for handle in handles:
                handle.cancel()
            raise ApiError(404, str(exc), param="model", code="model_not_found") from None
        except VariantUnavailable as exc:  # replaced by a broken variant since load_variant found it whole
            for handle in handles:
                handle.cancel()
            raise _unloadable(f"{self.model_name}:{jobs[0][1].variant}", exc) from None
        except ConfigError as exc:  # a constraint this engine cannot honour (it says which engines can)
            for handle in handles:
                handle.cancel()
            raise ApiError(400, str(exc), param=constrained_by) from None
        return events, handles

    async def _stream(self, events: asyncio.Queue[tuple[int, Event]], handles: list[Any], jobs: list[Any],
                      response_id: str, turn: ChatTurn | None, prompt_tokens: int, include_usage: bool,
                      echo: list[str], n: int, model: str, screening: asyncio.Task[None] | None = None,
                      constrained_by: str | None = None) -> AsyncIterator[str]:
        chat = turn is not None
        calls: list[CallStream] = [turn.calls() for _ in jobs] if turn is not None else []
        created = int(time.time())
        base = {"id": response_id, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": model}

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            usage = {"usage": None} if include_usage else {}
            return f"data: {json.dumps({**base, 'choices': choices, **usage, **extra})}\n\n"

        def choice(index: int, text: str | None, reason: str | None, role: bool = False) -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                    {"content": text} if text else {})
                return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
            return {"index": index, "text": text or "", "logprobs": None, "finish_reason": reason}

        completion_tokens, remaining = 0, len(jobs)
        try:
            for index in range(len(jobs)):
                if chat:
                    yield chunk([choice(index, None, None, role=True)])
                elif echo[index // n]:
                    yield chunk([choice(index, echo[index // n], None)])
            while remaining:
                index, event = await events.get()
                if isinstance(event, Piece):
                    text = calls[index].feed(event.text) if chat else event.text
                    if text:
                        yield chunk([choice(index, text, None)])
                    continue
                remaining -= 1
                if event.reason == "cancelled":
                    error = ApiError(503, "The server is shutting down.", type="service_unavailable")
                    yield f"data: {json.dumps(error.body())}\n\n"
                    break
                if event.reason == "error":  # headers are sent: the 400 goes in the stream, as a cancelled one's 503
                    yield f"data: {json.dumps(_grammar_stopped(event, constrained_by).body())}\n\n"
                    break
                completion_tokens += event.completion_tokens
                reason = event.reason
                if chat:
                    rest, found = calls[index].finish()
                    if rest:
                        yield chunk([choice(index, rest, None)])
                    for i, call in enumerate(found):  # a call whole in its first chunk, as the openai client reads
                        yield chunk([{"index": index, "delta": {"tool_calls": [call.openai(i)]}, "logprobs": None,
                                      "finish_reason": None}])
                    reason = "tool_calls" if found else reason
                yield chunk([choice(index, None, reason)])
            else:
                if include_usage:
                    usage = _usage(prompt_tokens, completion_tokens)
                    yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:  # the client may have gone away: free the rows it held
            for handle in handles:
                handle.cancel()
            if screening is not None:
                screening.cancel()


def _grammar_stopped(finished: Finished, field: str | None) -> ApiError:
    """A constrained answer the grammar library gave up on: the request's schema is at fault (one no finite JSON
    matches), so a 400 naming the field that holds the schema, never a 200 with JSON cut short. `field`: the one that
    asked for constrained decoding; a forced call's schemas are its functions' parameters, in `tools`."""
    return ApiError(400, str(GrammarStopped(finished.error, finished.completion_tokens)),
                    param="tools" if field == "tool_choice" else field)


def _unloadable(model: str, exc: Exception) -> ApiError:
    """A variant the store holds but the server cannot load: the request's fault no more than a deleted one's,
    and no server error either (the base and the other variants answer): a 400 naming it, until it is replaced."""
    return ApiError(400, f"The model '{model}' cannot be loaded: {exc}", param="model", code="model_not_loadable")


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _context_length(chat_model: ChatModel) -> int:
    config = chat_model.model_config
    if config is None:
        config = AutoConfig.from_pretrained(chat_model.model_path,
                                            trust_remote_code=chat_model.model_args.trust_remote_code)
    if hasattr(config, "get_text_config"):  # a vision-language model keeps its context on the language model's config
        config = config.get_text_config()
    length = getattr(config, "max_position_embeddings", None)
    return int(length) if length else int(min(chat_model.tokenizer.model_max_length, 1 << 20))
