"""Hydra's own failures as PELab's one `Error:` line: an override Hydra cannot parse or apply (a typo of a key,
a value with an unquoted space) and a folder or file Hydra cannot write (its run folder, `.hydra/`, its log) end
on Hydra's hint "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace." or on a traceback.

`one_line_hydra_errors()` holds the entry point's Hydra call (`python train.py`, `python eval.py`): Hydra reports
every failure of its run through `hydra._internal.utils.run_and_report`, which is wrapped for that call: the errors
above become one line (`hydra_error_line`), anything else goes to Hydra's own report unchanged.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic"


def hydra_error_line(err: BaseException, argv: list[str]) -> str | None:
    """The one line for a failure of Hydra's own (see the module doc), else None. `argv`: the command line's
    arguments, to show an override as it was typed."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    if isinstance(err, OverrideParseException):
        return parse_error_line(err.override, err.message, argv)
    if isinstance(err, ConfigCompositionException):
        return composition_error_line(err, argv)
    return hydra_disk_error_line(err)


def hydra_disk_error_line(err: BaseException) -> str | None:
    """A full disk or a read-only place while Hydra makes the run folder or writes `.hydra/` and its log (before
    the job starts): Hydra's writes into an open file name no file, and its config is reset by then, so the
    line names what was being written."""
    from pelab.disk import disk_error, naming
    from pelab.tasks.preflight import os_error_line

    found = disk_error(err)
    if found is not None and not found.filename:
        return os_error_line(naming(found, "Hydra's run folder (.hydra/, its log)"))
    return os_error_line(err)


def parse_error_line(override: str, message: str, argv: list[str]) -> str:
    """An override Hydra's grammar refuses. A bare word after a `key=value` is most often the rest of a value
    with a space the shell split off: the quoted form is shown."""
    if "=" not in override and override in argv and argv.index(override) > 0:
        before = argv[argv.index(override) - 1]
        if "=" in before:
            return (f"{override!r} is not an override (key=value): the shell split a value at a space; quote values "
                    f"with spaces as one argument: \"{before} {override}\".")
    cause = next((x for x in message.splitlines() if x and not x.startswith("See ")), message)
    return (f"the override {override!r} cannot be parsed ({cause}); quote values with spaces or special characters "
            f"(\"key=a value\"; grammar: {GRAMMAR}).")


def composition_error_line(err: Any, argv: list[str]) -> str:
    """An override Hydra parsed but cannot apply: a key no config has (with the known key one edit away, and the
    `+` that adds a key), or another refusal in Hydra's own words, on one line."""
    found = re.match(r"Could not override '([^']+)'", str(err))
    if not found:
        return " ".join(str(err).split())
    key = found.group(1)
    typed = next((a for a in argv if a.split("=", 1)[0] == key), key)
    cause = err.__cause__
    parent = getattr(cause, "parent_node", None)
    prefix = key.rpartition(".")[0]
    known = [f"{prefix}.{k}" if prefix else str(k) for k in (parent.keys() if parent is not None else [])]
    near = one_edit_away(key, known)
    hint = f" (did you mean {near}?)" if near else ""
    return (f"{typed}: no config has the key {key}{hint}; to add a key the configs do not have, write +{typed} "
            "(quote values with spaces: \"key=a value\").")


def one_edit_away(key: str, known: list[str]) -> str | None:
    """The known key one insertion, deletion, substitution or swap of neighbours away from `key` (a typo), if
    there is one."""
    return next((k for k in known if _one_edit(key, k)), None)


def _one_edit(a: str, b: str) -> bool:
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(a) == len(b) and len(diff) == 2 and diff[1] == diff[0] + 1:  # neighbours swapped: lenghts
        return a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
    if len(a) > len(b):
        a, b = b, a
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    return a[i + (len(a) == len(b)):] == b[i + 1:]


@contextlib.contextmanager
def one_line_hydra_errors() -> Iterator[None]:
    """Hydra's report of a failure wrapped for the body (see the module doc)."""
    import hydra._internal.utils as hydra_utils

    original = hydra_utils.run_and_report

    def reported(func: Any) -> Any:
        try:
            return func()
        except Exception as err:  # noqa: BLE001 - handed to Hydra's own report unless it is ours to word
            line = hydra_error_line(err, sys.argv[1:])
            if line is None:
                failure = err  # `err` is unbound after the except clause; the lambda may outlive it
                return original(lambda: _raise(failure))
            print(f"Error: {line}", file=sys.stderr, flush=True)
            sys.exit(1)

    hydra_utils.run_and_report = reported
    try:
        yield
    finally:
        hydra_utils.run_and_report = original


def _raise(err: BaseException) -> None:
    raise err
