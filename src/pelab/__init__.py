"""PELab: positional encodings in language models."""

from pathlib import Path

__version__ = "0.1.0"

# The Hydra configs ship inside the package (package data), so an installed wheel finds them too.
CONF_DIR = str(Path(__file__).resolve().parent / "conf")
