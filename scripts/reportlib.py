"""Helpers the reproduction reports share (scripts/reproduce_report.py, scripts/dial_report.py).
Standard library only."""
import json
import math
import statistics as st


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def finite(xs):
    return [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]


def mean_sd(xs, fmt="{:.3f}"):
    xs = finite(xs)
    if not xs:
        return "–"
    if len(xs) == 1:
        return fmt.format(xs[0]) + " (n=1)"
    return (fmt + " ± " + fmt).format(st.mean(xs), st.stdev(xs))


def diff(a, b):
    a, b = finite(a), finite(b)
    if len(a) < 2 or len(b) < 2:
        return None
    return st.mean(a) - st.mean(b), math.sqrt(st.variance(a) / len(a) + st.variance(b) / len(b))


def verdict(d, se, pos="held", neg="contradicted"):
    if d > 2 * se:
        return pos
    if d < -2 * se:
        return neg
    return "not distinguishable (|difference| ≤ 2 SE)"
