"""Helpers the reproduction reports share (scripts/reproduce_report.py, scripts/dial_report.py,
scripts/ablation_report.py, scripts/async_report.py). Standard library only."""
import json
import math
import os
import random
import statistics as st


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def metrics(d):
    """A run's metrics.jsonl rows (d/metrics.jsonl) in file order, an unreadable line left out; [] without
    the file."""
    rows = []
    try:
        with open(os.path.join(d, "metrics.jsonl")) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return rows


def avg_at_k(d):
    """A run's avg@k (d/eval.json), or None."""
    ev = load(os.path.join(d, "eval.json"))
    return ev["avg_at_k"] if ev else None


def reach(rows, level):
    """Learning speed: the step of the first of the rows with a reward/mean whose trailing 10-row mean reward
    reaches level, or None."""
    rewards = [(r["step"], r["reward/mean"]) for r in rows if isinstance(r.get("reward/mean"), (int, float))]
    for i in range(9, len(rewards)):
        if st.mean(x for _, x in rewards[i - 9:i + 1]) >= level:
            return rewards[i][0]
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


def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    rk = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for t in range(i, j + 1):
            rk[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return rk


def spearman(xs, ys):
    pairs = [(x, y) for x, y in zip(xs, ys) if isinstance(x, (int, float)) and isinstance(y, (int, float))
             and math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 3:
        return None, len(pairs)
    rx, ry = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    mx, my = st.mean(rx), st.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return (num / den if den else None), len(pairs)


def spearman_ci(xs, ys, level=0.95, resamples=2000, seed=1):
    """Percentile bootstrap interval of spearman(xs, ys) over resampled pairs (a fixed seed, so a report repeats)."""
    pairs = list(zip(xs, ys))
    rng = random.Random(seed)
    rhos = []
    for _ in range(resamples):
        b = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        r, _ = spearman([p[0] for p in b], [p[1] for p in b])
        if r is not None:
            rhos.append(r)
    if not rhos:
        return None, None
    rhos.sort()
    return rhos[int((1 - level) / 2 * len(rhos))], rhos[min(len(rhos) - 1, int((1 + level) / 2 * len(rhos)))]


def read_jobs(out):
    """The jobs of a dial-shaped sweep (jobs.tsv: dial, layout, arm, seed), with its dial settings, layouts,
    arms in order of appearance and sorted seeds."""
    jobs = []
    for line in open(os.path.join(out, "jobs.tsv")):
        dial, layout, arm, seed = line.rstrip("\n").split("\t")
        jobs.append((dial, layout, arm, int(seed)))
    return (jobs, list(dict.fromkeys(j[0] for j in jobs)), list(dict.fromkeys(j[1] for j in jobs)),
            list(dict.fromkeys(j[2] for j in jobs)), sorted({j[3] for j in jobs}))


def dial_run_dir(out, dial, layout, arm, seed):
    """A sweep run's folder: <layout>-<p_wrong>-<p_right>-<arm>-s<seed>."""
    pw, pr = dial.split(":")
    return os.path.join(out, f"{layout}-{pw}-{pr}-{arm}-s{seed}")


def inspect_agent(d, agent):
    """An agent's entry of a run's `drmas inspect-grads --json` report (d/inspect.json), or None."""
    ins = load(os.path.join(d, "inspect.json"))
    if not ins:
        return None
    for a in ins["runs"][0]["agents"]:
        if a["name"] == agent:
            return a
    return None
