"""`gym webui`: the browser door. A thin client of the CLI: every job is a `gym <verb>` subprocess with a YAML a
user could run; its state lives on disk (gym.webui.jobs). Needs `pip install 'zoo-gym[webui]'` (Gradio)."""
