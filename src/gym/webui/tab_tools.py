"""The tabs around training: Deltas & variants, Soup, Export, Evaluate. Each long action is a job (a `gym`
subprocess with its console, like a training run); each quick look (inspect, list, status) runs the same
command the CLI has and shows what it printed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gradio as gr

from gym.core.errors import GymError
from gym.webui import forms
from gym.webui.common import UI, choices, job_status, run_gym, user_errors
from gym.webui.jobs import Job, sanitize_name

DELTA_METHODS = ["bitdelta", "int8", "int4", "int2", "ternary", "binary"]
EXPORT_FORMATS = ["hf", "gguf", "gguf-lora", "ollama", "onnx"]
GGUF_TYPES = ["", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"]
EVAL_TASKS = ["mc_demo", "arithmetic", "mmlu", "gsm8k"]


def _job_panel(ui: UI, demo: gr.Blocks, kind: str, name: str) -> tuple[gr.Dropdown, Callable[[Job], Any]]:
    """A picker of this tab's jobs, their status and console, refreshed every 2 s; returns the picker and the
    function that starts a job and selects it."""
    picker = gr.Dropdown([], label=f"{name} jobs", elem_id=f"{kind}-jobs")
    status = gr.Markdown(elem_id=f"{kind}-status")
    console = gr.Textbox(label="console", lines=10, max_lines=10, autoscroll=True, elem_id=f"{kind}-console")

    def view(job_id: str | None) -> tuple[str, str]:
        job = ui.store.get(job_id) if job_id else None
        return job_status(job), job.console() if job else ""

    def listed(selected: str | None = None) -> Any:
        jobs = ui.store.list(kind)
        return gr.update(choices=choices(jobs), value=selected or (jobs[0].id if jobs else None))

    def launch(job: Job) -> Any:
        ui.store.start(job)
        return listed(job.id)

    picker.change(view, picker, [status, console])
    gr.Timer(2.0).tick(view, picker, [status, console], show_progress="hidden")
    demo.load(lambda: listed(), None, picker)
    return picker, launch


def _quick(args: Sequence[str]) -> str:
    return run_gym(list(args)).strip() or "(nothing printed)"


def build_deltas(ui: UI, demo: gr.Blocks) -> None:
    gr.Markdown("### Compress a fine-tune into a delta")
    with gr.Row():
        base = gr.Dropdown([forms.EMBEDDED_MODEL], value=forms.EMBEDDED_MODEL, allow_custom_value=True,
                           label="base (a run's own, when it is one)", elem_id="delta-base")
        finetuned = gr.Dropdown([], allow_custom_value=True, label="fine-tune (a run's output, a model or adapter)",
                                elem_id="delta-finetuned")
        method = gr.Dropdown(DELTA_METHODS, value="bitdelta", label="method")
        distill = gr.Number(0, label="distill steps (bitdelta)", precision=0)
    compress = gr.Button("Compress", variant="primary", elem_id="delta-compress")
    gr.Markdown("### Inspect a delta: size, and the error of each layer")
    with gr.Row():
        delta_file = gr.Textbox(label="delta file (.safetensors)", scale=4, elem_id="delta-file")
        inspect = gr.Button("Inspect", elem_id="delta-inspect")
    inspected = gr.Code(label="gym delta inspect", language=None, interactive=False, elem_id="delta-inspected")
    gr.Markdown("### Personalized variants: one 1-bit delta per user on one base")
    with gr.Row():
        store = gr.Textbox(str(ui.store.root / "variants"), label="variants store", scale=3)
        user = gr.Textbox(label="user id")
        steps = gr.Number(30, label="max_steps", precision=0)
    rows = gr.File(label="the user's rows (SFT .json or .jsonl)", file_types=[".json", ".jsonl"])
    with gr.Row():
        create = gr.Button("Create variant", variant="primary")
        listing = gr.Button("List variants")
        delete = gr.Button("Delete this user's variant")
    listed_box = gr.Code(label="variants", language=None, interactive=False)
    gr.Markdown("To chat with a variant: the Chat tab, with this store and the user id.")
    picker, launch = _job_panel(ui, demo, "delta", "delta and variant")

    @user_errors
    def on_compress(base_model: str, tuned: str, how: str, distill_steps: float | None) -> Any:
        if not tuned:
            raise GymError("Pick the fine-tune to compress.")
        job = ui.store.create("delta", f"{how} of {Path(tuned).name}",
                              ["delta", "compress", "--base", base_model, "--finetuned", tuned, "--method", how,
                               "--distill-steps", str(int(distill_steps or 0)), "-o", "{job}/delta.safetensors"],
                              output="{job}/delta.safetensors")
        return launch(job)

    @user_errors
    def on_create(folder: str, user_id: str, max_steps: float | None, upload: str | None) -> Any:
        if not (folder and user_id and upload):
            raise GymError("A variant needs the store, a user id and the user's rows.")
        name = sanitize_name(Path(upload).name)
        job = ui.store.create("delta", f"variant of {user_id}",
                              ["variants", "create", folder, "--user", user_id, "--data", f"{{job}}/uploads/{name}",
                               f"max_steps={int(max_steps or 30)}"], output=folder)
        ui.store.upload(job, upload, name)
        return launch(job)

    compress.click(on_compress, [base, finetuned, method, distill], picker)
    finetuned.change(lambda tuned: gr.update(value=trained_base(tuned) or forms.EMBEDDED_MODEL), finetuned, base)
    inspect.click(user_errors(lambda path: _quick(["delta", "inspect", path])), delta_file, inspected)
    create.click(on_create, [store, user, steps, rows], picker)
    listing.click(user_errors(lambda folder: _quick(["variants", "list", folder])), store, listed_box)
    delete.click(user_errors(lambda folder, who: _quick(["variants", "delete", folder, "--user", who])),
                 [store, user], listed_box)
    demo.load(lambda: gr.update(choices=ui.outputs()), None, finetuned)


def trained_base(folder: str | None) -> str | None:
    """The base a Gym run was trained on (its manifest says), so its delta is taken against the right model."""
    import json

    try:
        manifest = json.loads((Path(folder or "") / "gym_manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(manifest.get("base_model") or "") or None


def contributions_table(path: str) -> list[list[Any]]:
    """Every contribution of a soup with its status and, when rejected, the reason."""
    from gym.soup.soup import DeltaSoup
    from gym.soup.store import LEDGER

    if not (Path(path) / LEDGER).is_file():
        raise GymError(f"{path} is not a soup; create it with `gym soup init {path} --base MODEL`.")
    return [[r.id, r.user_id, r.round, r.status, r.reason or "", r.num_samples, None if r.norm is None else
             round(r.norm, 4)] for r in DeltaSoup(path=path).store.contributions()]


def build_soup(ui: UI, demo: gr.Blocks) -> None:
    with gr.Row():
        path = gr.Textbox(label="soup folder", scale=4, placeholder="made by gym soup init")
        refresh = gr.Button("Status")
        aggregate = gr.Button("Aggregate", variant="primary")
    status = gr.Code(label="gym soup status", language=None, interactive=False)
    table = gr.Dataframe(headers=["id", "user", "round", "status", "reason", "samples", "norm"],
                         interactive=False, label="contributions, with why each was accepted or rejected")
    rewards = gr.Code(label="gym soup rewards (the last aggregated round)", language=None, interactive=False)
    picker, launch = _job_panel(ui, demo, "soup", "soup")

    @user_errors
    def on_status(folder: str) -> tuple[str, list[list[Any]], str]:
        text = _quick(["soup", "status", folder])
        try:
            paid = _quick(["soup", "rewards", folder])
        except GymError as exc:  # no round aggregated yet
            paid = str(exc)
        return text, contributions_table(folder), paid

    @user_errors
    def on_aggregate(folder: str) -> Any:
        return launch(ui.store.create("soup", f"aggregate {Path(folder).name}", ["soup", "aggregate", folder],
                                      output=folder))

    refresh.click(on_status, path, [status, table, rewards])
    aggregate.click(on_aggregate, path, picker)


def build_export(ui: UI, demo: gr.Blocks) -> None:
    with gr.Row():
        model = gr.Dropdown([], allow_custom_value=True, label="model (a run's output, a folder)", scale=3)
        fmt = gr.Dropdown(EXPORT_FORMATS, value="hf", label="format")
        quant = gr.Dropdown(GGUF_TYPES, value="", label="type (gguf)")
    export = gr.Button("Export", variant="primary")
    picker, launch = _job_panel(ui, demo, "export", "export")

    @user_errors
    def on_export(source: str, how: str, gguf_type: str) -> Any:
        if not source:
            raise GymError("Pick the model to export.")
        key = "output_dir" if (Path(source) / "gym_manifest.json").is_file() else "model_name_or_path"
        args = ["export", "{config}", "--export_dir", "{job}/export", "--format", how]
        if gguf_type:
            args += ["--type", gguf_type]
        return launch(ui.store.create("export", f"{how} of {Path(source).name}", args, config={key: source},
                                      output="{job}/export"))

    export.click(on_export, [model, fmt, quant], picker)
    demo.load(lambda: gr.update(choices=ui.outputs()), None, model)


def build_evaluate(ui: UI, demo: gr.Blocks) -> None:
    with gr.Row():
        model = gr.Dropdown([forms.EMBEDDED_MODEL], value=forms.EMBEDDED_MODEL, allow_custom_value=True,
                            label="model", scale=3, elem_id="eval-model")
        tasks = gr.Dropdown(EVAL_TASKS, value=["mc_demo"], multiselect=True, allow_custom_value=True,
                            label="tasks", info="also mc:<data>, ppl:<data>, gen:<data>, lm_eval:<task>", scale=3)
        n_shot = gr.Number(0, label="n_shot", precision=0)
        limit = gr.Number(20, label="limit (per subject)", precision=0, elem_id="eval-limit")
    evaluate = gr.Button("Evaluate", variant="primary", elem_id="eval-start")
    picker, launch = _job_panel(ui, demo, "eval", "evaluation")

    @user_errors
    def on_evaluate(source: str, names: list[str], shots: float | None, most: float | None) -> Any:
        if not (source and names):
            raise GymError("Pick a model and at least one task.")
        key = "output_dir" if (Path(source) / "gym_manifest.json").is_file() else "model_name_or_path"
        args = ["eval", "{config}", *[a for name in names for a in ("--task", name)], "--n_shot", str(int(shots or 0)),
                "-o", "{job}/results.json"]
        if most:
            args += ["--limit", str(int(most))]
        return launch(ui.store.create("eval", f"{', '.join(names)} on {Path(source).name}", args,
                                      config={key: source}, output="{job}/results.json"))

    evaluate.click(on_evaluate, [model, tasks, n_shot, limit], picker)
    demo.load(lambda: gr.update(choices=[forms.EMBEDDED_MODEL, *ui.outputs()]), None, model)
