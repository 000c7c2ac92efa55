"""Two runs folders side by side: which ``results.json`` numbers and claim verdicts differ.

After a change to shared code (CONTRIBUTING.md, "Before committing") run the same profile and
seeds before and after, then ``agentrl compare RUNS_BEFORE RUNS_AFTER``: per notebook, the
metrics and claim fields that changed beyond a relative tolerance (timings excluded: they measure
the machine) and every claim whose ``holds`` flipped. A refactor should print "identical".
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

TIMING_WORDS = ("wall", "time", "seconds", "timing", "overhead", "ms")
"""words of a metric name (split at '/', '_', '-', '@', '.', ' ') that mark a wall-clock measurement"""


def is_timing(key: str) -> bool:
    """A wall-clock measurement, left out of the comparison: a path segment ending in '_s' or ' s'
    (a duration in seconds; a table column 'wall s') or holding one of ``TIMING_WORDS`` as a whole
    word. ``final_success`` or ``zero_variance_share`` are not timings (a substring rule once took
    them for '_s').

    >>> [is_timing(k) for k in ("metrics/wall_s", "metrics/lm/timing/adv_grpo_s",
    ...                         "metrics/time/step_s", "metrics/final_success",
    ...                         "metrics/zero_variance_share", "claims/c/statement",
    ...                         "metrics/timesteps", "metrics/ms_per_token", "metrics/t/1/wall s")]
    [True, True, True, False, False, False, False, True, True]
    """
    for seg in key.lower().split("/"):
        words = re.split(r"[_\-@. ]+", seg)
        if re.search(r"[_ ]s$", seg) or any(w in TIMING_WORDS for w in words):
            return True
    return False


def flatten(obj, prefix: str = "") -> dict:
    """Nested dicts (and lists of non-numbers) as {'a/b/0/c': leaf}; a list of numbers is a leaf.

    >>> flatten({"a": {"b": [1, 2]}, "c": [{"d": 3}]})
    {'a/b': [1, 2], 'c/0/d': 3}
    """
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in flatten(val, f"{prefix}{key}/").items()}
    if isinstance(obj, list) and not all(isinstance(x, (int, float)) or x is None for x in obj):
        return {k: v for i, val in enumerate(obj) for k, v in flatten(val, f"{prefix}{i}/").items()}
    return {prefix.rstrip("/"): obj}


def same(a, b, rtol: float) -> bool:
    """Equal, floats within ``rtol`` of the larger magnitude (at least 1), NaN equal to NaN."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, rtol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        if not all(isinstance(x, (int, float)) for x in (a, b)):
            return False
        if math.isnan(a) and math.isnan(b):
            return True
        return abs(a - b) <= rtol * max(1.0, abs(a), abs(b))
    return a == b


def _numbers(path: Path) -> tuple[dict, dict]:
    from agentrl_lib.pipeline.notebooks import PipelineError

    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PipelineError(f"{path}: not readable JSON ({type(e).__name__}: {e})") from None
    claims = data.get("claims", []) if isinstance(data, dict) else None
    if not isinstance(claims, list) or not all(isinstance(c, dict) and "id" in c for c in claims):
        raise PipelineError(f"{path}: not a results.json (a mapping whose claims are a list of "
                            f"mappings with an id)")
    claims = {c["id"]: c for c in data.get("claims", [])}
    flat = flatten({"metrics": data.get("metrics", {}), "claims": claims})
    return {k: v for k, v in flat.items() if not is_timing(k)}, claims


def compare(before: Path, after: Path, rtol: float = 1e-9) -> dict:
    """{run folder (profile/notebook/seed): {"missing": bool, "diffs": [(key, before, after)],
    "flips": [(claim id, holds before, holds after)]}} over the runs of ``before``."""
    out = {}
    for rb in sorted(Path(before).glob("**/results.json")):
        rel = rb.parent.relative_to(before)
        if any(part.startswith(".") for part in rel.parts):
            continue  # a run in progress, or a failed re-run kept aside (pipeline/run.py)
        ra = Path(after) / rel / "results.json"
        if not ra.is_file():
            out[str(rel)] = {"missing": True, "diffs": [], "flips": []}
            continue
        (fb, cb), (fa, ca) = _numbers(rb), _numbers(ra)
        diffs = [(k, fb.get(k), fa.get(k)) for k in sorted(set(fb) | set(fa))
                 if k not in fb or k not in fa or not same(fb[k], fa[k], rtol)]
        flips = [(c, cb.get(c, {}).get("holds"), ca.get(c, {}).get("holds"))
                 for c in sorted(set(cb) | set(ca))
                 if cb.get(c, {}).get("holds") != ca.get(c, {}).get("holds")]
        out[str(rel)] = {"missing": False, "diffs": diffs, "flips": flips}
    return out


def summary(result: dict, max_rows: int = 8) -> str:
    """One line per run folder (identical, missing, or how many numbers differ), the first
    ``max_rows`` differences under it, every flipped verdict, and a closing count."""
    lines, flips, n_same = [], 0, 0
    for run, r in result.items():
        if r["missing"]:
            lines.append(f"{run}: missing after")
            continue
        if not r["diffs"] and not r["flips"]:
            n_same += 1
            continue
        lines.append(f"{run}: {len(r['diffs'])} numbers differ")
        lines += [f"    {k}: {str(b)[:50]} -> {str(a)[:50]}" for k, b, a in r["diffs"][:max_rows]]
        lines += [f"    verdict {c}: holds {b} -> {a}" for c, b, a in r["flips"]]
        flips += len(r["flips"])
    lines.append(f"{n_same} of {len(result)} runs identical; {flips} claim verdicts flipped")
    return "\n".join(lines)
