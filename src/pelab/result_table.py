"""The result table a run ends with (printed, and kept in its log): what it trained for and what it measured, read
from its summary.json (pelab.summary) in at most 80 columns."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from pelab.metric_keys import metric_key, parse_key
from pelab.summary import as_float, retrieval_acquired

# the metrics the table shows, per (variant, length) and (variant, kind, length)
TEXT_STATS = ("ppl", "ppl_lo", "ppl_hi", "ppl_ratio", "ppl_ratio_lo", "ppl_ratio_hi", "ppl_sliding", "ppl_sliding_lo",
              "ppl_sliding_hi")
PROBE_STATS = ("acc", "acc_lo", "acc_hi", "n")


def _num(x: Any, fmt: str = ".2f") -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(x) else format(x, fmt)


def _probe_counts(summary: dict, variant: str) -> dict[tuple[str, int], str]:
    """(kind, length) -> the instances scored, from the evaluation's probe rows: `40x5` when the same 40
    instances were asked at 5 depths (the instances are the independent unit of the interval), else the count."""
    ev = summary.get(f"evaluation/{variant}" if variant else "evaluation") or {}
    cells: dict[tuple[str, int], list[int]] = {}
    probes = ev.get("probes") or {}
    for row in (probes.get("rows") or []) + (probes.get("offset") or []):
        if isinstance(row.get("n"), (int, float)):
            cells.setdefault((str(row["kind"]), int(row["length"])), []).append(int(row["n"]))
    return {key: (f"{n[0]}x{len(n)}" if len(n) > 1 and len(set(n)) == 1 else str(sum(n))) for key, n in cells.items()}


def _retrieval_lines(summary: dict, m: dict) -> list[str]:
    """Whether retrieval was learned in-window: the criterion's verdict when the run trained to one, else a
    warning per probe kind whose in-window accuracy is not above copying a random value of the context (its
    numbers beyond the window then measure nothing learned)."""
    if (acquired := retrieval_acquired(m)) is not None:
        steps, acc = as_float(m.get("train/steps_to_criterion")), as_float(m["train/retrieval_acc"])
        if acquired:
            return [f"  retrieval criterion met at step {steps:.0f} (in-window accuracy {acc:.3f})"]
        cfg = summary.get("config") or {}
        cap = (cfg.get("trainer") or {}).get("max_steps")
        threshold = ((cfg.get("callbacks") or {}).get("retrieval_criterion") or {}).get("threshold")
        return [(f"  retrieval NOT acquired: the in-window criterion ({threshold}) was not reached by the cap "
                 f"(step {cap}; last in-window accuracy {acc:.3f})")]
    probes = (summary.get("evaluation") or {}).get("probes") or {}
    L, out = probes.get("train_length"), []
    for kind, copy in (probes.get("copy") or {}).items():
        hi = m.get(metric_key(f"probe/{kind}/acc", L, "hi"))
        if hi is not None and math.isfinite(as_float(copy)) and as_float(hi) <= as_float(copy):
            out.append(f"  {kind}: in-window accuracy is not above copying a random context value "
                       f"({as_float(copy):.3f}): retrieval was not learned (recall rows train it: "
                       "data.recall_mix, experiment=recall)")
    return out


def _interval(values: dict, lo: str, hi: str, width: int = 0) -> str:
    """`[lo, hi]` of two entries of `values` ('' when either is missing or not a number)."""
    a, b = _num(values.get(lo)), _num(values.get(hi))
    text = "" if "n/a" in (a, b) else f"[{a}, {b}]"
    return f"{text:<{width}}" if width else text


def result_table(summary: dict) -> str:
    """The few lines a run ends with, at most 80 columns, leading with what the run trained for: retrieval (the
    criterion's verdict and the probes: accuracy per kind and length with its interval and n) first when the run
    trained on recall rows, the text perplexity (val/ppl, then ppl and ratio at each evaluated length with their
    intervals) first otherwise and never for a run that saw no text; the run folder and how to view / upload the
    W&B run. Read from the summary's metrics, whatever their variants."""
    m = summary.get("metrics") or {}
    cfg = summary.get("config") or {}
    mix = float(((cfg.get("data") or {}).get("recall_mix")) or 0.0)
    step = summary.get("global_step")
    lines = [f"Result of {summary.get('name') or 'the run'} ({summary.get('status')}"
             + (f", step {step}" if step is not None else "") + f", {summary.get('wall_seconds', 0):.0f} s)"]
    if parent := summary.get("extended_from"):
        lines.append(f"  extended from {parent.get('name')} (step {parent.get('step')}, trained at "
                     f"L={parent.get('train_length')})")
    extrap: dict[tuple[str, int], dict[str, Any]] = {}
    probes: dict[tuple[str, str, int], dict[str, Any]] = {}
    for key, value in m.items():
        k = parse_key(key)
        if k is None or k.length is None or k.layer is not None:
            continue
        if k.family == "extrap" and k.stat_name in TEXT_STATS:
            extrap.setdefault((k.variant, k.length), {})[k.stat_name] = value
        elif k.family == "probe" and k.stat_name in PROBE_STATS:
            probes.setdefault((k.variant, k.kind, k.length), {})[k.stat_name] = value
    text = _text_lines(summary, m, extrap) if mix < 1.0 else [
        "  text: not measured (data.recall_mix=1: the model was trained on recall rows only)"]
    # sentences folded to the table's 80 columns
    retrieval = [w for line in _retrieval_lines(summary, m)
                 for w in textwrap.wrap(line.strip(), 80, initial_indent="  ", subsequent_indent="    ")]
    retrieval += _probe_lines(summary, probes) + _effective_length_lines(summary, m)
    lines += (retrieval + text) if mix > 0 else (text + retrieval)
    lines.append(f"  run folder: {summary.get('output_dir')}")
    w = summary.get("wandb") or {}
    if w.get("mode") == "offline" and w.get("dir"):
        # every launch of a resumed run is one offline folder of the same run id: upload them all
        lines.append(f"  W&B (offline): wandb leet {w['dir']}")
        lines.append(f"  upload: wandb sync {Path(w['dir']).parent}/offline-run-*")
    elif w.get("url"):
        lines.append(f"  W&B: {w['url']}")
    return "\n".join(lines)


def _text_lines(summary: dict, m: dict, extrap: dict) -> list[str]:
    lines = []
    if "val/ppl" in m:
        lines.append(f"  val/ppl {_num(m['val/ppl'])}" + (f" {_interval(m, 'val/ppl_lo', 'val/ppl_hi')}"
                                                          if "val/ppl_lo" in m else "")
                     + (f"  (val/loss {_num(m['val/loss'], '.4f')})" if "val/loss" in m else ""))
    if not extrap:
        return lines
    named = any(v for v, _ in extrap)
    ex = (summary.get("evaluation") or {}).get("extrapolation") or {}
    if ex.get("blocks"):
        lines.append(f"  text, {ex.get('split')} split: {ex['blocks']} blocks of {max(ex.get('lengths') or [0])} "
                     "tokens, [95% interval]")
    lines.append("  " + ("scaling      " if named else "") + "length       ppl [95% interval]        ratio"
                 " [95% interval]   sliding")
    for (variant, length), s in sorted(extrap.items()):
        ppl = f"{_num(s.get('ppl')):>9} {_interval(s, 'ppl_lo', 'ppl_hi', 18)}"
        ratio = f"{_num(s.get('ppl_ratio')):>6} {_interval(s, 'ppl_ratio_lo', 'ppl_ratio_hi', 14)}"
        lines.append("  " + (f"{variant or '-':<12} " if named else "") + f"{length:>6} {ppl} {ratio}"
                     f" {_num(s.get('ppl_sliding')):>9}")
    return lines


def _probe_lines(summary: dict, probes: dict) -> list[str]:
    if not probes:
        return []
    named = any(v for v, _, _ in probes)
    counts = {v: _probe_counts(summary, v) for v, _, _ in probes}
    width = max(12, *(len(kind) for _, kind, _ in probes))  # the RULER kinds' names are longer than 12
    lines = ["  " + ("scaling      " if named else "")
             + f"{'probe':<{width}} length   acc   interval          n (x depths)"]
    for (variant, kind, length), s in sorted(probes.items()):
        interval = (f"[{_num(s['acc_lo'])}, {_num(s['acc_hi'])}]" if "acc_lo" in s and "acc_hi" in s else "")
        n = _num(s["n"], ".0f") if "n" in s else counts[variant].get((kind, length), "?")
        lines.append("  " + (f"{variant or '-':<12} " if named else "") + f"{kind:<{width}} {length:>6} "
                     f"{_num(s.get('acc')):>5}   {interval:<16} {n}")
    return lines


def _effective_length_lines(summary: dict, m: dict) -> list[str]:
    """Per probe kind its effective length (pelab.evaluation.effective_length) and the threshold its lower bounds
    met; "n/a" where the kind was not acquired in-window (0) or not measured (NaN). Nothing for a run that recorded
    none."""
    found = sorted((k.variant, k.kind, as_float(v)) for key, v in m.items()
                   if (k := parse_key(key)) is not None and k.family == "probe" and k.length is None
                   and k.stat_name == "eff_length")
    if not found:
        return []
    rule = ((summary.get("config") or {}).get("probes") or {}).get("effective_length") or {}
    how = (f"max({_num(rule['floor'])}, {_num(rule['fraction'])} x in-window accuracy)"
           if {"floor", "fraction"} <= set(rule) else "the threshold")
    lines = textwrap.wrap(f"effective length: the longest probed length up to which the accuracy's 95% Wilson lower "
                          f"bound (n = the instances) is >= {how}", 80, initial_indent="  ", subsequent_indent="  ")
    width = max(12, *(len(kind) for _, kind, _ in found))
    for variant, kind, eff in found:
        threshold = as_float(m.get("/".join(x for x in ("probe", variant, kind, "eff_threshold") if x)))
        text = (f"{eff:>6.0f}   (threshold {_num(threshold)})" if math.isfinite(eff) and eff > 0
                else "   n/a   (not acquired in-window)" if eff == 0 else "   n/a   (not measured)")
        lines.append("  " + (f"{variant or '-':<12} " if variant else "") + f"{kind:<{width}} {text}")
    return lines
