"""The service behind `gym api --variants STORE`: a database (db), API keys and tenants (keys), uploaded files
(files). The HTTP routes in gym.serve only translate requests into calls here; `gym keys` is its CLI door."""
