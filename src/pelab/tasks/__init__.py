"""The command-line tasks: `pelab.tasks.train` (`python train.py`, `pelab-train`) and `pelab.tasks.evaluate`
(`python eval.py`, `pelab-eval`). Both run inside `pelab.tasks.task.run_task`; the Lightning parts they
assemble live in `pelab.harness`."""

from pathlib import Path

# The Hydra configs ship inside the package (package data), so an installed wheel finds them too.
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
