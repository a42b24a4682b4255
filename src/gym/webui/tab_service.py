"""The Fine-tuning jobs tab: a `gym api --variants STORE` server's fine-tuning service, seen through one API key.

The tab is a client of the server's OpenAI-compatible routes, through the `openai` package, exactly as a user's
own program would be: the key is the login, so the tab shows the key's own jobs only and can do only what the key
may (an admin's key sees everyone's jobs). Nothing here reads the store or its database directly; the server stays
the one place that decides who sees what (docs/service.md).
"""

from __future__ import annotations

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


def build(demo: gr.Blocks) -> None:
    with gr.Row():
        url = gr.Textbox("http://127.0.0.1:8000", label="server (gym api --variants STORE)", elem_id="svc-url")
        key = gr.Textbox(label="API key", type="password", elem_id="svc-key")
        sign_in = gr.Button("Sign in", variant="primary", elem_id="svc-sign-in")
    who = gr.Markdown("Not signed in.", elem_id="svc-who")
    jobs = gr.Dataframe(headers=JOB_COLUMNS, interactive=False, label="your fine-tuning jobs", elem_id="svc-jobs")
    with gr.Row():
        training_file = gr.File(label="training file (.jsonl)", file_types=[".jsonl"], type="filepath")
        model = gr.Textbox(label="base model (as served)")
        suffix = gr.Textbox(label="suffix (optional)")
        epochs = gr.Number(None, label="n_epochs (empty: auto)", precision=0)
        create = gr.Button("Create job")
    with gr.Row():
        job_id = gr.Textbox(label="job id", elem_id="svc-job-id")
        show = gr.Button("Show")
        cancel = gr.Button("Cancel job")
    detail = gr.Textbox(label="status and events", lines=12, max_lines=20, elem_id="svc-detail")

    @user_errors
    def on_sign_in(address: str, secret: str) -> tuple[str, list[list[str]], str]:
        view = ServiceView(address, secret)
        served = view.models()
        return (f"Signed in: this key may use {', '.join(served)}.", view.jobs(), served[0] if served else "")

    @user_errors
    def on_create(address: str, secret: str, path: str | None, base: str, name: str,
                  n_epochs: float | None) -> tuple[list[list[str]], str]:
        view = ServiceView(address, secret)
        created = view.create(path, base, name, n_epochs)
        return view.jobs(), created

    @user_errors
    def on_show(address: str, secret: str, chosen: str) -> tuple[list[list[str]], str]:
        view = ServiceView(address, secret)
        return view.jobs(), view.detail(chosen.strip()) if chosen.strip() else ""

    @user_errors
    def on_cancel(address: str, secret: str, chosen: str) -> tuple[list[list[str]], str]:
        view = ServiceView(address, secret)
        view.cancel(chosen.strip())
        return view.jobs(), view.detail(chosen.strip())

    sign_in.click(on_sign_in, [url, key], [who, jobs, model])
    create.click(on_create, [url, key, training_file, model, suffix, epochs], [jobs, job_id])
    show.click(on_show, [url, key, job_id], [jobs, detail])
    cancel.click(on_cancel, [url, key, job_id], [jobs, detail])
