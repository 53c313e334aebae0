#!/usr/bin/env python3
"""Writes the ablation study's report (markdown) from the runs scripts/reproduce-ablations.sh made.

    python3 scripts/ablation_report.py OUT > OUT/report.md

OUT holds jobs.tsv (dial p_wrong:p_right, layout sep|shared, arm, seed), one folder per run
(<layout>-<p_wrong>-<p_right>-<arm>-s<seed>/ with metrics.jsonl, config.yaml, eval.json, inspect.json)
and meta.json. Standard library only. Every figure printed is read from those files.
"""
import math
import os
import statistics as st
import sys

from reportlib import avg_at_k, dial_run_dir, inspect_agent, metrics, reach, read_jobs, diff, finite, load, mean_sd

out = sys.argv[1]
meta = load(os.path.join(out, "meta.json"))
K = meta["k"]
ARM = {
    "grpo": "GRPO",
    "drmas": "Dr. MAS",
    "role": "Dr. MAS without σ (role-baseline)",
    "grpo-bal": "GRPO + frequency balancing",
    "drmas-bal": "Dr. MAS + frequency balancing",
    "grpo-clip0.5": "GRPO, clip 0.5",
    "grpo-clip0.2": "GRPO, clip 0.2",
    "grpo-clip0.1": "GRPO, clip 0.1",
    "grpo-akl": "GRPO + adaptive KL in reward",
}
LAYOUT = {"sep": "one model per agent", "shared": "one shared model"}
REACH = 0.8  # learning speed: the first iteration whose trailing 10-iteration mean reward reaches this

jobs, dials, layouts, arms, seeds = read_jobs(out)


def run_dir(dial, layout, arm, seed):
    return dial_run_dir(out, dial, layout, arm, seed)


_rows = {}


def rows(d):
    """The run's metrics rows by step (the last row of a step wins)."""
    if d not in _rows:
        by = {r["step"]: r for r in metrics(d) if isinstance(r.get("step"), int)}
        _rows[d] = [by[s] for s in sorted(by)]
    return _rows[d]


def clip_of(arm):
    return float(arm[len("grpo-clip"):]) if arm.startswith("grpo-clip") else 1.0


def f_inspect(agent, key, sub=None):
    def get(d, arm, layout):
        a = inspect_agent(d, agent)
        if not a:
            return None
        v = a.get(key)
        return v.get(sub) if (sub and isinstance(v, dict)) else v
    return get


def f_applied(agent):
    """Median over the run of the agent's gradient as the optimizer applied it: one model per agent,
    min(norm, clip); one shared model, the agent's share scaled by the model's clip factor."""
    def get(d, arm, layout):
        c = clip_of(arm)
        xs = []
        for r in rows(d):
            g = r.get(f"grad_norm/agent/{agent}")
            if not isinstance(g, (int, float)) or not math.isfinite(g):
                continue
            if layout == "sep":
                xs.append(min(g, c))
            else:
                m = next((v for k, v in r.items() if k.startswith("grad_norm/model/")), None)
                if isinstance(m, (int, float)) and math.isfinite(m) and m > 0:
                    xs.append(g * min(1.0, c / m))
        return st.median(xs) if xs else None
    return get


def f_mean_metric(key):
    def get(d, arm, layout):
        xs = finite([r.get(key) for r in rows(d)])
        return st.mean(xs) if xs else None
    return get


def f_last_metric(key):
    def get(d, arm, layout):
        xs = finite([r.get(key) for r in rows(d)])
        return xs[-1] if xs else None
    return get


def f_avg(d, arm, layout):
    return avg_at_k(d)


def f_reach(d, arm, layout):
    return reach(rows(d), REACH)


def cell(dial, layout, arm, f):
    return [f(run_dir(dial, layout, arm, s), arm, layout) for s in seeds]


def count(xs):
    return sum(1 for x in xs if x is not None)


H_MED = f_inspect("helper", "median")
H_MAX = f_inspect("helper", "max")
H_SPK = f_inspect("helper", "spikes")
S_MED = f_inspect("solver", "median")
S_MAX = f_inspect("solver", "max")
S_SPK = f_inspect("solver", "spikes")
H_APPLIED = f_applied("helper")
S_APPLIED = f_applied("solver")

print("# Is it the normalization? The reference's ablations on the dial\n")
print(f"`make reproduce-ablations` (scripts/reproduce-ablations.sh) on {meta['date']}, commit {meta['commit']}: "
      f"{meta['wall_min']} min on {meta['cores']} cores ({meta['jobs']} runs at a time). The dial team "
      f"(docs/dial.md) at p_wrong:p_right {', '.join(dials)}, {' and '.join(LAYOUT[l] for l in layouts)}; "
      f"seeds {', '.join(map(str, seeds))}; {meta['steps']} iterations of 16 questions × 8 rollouts after the "
      f"format warm-up; `drmas eval` avg@{K} on {meta['limit']} held-out questions. Every arm changes one thing "
      f"of the configs (configs/toy-dial.yaml, configs/toy-dial-shared.yaml: KL loss 0.05 k3, clip 1.0, "
      f"min_std 0.1); the arms are listed in the script's header. Figures are mean ± sd over the seeds; a "
      f"difference is *held* when it exceeds 2 standard errors (SE² = sd²/n of each side), *contradicted* "
      f"when it exceeds 2 SE the other way, and *not distinguishable* otherwise.\n")
missing = [(j, run_dir(*j)) for j in jobs if not os.path.isdir(os.path.join(run_dir(*j), f"step-{meta['steps']}"))]
if missing:
    print(f"**{len(missing)} of {len(jobs)} runs have no final checkpoint** (their logs say why): "
          + ", ".join(os.path.basename(d) for _, d in missing[:10]) + ("…" if len(missing) > 10 else "") + "\n")
else:
    print(f"All {len(jobs)} runs finished.\n")

print("## 1. Per arm\n")
print("Pre-clip gradient norms as the run logged them (`grad_norm/agent/<a>`, read by `drmas inspect-grads`: "
      "median and max over the run; spikes: a norm above 5× the median of the previous 20); *applied*: the "
      "median of the gradient the optimizer step used (after the arm's clip; with one shared model, the "
      "agent's share scaled by the model's clip factor). σ_k: the mean over iterations of the median of the "
      "Helper's per-group score std (`adv_std/agent/helper/median`) and of the fraction of its groups with "
      "σ_k < 0.01; |A| max: the Helper's largest advantage.\n")
for dial in dials:
    for layout in layouts:
        print(f"### p_wrong:p_right {dial}, {LAYOUT[layout]}\n")
        print("| arm | Helper median | Helper max | Helper spikes | Helper applied | Solver median | Solver max "
              "| Solver applied | Helper σ_k median | Helper σ_k<0.01 | Helper abs A max | avg@%d | reaches %.1f at |" % (K, REACH))
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for arm in arms:
            c = lambda f: cell(dial, layout, arm, f)
            print(f"| {ARM.get(arm, arm)} | {mean_sd(c(H_MED))} | {mean_sd(c(H_MAX), '{:.2f}')} | "
                  f"{mean_sd(c(H_SPK), '{:.1f}')} | {mean_sd(c(H_APPLIED))} | {mean_sd(c(S_MED))} | "
                  f"{mean_sd(c(S_MAX), '{:.2f}')} | {mean_sd(c(S_APPLIED))} | "
                  f"{mean_sd(c(f_mean_metric('adv_std/agent/helper/median')))} | "
                  f"{mean_sd(c(f_mean_metric('adv_std/agent/helper/frac_below_0.01')), '{:.2f}')} | "
                  f"{mean_sd(c(f_inspect('helper', 'sigma', 'abs_adv_max')), '{:.2f}')} | "
                  f"{mean_sd(c(f_avg))} | {mean_sd(c(f_reach), '{:.0f}')} ({count(c(f_reach))}/{len(seeds)} reach) |")
        if "grpo-akl" in arms:
            b = cell(dial, layout, "grpo-akl", f_last_metric("kl_in_reward/coef"))
            kl = cell(dial, layout, "grpo-akl", f_mean_metric("kl_in_reward/kl"))
            print(f"\nAdaptive KL: β at the last iteration {mean_sd(b, '{:.5f}')} (from 0.001), mean KL(π_old‖π_ref) "
                  f"per sequence {mean_sd(kl, '{:.4f}')} against the target 0.1.")
        print()


def d_fmt(r, fmt="{:+.3f}"):
    if r is None:
        return "–"
    return fmt.format(r[0]) + " (2 SE {:.3f})".format(2 * r[1])


def removes(dial, layout, arm, f, what):
    """Claim: ARM removes GRPO's Helper inflation (measured by f)."""
    base = diff(cell(dial, layout, "grpo", f), cell(dial, layout, "drmas", f))
    remain = diff(cell(dial, layout, arm, f), cell(dial, layout, "drmas", f))
    cut = diff(cell(dial, layout, "grpo", f), cell(dial, layout, arm, f))
    if base is None or remain is None or cut is None:
        return "– (runs missing)"
    txt = f"{what}: {ARM[arm]} − Dr. MAS {d_fmt(remain)}; GRPO − {ARM[arm]} {d_fmt(cut)}. "
    if base[0] <= 2 * base[1]:
        return txt + "**not distinguishable**: GRPO's Helper does not exceed Dr. MAS's here by more than 2 SE, so there is no inflation to remove"
    if remain[0] > 2 * remain[1]:
        return txt + "**contradicted**: the inflation remains (above Dr. MAS's by more than 2 SE)"
    if cut[0] > 2 * cut[1]:
        return txt + "**held**: below GRPO's by more than 2 SE and within 2 SE of Dr. MAS's"
    return txt + "**not distinguishable**: within 2 SE of both GRPO's and Dr. MAS's"


def cmp(dial, layout, a, b, f, what, fmt="{:+.3f}", words=("larger", "smaller")):
    """A − B of f with the 2-SE rule; words name a difference above and below 2 SE."""
    r = diff(cell(dial, layout, a, f), cell(dial, layout, b, f))
    if r is None:
        return f"{what}: – (runs missing)"
    tag = words[0] if r[0] > 2 * r[1] else (words[1] if r[0] < -2 * r[1] else "not distinguishable")
    return f"{what}: {ARM[a]} − {ARM[b]} {d_fmt(r, fmt)}: {tag}"


SCORE = ("better", "worse")   # avg@k
SLOWER = ("slower", "faster")  # iterations to reach


print("## 2. The reviewers' questions\n")
print("Each claim per dial setting and layout, judged on the Helper's median pre-clip norm (the inflation the dial "
      "study measured) and, where the claim is about the update, on the applied norm. *Held* needs the arm below "
      "GRPO by more than 2 SE and within 2 SE of Dr. MAS; *contradicted*: still above Dr. MAS by more than 2 SE.\n")
for dial in dials:
    for layout in layouts:
        print(f"### p_wrong:p_right {dial}, {LAYOUT[layout]}\n")
        base = diff(cell(dial, layout, "grpo", H_MED), cell(dial, layout, "drmas", H_MED))
        print(f"- The inflation itself: GRPO − Dr. MAS, Helper median {d_fmt(base)}; Helper max "
              f"{d_fmt(diff(cell(dial, layout, 'grpo', H_MAX), cell(dial, layout, 'drmas', H_MAX)), '{:+.2f}')}.")
        if "grpo-bal" in arms:
            print(f"- *Does frequency balancing alone remove GRPO's inflation?* {removes(dial, layout, 'grpo-bal', H_MED, 'Helper median')}.")
        for arm in [a for a in arms if a.startswith("grpo-clip")]:
            print(f"- *Does clip {clip_of(arm)} remove it?* {removes(dial, layout, arm, H_MED, 'pre-clip Helper median')}. "
                  f"In the update: {removes(dial, layout, arm, H_APPLIED, 'applied Helper median')}. Its cost: "
                  f"{cmp(dial, layout, arm, 'grpo', f_avg, f'avg@{K}', words=SCORE)}; "
                  f"{cmp(dial, layout, arm, 'grpo', S_APPLIED, 'applied Solver median')}.")
        if "grpo-akl" in arms:
            print(f"- *Does the adaptive KL controller remove it?* {removes(dial, layout, 'grpo-akl', H_MED, 'Helper median')}.")
        if "role" in arms:
            print(f"- *Does Dr. MAS need the σ division?* {cmp(dial, layout, 'role', 'drmas', H_MED, 'Helper median')}; "
                  f"{cmp(dial, layout, 'role', 'drmas', H_MAX, 'Helper max', '{:+.2f}')}; "
                  f"{cmp(dial, layout, 'role', 'drmas', S_MED, 'Solver median')} (the Solver's step size); {cmp(dial, layout, 'role', 'drmas', f_avg, f'avg@{K}', words=SCORE)}; "
                  f"{cmp(dial, layout, 'role', 'drmas', f_reach, 'iterations to reach', '{:+.1f}', SLOWER)}.")
        if "drmas-bal" in arms:
            print(f"- Balancing on top of Dr. MAS: {cmp(dial, layout, 'drmas-bal', 'drmas', H_MED, 'Helper median')}; "
                  f"{cmp(dial, layout, 'drmas-bal', 'drmas', f_avg, f'avg@{K}', words=SCORE)}.")
        print()

print("## 3. Final reward and learning speed against GRPO\n")
print(f"avg@{K} of each arm minus GRPO's (2 SE), and the iterations until the trailing 10-iteration training reward "
      f"reaches {REACH} (runs that never reach it are left out of the mean).\n")
print("| arm | " + " | ".join(f"{d} {LAYOUT[l]}" for d in dials for l in layouts) + " |")
print("|---|" + "---|" * (len(dials) * len(layouts)))
for arm in arms:
    if arm == "grpo":
        continue
    cells = []
    for dial in dials:
        for layout in layouts:
            r = diff(cell(dial, layout, arm, f_avg), cell(dial, layout, "grpo", f_avg))
            cells.append(d_fmt(r))
    print(f"| {ARM.get(arm, arm)} | " + " | ".join(cells) + " |")
print()
nonfinite = sum(1 for j in jobs for a in ("helper", "solver")
                if (f_inspect(a, "nonfinite")(run_dir(*j), j[2], j[1]) or 0) > 0)
print(f"Runs × agents with a non-finite gradient norm: {nonfinite}.")
