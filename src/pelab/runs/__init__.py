"""One training job's life around the fit: its parts built from the config (`build`), the job itself (`training`:
data, model, fit, evaluation), the run folder and its lock (`folder`), W&B and the CSV log (`loggers`), the checks
before any cost (`memory`, `eval_cost`) and the CPU threads it takes (`threads`). The task layer (`pelab.tasks`)
composes, validates and keeps the record; it calls `training.run_training` once."""
