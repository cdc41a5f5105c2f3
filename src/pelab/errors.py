"""Every error pelab raises on purpose, in one place. A `UserError` carries a message for the user (printed as
one line, `Error: ...`, never a traceback) naming the setting to change; anything else (a bug, a library
failure) keeps its traceback. The bottom layer: imports nothing, defines nothing but exceptions, warnings and
`is_user_error`. The typing / range-check helpers of the config schemas are `pelab.checks`."""

from __future__ import annotations


class UserError(Exception):
    """Base of the errors whose message names the setting to change (shown as one `Error:` line)."""


class ConfigError(UserError, ValueError):
    """A setting that cannot work; the message names the key to change and how."""


class DirtyTreeError(ConfigError):
    """A study run from a git tree with uncommitted changes to tracked files (provenance.allow_dirty=false)."""


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read or does not belong to this run's model/tokenizer."""


class OutOfMemory(UserError, ValueError):
    """An allocation that failed during training: the settings to lower and the checkpoint to resume from."""


class NonFiniteError(UserError, RuntimeError):
    """A non-finite loss or gradient under optim.nonfinite=stop (or more than optim.max_skips skipped)."""


class CorpusError(UserError, ValueError):
    """Bad data settings (missing folder, no files, unknown field, ...)."""


class CorpusUnavailable(CorpusError):
    """A remote corpus cannot be fetched (offline, unknown name, ...)."""


class TokenizerError(UserError, ValueError):
    """Bad tokenizer settings or an unavailable hub tokenizer."""


class CacheDirError(UserError, ValueError):
    """The cache folder cannot be created or written."""


class RecallLengthError(UserError, ValueError):
    """The requested length cannot hold one recall instance."""


class PositionOutOfRange(UserError, ValueError):
    """A position the encoding cannot represent (e.g. past the end of a learned table)."""


class ReportError(UserError, ValueError):
    """Nothing to report (no summary.json under the given folders)."""


class DashboardError(UserError, ValueError):
    """A setting or a missing optional package; the message says what to do."""


class CorpusWarning(UserWarning):
    """Some files of a text folder were skipped (binary) or not fully decodable."""


class CacheRebuildWarning(UserWarning):
    """A cached entry was truncated or inconsistent and is being rebuilt."""


def is_user_error(err: BaseException) -> bool:
    """Errors pelab raises on purpose with a message naming the setting to change: print them as one line."""
    return isinstance(err, UserError)
