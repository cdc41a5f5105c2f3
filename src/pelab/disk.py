"""A write the disk refused (full, read-only, forbidden), wherever it surfaces: `disk_error` finds it in an
exception's chain (torch.save reports a full disk as a RuntimeError whose context is the OSError), `naming` gives it
the file that was being written (a write into an open file raises an OSError without one). The one-line report is
`pelab.tasks.preflight.os_error_line`."""

from __future__ import annotations

import errno
from pathlib import Path

DISK_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT)


def disk_error(err: BaseException | None) -> OSError | None:
    """The full disk / read-only or forbidden place anywhere in `err`'s chain, else None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in DISK_ERRNOS:
            return err
        err = err.__cause__ or err.__context__
    return None


def naming(err: OSError, path: str | Path) -> OSError:
    """`err` as an error of the file `path`, unless it names one already."""
    return type(err)(err.errno, err.strerror, err.filename or str(path))
