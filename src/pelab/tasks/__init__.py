"""The command-line tasks: `pelab.tasks.train` (`python train.py`, `pelab-train`) and `pelab.tasks.evaluate`
(`python eval.py`, `pelab-eval`). Both run inside `pelab.tasks.task.run_task`; the job's parts they
assemble live in `pelab.runs` and `pelab.training`; their configs in `pelab.CONF_DIR`."""
