#!/usr/bin/env python3
"""The report of scripts/reproduce-async.sh (issue #38, docs/async.md): final avg@8 per team and arm
over the seeds, each arm against K = 0 with the 2-SE rule, the off-policy correction's metrics, and
an SVG of the training reward and KL(π_b ‖ π_old) per arm (mean over seeds, 10-iteration moving
average). Standard library only.

    python3 scripts/async_report.py runs/async > runs/async/report.md   # also writes runs/async/curves.svg
"""
import os
import statistics as st
import sys

from reportlib import diff, finite, load, mean_sd, metrics

ARM_TEXT = {
    "k0": "K = 0 (rollout, then update)",
    "k1-tis": "K = 1, TIS (C = 2)",
    "k4": "K = 4, no correction",
    "k4-tis": "K = 4, TIS (C = 2)",
}
COLORS = {"k0": "#222222", "k1-tis": "#1f77b4", "k4": "#d62728", "k4-tis": "#2ca02c"}


def model_mean(row, prefix):
    """The mean over models of the keys under prefix (rollout_corr/<figure>/model/<id>)."""
    vs = finite([v for k, v in row.items() if k.startswith(prefix)])
    return st.mean(vs) if vs else None


def run_figures(d):
    rs = metrics(d)
    ev = load(os.path.join(d, "eval.json")) or {}
    f = {"avg": ev.get("avg_at_k"), "pass": ev.get("pass_at_k"), "iterations": len(rs)}
    if not rs:
        return f
    f["reward_last10"] = st.mean(finite([r.get("reward/mean") for r in rs[-10:]]) or [float("nan")])
    f["staleness"] = max(finite([r.get("rollout/staleness", 0) for r in rs]) or [0])
    for key in ("weight_mean", "kl", "truncated", "masked"):
        vs = finite([model_mean(r, f"rollout_corr/{key}/model/") for r in rs])
        f[key] = st.mean(vs) if vs else None
    vs = finite([model_mean(r, "rollout_corr/weight_max/model/") for r in rs])
    f["weight_max"] = max(vs) if vs else None
    f["iteration_s"] = st.mean(finite([r.get("time/iteration") for r in rs]) or [float("nan")])
    f["reward_curve"] = [r.get("reward/mean") for r in rs]
    f["kl_curve"] = [model_mean(r, "rollout_corr/kl/model/") for r in rs]
    return f


def fmt(x, f="{:.3f}"):
    return "–" if x is None else f.format(x)


def smooth(xs, w=10):
    out = []
    for i in range(len(xs)):
        win = finite(xs[max(0, i - w + 1):i + 1])
        out.append(st.mean(win) if win else None)
    return out


def mean_curve(curves):
    n = max((len(c) for c in curves), default=0)
    out = []
    for i in range(n):
        vs = finite([c[i] for c in curves if i < len(c)])
        out.append(st.mean(vs) if vs else None)
    return out


def svg(teams, arms, figs, path):
    """Two panels per team: reward/mean, and KL(π_b ‖ π_old) (mean over models), per arm."""
    W, H, pad = 420, 220, 40
    panels = [(team, what) for team in teams for what in ("reward_curve", "kl_curve")]
    width, height = 2 * W, H * ((len(panels) + 1) // 2) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for idx, (team, what) in enumerate(panels):
        x0, y0 = (idx % 2) * W, (idx // 2) * H
        curves = {arm: smooth(mean_curve([figs[(team, arm, s)][what] for s in seeds_of(figs, team, arm)
                                          if figs[(team, arm, s)].get(what)])) for arm in arms}
        vals = finite([v for c in curves.values() for v in c])
        if not vals:
            continue
        lo, hi = min(vals), max(vals)
        if hi == lo:
            hi = lo + 1
        n = max(len(c) for c in curves.values())
        title = {"reward_curve": "training reward (mean of seeds, 10-it. average)",
                 "kl_curve": "KL(π_b ‖ π_old) per token, mean of models"}[what]
        out.append(f'<text x="{x0 + pad}" y="{y0 + 16}" font-weight="bold">{team} team: {title}</text>')
        out.append(f'<rect x="{x0 + pad}" y="{y0 + 24}" width="{W - 2 * pad}" height="{H - 60}" fill="none" stroke="#999"/>')
        out.append(f'<text x="{x0 + 2}" y="{y0 + 30}">{hi:.3g}</text><text x="{x0 + 2}" y="{y0 + H - 36}">{lo:.3g}</text>')
        out.append(f'<text x="{x0 + W - pad - 40}" y="{y0 + H - 22}">it. {n}</text>')
        for arm, c in curves.items():
            pts = [(x0 + pad + (W - 2 * pad) * i / max(1, n - 1), y0 + 24 + (H - 60) * (1 - (v - lo) / (hi - lo)))
                   for i, v in enumerate(c) if v is not None]
            if len(pts) > 1:
                d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                out.append(f'<polyline fill="none" stroke="{COLORS.get(arm, "#888")}" stroke-width="1.5" points="{d}"/>')
    ly = height - 12
    for i, arm in enumerate(arms):
        out.append(f'<rect x="{pad + i * 190}" y="{ly - 9}" width="12" height="3" fill="{COLORS.get(arm, "#888")}"/>'
                   f'<text x="{pad + i * 190 + 16}" y="{ly - 4}">{ARM_TEXT.get(arm, arm)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def seeds_of(figs, team, arm):
    return sorted(s for (t, a, s) in figs if t == team and a == arm)


def main(out):
    meta = load(os.path.join(out, "meta.json")) or {}
    jobs = []  # (team, arm, seed), in the order they ran
    for line in open(os.path.join(out, "jobs.tsv")):
        team, arm, seed = line.rstrip("\n").split("\t")
        jobs.append((team, arm, int(seed)))
    teams = list(dict.fromkeys(j[0] for j in jobs))
    arms = list(dict.fromkeys(j[1] for j in jobs))
    figs = {(t, a, s): run_figures(os.path.join(out, f"{t}-{a}-s{s}")) for t, a, s in jobs}
    print("# Rollouts ahead of training: does it learn as the synchronous loop does?\n")
    print(f"`scripts/reproduce-async.sh` ({meta.get('date', '?')}, commit {meta.get('commit', '?')}, "
          f"{meta.get('wall_min', '?')} min on {meta.get('cores', '?')} cores, {meta.get('jobs', '?')} run(s) at a time). "
          f"Seeds {meta.get('seeds', '?')}; every model's rollouts on one managed `drmas serve` replica; "
          f"avg@{meta.get('k', 8)} and pass@{meta.get('k', 8)} on {meta.get('limit', 64)} held-out questions of the final weights. "
          "Each arm changes only rollout.max_staleness and algorithm.rollout_correction. "
          "Mean ± sd over seeds; Δ is the arm's mean avg@8 less K = 0's, with its standard error; "
          "the verdict applies the 2-SE rule.\n")
    for team in teams:
        print(f"## {team} team (configs/toy-{team}-team.yaml)\n")
        print("| arm | seeds | final avg@8 | pass@8 | Δ avg@8 vs K = 0 | verdict | reward, last 10 it. | max staleness | weight mean | weight max | truncated | KL(π_b‖π_old) | s / iteration |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        base = [figs[(team, "k0", s)]["avg"] for s in seeds_of(figs, team, "k0")]
        for arm in arms:
            fs = [figs[(team, arm, s)] for s in seeds_of(figs, team, arm)]
            avgs = [f["avg"] for f in fs]
            dv = "–"
            verdict = "–"
            if arm != "k0":
                r = diff(avgs, base)
                if r:
                    d, se = r
                    dv = f"{d:+.3f} ± {se:.3f}"
                    verdict = "within 2 SE of K = 0" if abs(d) <= 2 * se else ("better than K = 0" if d > 0 else "worse than K = 0 (beyond 2 SE)")

            def m(key, f="{:.3f}"):
                vs = finite([x.get(key) for x in fs])
                return fmt(st.mean(vs), f) if vs else "–"
            wmax = finite([x.get("weight_max") for x in fs])
            print(f"| {ARM_TEXT.get(arm, arm)} | {len(finite(avgs))} | {mean_sd(avgs)} | {mean_sd([f['pass'] for f in fs])} | {dv} | {verdict} | "
                  f"{m('reward_last10')} | {m('staleness', '{:.0f}')} | {m('weight_mean', '{:.4f}')} | {fmt(max(wmax) if wmax else None)} | "
                  f"{m('truncated', '{:.4f}')} | {m('kl', '{:.4f}')} | {m('iteration_s', '{:.2f}')} |")
        print()
    svg(teams, arms, figs, os.path.join(out, "curves.svg"))
    print("Curves: `curves.svg` (training reward and KL(π_b ‖ π_old) per arm, mean of the seeds). "
          "K = 0 has no correction metrics: its rollouts come from the weights being trained.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/async")
