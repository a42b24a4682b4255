"""The Fine-tuning jobs tab: a `gym api --variants STORE` server's fine-tuning service, seen through one API key.

The tab is a client of the server's OpenAI-compatible routes, through the `openai` package, exactly as a user's
own program would be: the key is the login, so the tab shows the key's own jobs only and can do only what the key
may (an admin's key sees everyone's jobs). Nothing here reads the store or its database directly; the server stays
the one place that decides who sees what (docs/service.md).

Two ways in: in the full web UI the tab has its own server and key fields; with `gym webui --service URL` the
page's login is the key itself (KeyLogin: the user id as the user name, the key as the password), and the tab
and its model trial use the signed-in person's key.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import gradio as gr

from gym.core.errors import GymError
from gym.webui.common import user_errors

JOB_COLUMNS = ["id", "status", "model", "fine_tuned_model", "created"]


class ServiceView:
    """One server and one key: the calls the tab makes, each turning the API's refusals into a one-line GymError."""

    def __init__(self, url: str, key: str, http_client: Any = None) -> None:
        import openai

        if not url.strip():
            raise GymError("Give the server's address (e.g. http://127.0.0.1:8000).")
        if not key.strip():
            raise GymError("Give an API key (gym keys create STORE --user NAME prints one).")
        base = url.strip().rstrip("/")
        self.client = openai.OpenAI(base_url=base if base.endswith("/v1") else f"{base}/v1", api_key=key.strip(),
                                    max_retries=0, timeout=30, http_client=http_client)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import openai

        try:
            return fn(*args, **kwargs)
        except openai.AuthenticationError:
            raise GymError("The server refused the key (unknown or revoked).") from None
        except openai.APIStatusError as exc:
            message = exc.body.get("message") if isinstance(exc.body, dict) else None
            raise GymError(f"{what}: {message or exc.message}") from None
        except openai.APIConnectionError:
            raise GymError(f"{what}: no server answers at {self.client.base_url}.") from None

    def models(self) -> list[str]:
        return [model.id for model in self._call("Listing models", self.client.models.list)]

    def jobs(self) -> list[list[str]]:
        listed = self._call("Listing jobs", self.client.fine_tuning.jobs.list, limit=100)
        return [[job.id, job.status, job.model, job.fine_tuned_model or "", str(job.created_at)] for job in listed]

    def create(self, path: str | None, model: str, suffix: str, epochs: float | None) -> str:
        if not path:
            raise GymError("Choose a training file (JSONL in OpenAI's chat format).")
        with Path(path).open("rb") as handle:
            uploaded = self._call("Uploading the file", self.client.files.create,
                                  file=(Path(path).name, handle), purpose="fine-tune")
        hyper = {"n_epochs": int(epochs)} if epochs else {}
        job = self._call("Creating the job", self.client.fine_tuning.jobs.create, model=model,
                         training_file=uploaded.id, suffix=suffix.strip() or None,
                         method={"type": "supervised", "supervised": {"hyperparameters": hyper}})
        return str(job.id)

    def detail(self, job_id: str) -> str:
        """The job's state and its events, oldest first (loss per step among them)."""
        job = self._call("Reading the job", self.client.fine_tuning.jobs.retrieve, job_id)
        events = self._call("Reading the events", self.client.fine_tuning.jobs.list_events, job_id, limit=100)
        lines = [f"{job.id}: {job.status}" + (f", model {job.fine_tuned_model}" if job.fine_tuned_model else "")]
        if job.error and job.error.message:
            lines.append(f"error: {job.error.message}")
        lines += [f"[{event.level}] {event.message}" for event in reversed(list(events))]
        return "\n".join(lines)

    def cancel(self, job_id: str) -> str:
        return str(self._call("Cancelling", self.client.fine_tuning.jobs.cancel, job_id).status)

    def whoami(self) -> dict[str, Any]:
        """The key's owner as the server sees it: {"user": id or None, "admin": bool} (GET /v1/me)."""
        return dict(self._call("Checking the key", self.client.get, "/me", cast_to=object))

    def ask(self, model: str, prompt: str, max_tokens: int = 128) -> str:
        if not model.strip():
            raise GymError("Choose a model to ask.")
        if not prompt.strip():
            raise GymError("Write a message first.")
        reply = self._call("Asking the model", self.client.chat.completions.create, model=model.strip(),
                           messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens)
        return str(reply.choices[0].message.content or "")


ADMIN_LOGIN = "admin"


class KeyLogin:
    """The page's login with a service's API keys, for `gym webui --service URL` (Gradio calls it with the login
    form's fields): the user name is the key's user id (`admin` for an admin's key) and the password is the key.
    The server is asked whose key it is (GET /v1/me) on every login, so a revoked key no longer signs in; a key
    revoked after sign-in stops working on the page's next action, as on the API.

    The name must match the key so that one person's key can never be filed under another's name: the page's
    handlers know the signed-in name only, and take the key kept for it (the latest of that user's keys)."""

    def __init__(self, url: str, http_client: Any = None) -> None:
        self.url = url
        self.http_client = http_client
        self._keys: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, username: str, password: str) -> bool:
        try:
            owner = ServiceView(self.url, password, self.http_client).whoami()
        except GymError:
            return False
        name = ADMIN_LOGIN if owner.get("admin") else owner.get("user")
        if not name or username.strip() != name:
            return False
        with self._lock:
            self._keys[name] = password.strip()
        return True

    def view(self, request: gr.Request | None) -> ServiceView:
        """The signed-in person's view of the service."""
        name = getattr(request, "username", None)
        with self._lock:
            key = self._keys.get(name or "")
        if key is None:
            raise GymError("Sign in again (the page has no key for this session).")
        return ServiceView(self.url, key, self.http_client)


def build(demo: gr.Blocks, login: KeyLogin | None = None) -> None:
    """The tab. With `login` (gym webui --service), the signed-in key is used and no key is typed."""
    with gr.Row(visible=login is None):
        url = gr.Textbox(login.url if login else "http://127.0.0.1:8000", label="server (gym api --variants STORE)",
                         elem_id="svc-url")
        key = gr.Textbox(label="API key", type="password", elem_id="svc-key")
        sign_in = gr.Button("Sign in", variant="primary", elem_id="svc-sign-in")
    who = gr.Markdown("Not signed in.", elem_id="svc-who")
    jobs = gr.Dataframe(headers=JOB_COLUMNS, interactive=False, label="your fine-tuning jobs", elem_id="svc-jobs")
    with gr.Row():
        training_file = gr.File(label="training file (.jsonl)", file_types=[".jsonl"], type="filepath")
        model = gr.Textbox(label="base model (as served)", elem_id="svc-model")
        suffix = gr.Textbox(label="suffix (optional)")
        epochs = gr.Number(None, label="n_epochs (empty: auto)", precision=0)
        create = gr.Button("Create job")
    with gr.Row():
        job_id = gr.Textbox(label="job id", elem_id="svc-job-id")
        show = gr.Button("Show")
        cancel = gr.Button("Cancel job")
    detail = gr.Textbox(label="status and events", lines=12, max_lines=20, elem_id="svc-detail")
    with gr.Row():
        ask_model = gr.Dropdown([], label="try a model (yours and the base)", allow_custom_value=True,
                                elem_id="svc-ask-model")
        prompt = gr.Textbox(label="message", elem_id="svc-prompt")
        ask = gr.Button("Ask", elem_id="svc-ask")
    answer = gr.Textbox(label="answer", lines=4, elem_id="svc-answer")

    def view_of(address: str, secret: str, request: gr.Request | None) -> ServiceView:
        return login.view(request) if login is not None else ServiceView(address, secret)

    @user_errors
    def on_sign_in(address: str, secret: str, request: gr.Request) -> tuple[Any, ...]:
        view = view_of(address, secret, request)
        served = view.models()
        signed = f" as {request.username}" if login is not None and request is not None else ""
        return (f"Signed in{signed}: this key may use {', '.join(served)}.", view.jobs(),
                served[0] if served else "", gr.update(choices=served, value=served[-1] if served else None))

    @user_errors
    def on_create(address: str, secret: str, path: str | None, base: str, name: str,
                  n_epochs: float | None, request: gr.Request) -> tuple[list[list[str]], str]:
        view = view_of(address, secret, request)
        created = view.create(path, base, name, n_epochs)
        return view.jobs(), created

    @user_errors
    def on_show(address: str, secret: str, chosen: str, request: gr.Request) -> tuple[Any, ...]:
        view = view_of(address, secret, request)
        served = view.models()
        return (view.jobs(), view.detail(chosen.strip()) if chosen.strip() else "",
                gr.update(choices=served))

    @user_errors
    def on_cancel(address: str, secret: str, chosen: str, request: gr.Request) -> tuple[list[list[str]], str]:
        view = view_of(address, secret, request)
        view.cancel(chosen.strip())
        return view.jobs(), view.detail(chosen.strip())

    @user_errors
    def on_ask(address: str, secret: str, chosen: str | None, message: str, request: gr.Request) -> str:
        return view_of(address, secret, request).ask(chosen or "", message)

    signed_in = [who, jobs, model, ask_model]
    sign_in.click(on_sign_in, [url, key], signed_in)
    if login is not None:  # signed in by the page's login: show the key's jobs as the page opens
        demo.load(on_sign_in, [url, key], signed_in)
    create.click(on_create, [url, key, training_file, model, suffix, epochs], [jobs, job_id])
    show.click(on_show, [url, key, job_id], [jobs, detail, ask_model])
    cancel.click(on_cancel, [url, key, job_id], [jobs, detail])
    ask.click(on_ask, [url, key, ask_model, prompt], answer)
