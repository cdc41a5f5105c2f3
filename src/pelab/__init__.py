"""PELab: positional encodings in language models."""
__version__ = "0.1.0"
