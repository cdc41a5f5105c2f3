"""PELab: positional encodings in language models."""

from importlib.resources import files
from pathlib import Path

__version__ = "0.1.0"


def _conf_dir() -> str:
    """The folder of the Hydra configs, the package `pelab.conf` (see [tool.setuptools] in pyproject.toml):
    the checkout's top-level conf/ in an editable install, site-packages/pelab/conf/ from a wheel."""
    try:
        conf = files("pelab.conf")
    except ModuleNotFoundError as e:
        if e.name != "pelab.conf":
            raise
        # A checkout used without installing it (its src/ on PYTHONPATH: a study's pinned worktree run by
        # experiments/pinned.sh, a rerun by experiments/provenance/verify.py, the GPU machine's gpu_check.sh):
        # only an install maps pelab.conf to conf/, which sits next to src/.
        conf = Path(__file__).resolve().parents[2] / "conf"
    if not isinstance(conf, Path) or not (conf / "train.yaml").is_file():
        # e.g. a src/pelab/conf/ folder left over in a checkout (from before the configs moved to conf/):
        # Python finds it before the editable install's conf/ and imports it as an empty namespace package
        raise ImportError(
            f"pelab's Hydra configs are not where pelab.conf resolves ({conf}): no train.yaml there. "
            "In a checkout, the configs live in the top-level conf/; remove any src/pelab/conf/ folder."
        )
    return str(conf.resolve())


# The Hydra configs ship as the package pelab.conf, so an installed wheel finds them too.
CONF_DIR = _conf_dir()
