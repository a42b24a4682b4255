"""The service below the HTTP door: keys, files and fine-tuning jobs (docs/service_jobs_draft.md)."""
