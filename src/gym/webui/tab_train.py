"""The Train tab: the form (from the config dataclasses and the method registry), a preview of the rows as
training sees them (with their images), the memory/time estimate, Start / Stop / Resume, and the live view of any
run (status, progress, curves, console), several runs on one chart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from gym.core.errors import GymError
from gym.data.registry import read_dataset_info
from gym.webui import curves, estimate, forms
from gym.webui.common import UI, choices, job_status, user_errors
from gym.webui.jobs import CONFIG_NAME
from gym.webui.preview import preview_rows

NUMBER_KEYS = {"learning_rate": 5e-5, "num_train_epochs": 3.0, "max_steps": -1, "per_device_train_batch_size": 4,
               "gradient_accumulation_steps": 1, "cutoff_len": 1024, "lora_rank": 8, "logging_steps": 1,
               "save_steps": 500, "max_samples": None}
PLACEHOLDER_OUTPUT = "saves/webui/<job>/output"
COLORS = {"prompt": "#5a5a5a", "trained": "#ffffff", "chosen": "#d0d0d0", "rejected": "#7a7a7a",
          "desirable": "#d0d0d0", "undesirable": "#7a7a7a", "answer": "#9a9a9a"}


def dataset_names(dataset_dir: str) -> list[str]:
    try:
        return sorted(read_dataset_info(dataset_dir))
    except GymError:
        return []


def _plot(rows: list[dict[str, Any]], title: str) -> Any:
    frame = pd.DataFrame(rows or [], columns=["step", "value", "run"])
    return gr.update(value=frame, visible=bool(rows), title=title)


@dataclass
class Form:
    """The form's components; `inputs` in the order `form_of` reads them."""

    model: Any
    stage: Any
    template: Any
    dataset_dir: Any
    dataset: Any
    cutoff_len: Any
    options: Any
    inputs: list[Any]


def form_of(values: tuple[Any, ...]) -> tuple[dict[str, Any], str, str]:
    """The form's values -> (the keys it sets, the stage's options YAML, the "more keys" YAML)."""
    keys = ["model_name_or_path", "stage", "finetuning_type", "template", "dataset_dir", "dataset", *NUMBER_KEYS]
    form = dict(zip(keys, values[: len(keys)]))
    if form.get("max_steps") == -1:
        form["max_steps"] = None
    if not form.get("max_samples"):  # 0 or blank: every row
        form["max_samples"] = None
    return form, values[-2], values[-1]


def _form(ui: UI) -> Form:
    with gr.Row():
        model = gr.Dropdown(forms.local_models([ui.store.root]), value=forms.EMBEDDED_MODEL, label="model",
                            allow_custom_value=True, scale=3, elem_id="train-model",
                            info="the embedded default, a local folder (earlier runs are listed) or a hub id")
        stage = gr.Dropdown(forms.stages(), value="sft", label="stage", scale=2)
        finetuning_type = gr.Dropdown(forms.finetuning_types(), value="lora", label="finetuning_type")
        template = gr.Textbox(label="template", placeholder="auto: the model's own chat template")
    with gr.Row():
        dataset_dir = gr.Textbox(ui.dataset_dir, label="dataset_dir", info="the folder of dataset_info.json",
                                 elem_id="train-dataset_dir")
        dataset = gr.Dropdown(dataset_names(ui.dataset_dir), multiselect=True, label="dataset", scale=3,
                              allow_custom_value=True, info="names from dataset_info.json, or files",
                              elem_id="train-dataset")
    with gr.Row():
        numbers = {key: gr.Number(value, label=key, elem_id=f"train-{key}") for key, value in NUMBER_KEYS.items()}
    with gr.Accordion("Method options (the stage's own keys, with their help and defaults)", open=False):
        options = gr.Code(forms.stage_options_yaml("sft"), language="yaml", label="options", interactive=True)
    with gr.Accordion("More keys, and every key with its help", open=False):
        more = gr.Code("", language="yaml", label="more keys (YAML), e.g. lora_target: all", interactive=True)
        gr.Dataframe(forms.key_catalogue(), headers=["key", "section", "type", "default", "help"],
                     interactive=False, max_height=360, wrap=True, label="every key gym train accepts")
    stage.change(forms.stage_options_yaml, stage, options)
    dataset_dir.change(lambda d: gr.update(choices=dataset_names(d)), dataset_dir, dataset)
    return Form(model, stage, template, dataset_dir, dataset, numbers["cutoff_len"], options,
                [model, stage, finetuning_type, template, dataset_dir, dataset, *numbers.values(), options, more])


def _live_view(ui: UI, demo: gr.Blocks) -> tuple[Any, Any, Callable[[str | None], list[Any]]]:
    """The run picker, the runs to compare, and the run's status, progress, curves, console and YAML, refreshed
    every 2 s from disk; returns the two pickers and the function that refreshes their choices."""
    with gr.Row():
        run = gr.Dropdown([], label="run", scale=2, elem_id="train-run")
        compare = gr.Dropdown([], multiselect=True, label="compare with", scale=2)
    status = gr.Markdown(elem_id="train-status")
    progress = gr.Slider(0, 1, value=0, label="progress (steps)", interactive=False, elem_id="train-progress")
    with gr.Row():
        plots = [gr.LinePlot(x="step", y="value", color="run", title=chart, visible=False, elem_id=f"plot-{chart}")
                 for chart in curves.CHARTS]
    console = gr.Textbox(label="console", lines=12, max_lines=12, autoscroll=True, elem_id="train-console")
    with gr.Accordion("The YAML this run is (run it yourself: gym train config.yaml)", open=False):
        yaml_box = gr.Code(language="yaml", label="config.yaml", interactive=False)
        download = gr.DownloadButton("Download config.yaml", visible=False)

    def view(run_id: str | None, compare_ids: list[str] | None) -> list[Any]:
        job = ui.store.get(run_id) if run_id else None
        shown = {job.id: job.output} if job is not None and job.output else {}
        for other in compare_ids or []:
            if other != run_id:
                shown[other] = ui.store.get(other).output or ""
        step, total = curves.progress(job.output if job else None)
        config = job.folder / CONFIG_NAME if job else None
        has_config = config is not None and config.is_file()
        return [
            job_status(job) + (f"\n\nstep **{step}** of {total}" if total else ""),
            gr.update(value=step, maximum=max(total, 1)),
            *[_plot(curves.points(shown, chart), chart) for chart in curves.CHARTS],
            job.console() if job else "",
            config.read_text(encoding="utf-8") if has_config and config else "",
            gr.update(value=str(config) if has_config else None, visible=has_config),
        ]

    def pickers(selected: str | None = None) -> list[Any]:
        jobs = ui.store.list("train")
        if selected is None and jobs:
            running = [j for j in jobs if j.running]
            selected = (running or jobs)[0].id
        return [gr.update(choices=choices(jobs), value=selected), gr.update(choices=choices(jobs))]

    outputs = [status, progress, *plots, console, yaml_box, download]
    run.change(view, [run, compare], outputs)
    compare.change(view, [run, compare], outputs)
    gr.Timer(2.0).tick(view, [run, compare], outputs, show_progress="hidden")
    # A reload (or a second tab) finds the runs on disk and shows the running one.
    demo.load(lambda: pickers(), None, [run, compare])
    return run, compare, pickers


def build(ui: UI, demo: gr.Blocks) -> None:
    form = _form(ui)
    with gr.Accordion("Preview: the first rows as this stage trains on them", open=False):
        preview_button = gr.Button("Preview rows")
        preview = gr.HighlightedText(label="rendered by the chat format; marked: what the loss is on",
                                     color_map=COLORS, combine_adjacent=False, show_legend=True)
        gallery = gr.Gallery(label="the rows' images", columns=6, height=220, object_fit="contain", visible=False,
                             elem_id="train-preview-images")
    with gr.Row():
        estimate_button = gr.Button("Estimate (formula)")
        measure_button = gr.Button("Measure (3-step dry run)")
        start = gr.Button("Start", variant="primary", elem_id="train-start")
        stop = gr.Button("Stop", variant="stop", elem_id="train-stop")
        resume = gr.Button("Resume", elem_id="train-resume")
    estimate_box = gr.Markdown()
    run, compare, pickers = _live_view(ui, demo)

    @user_errors
    def on_start(*values: Any) -> list[Any]:
        form, options_yaml, more_yaml = form_of(values)
        config = forms.train_config(form, options_yaml, more_yaml, PLACEHOLDER_OUTPUT)
        title = f"{config.get('stage', 'sft')} {Path(str(config.get('model_name_or_path', ''))).name}"
        job = ui.store.create("train", title, ["train", "{config}"], output="{job}/output")
        config["output_dir"] = job.output
        ui.store.write_config(job, config)
        ui.store.start(job)
        return pickers(job.id)

    @user_errors
    def on_stop(run_id: str | None) -> str:
        if not run_id:
            raise GymError("Pick a run to stop.")
        ui.store.stop(ui.store.get(run_id))
        return "Stop sent (SIGINT): the run saves a checkpoint after its current step; Resume continues from it."

    @user_errors
    def on_resume(run_id: str | None) -> list[Any]:
        if not run_id:
            raise GymError("Pick a run to resume.")
        job = ui.store.restart(ui.store.get(run_id), ["resume_from_checkpoint=true"])
        return pickers(job.id)

    @user_errors
    def on_estimate(*values: Any) -> str:
        form, options_yaml, more_yaml = form_of(values)
        return estimate.formula(forms.train_config(form, options_yaml, more_yaml, PLACEHOLDER_OUTPUT)).table()

    @user_errors
    def on_measure(*values: Any) -> str:
        form, options_yaml, more_yaml = form_of(values)
        config = forms.train_config(form, options_yaml, more_yaml, PLACEHOLDER_OUTPUT)
        job = ui.store.create("estimate", "dry run", ["train", "{config}"], output="{job}/output")
        ui.store.write_config(job, {**config, **estimate.dry_run_overrides(job.output or "")})
        ui.store.start(job)
        code = ui.store.wait(job, timeout=900)
        if code != 0:
            raise GymError(f"The dry run ended with status {code}: {job.console(3)}")
        return estimate.measured(job.output or "", job.console(400)).table()

    @user_errors
    def on_preview(model_name: str, stage_name: str, template_name: str, folder: str, names: list[str],
                   cutoff: float | None) -> tuple[list[tuple[str, str | None]], Any]:
        if not names:
            raise GymError("Pick a dataset to preview.")
        shown = preview_rows(model_name, ",".join(names), folder, stage_name, template_name or None,
                             int(cutoff or 1024))
        return shown.segments, gr.update(value=shown.images or None, visible=bool(shown.images))

    start.click(on_start, form.inputs, [run, compare])
    stop.click(on_stop, run, estimate_box)
    resume.click(on_resume, run, [run, compare])
    estimate_button.click(on_estimate, form.inputs, estimate_box)
    measure_button.click(on_measure, form.inputs, estimate_box)
    preview_button.click(on_preview, [form.model, form.stage, form.template, form.dataset_dir, form.dataset,
                                      form.cutoff_len], [preview, gallery])
    demo.load(lambda: gr.update(choices=forms.local_models([ui.store.root])), None, form.model)
