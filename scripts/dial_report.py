#!/usr/bin/env python3
"""Writes the dial study's report (markdown) from the runs scripts/reproduce-dial.sh made.

    python3 scripts/dial_report.py OUT > OUT/report.md

OUT holds jobs.tsv (dial p_wrong:p_right, layout sep|shared, estimator, seed), one folder per run
(<layout>-<p_wrong>-<p_right>-<estimator>-s<seed>/ with metrics.jsonl, eval.json, inspect.json and the
counterfactual reports cf-step-N.json), pool*.json (`drmas inspect-grads --pool`) and meta.json.
Standard library only. Every figure printed is read from those files.
"""
import math
import os
import statistics as st
import sys

from reportlib import avg_at_k, dial_run_dir, inspect_agent, metrics, reach, read_jobs, diff, finite, load, mean_sd, spearman, spearman_ci, verdict

out = sys.argv[1]
meta = load(os.path.join(out, "meta.json"))
K = meta["k"]
DIALED = "helper"
EST = {"grpo": "GRPO", "drmas": "Dr. MAS"}
LAYOUT = {"sep": "one model per agent", "shared": "one shared model"}

jobs, dials, layouts, _, seeds = read_jobs(out)


def run_dir(dial, layout, est, seed):
    return dial_run_dir(out, dial, layout, est, seed)


def label(dial):
    pw, pr = dial.split(":")
    return f"p_wrong {pw}, p_right {pr}"


def nonfinite_steps(d):
    ins = load(os.path.join(d, "inspect.json"))
    if not ins:
        return None
    return sum(m.get("nonfinite", 0) for m in ins["runs"][0]["models"])


REACH = 0.8  # learning speed: the first iteration whose trailing 10-iteration mean reward reaches this


def reached(d):
    return reach(metrics(d), REACH)


def cell(dial, layout, est, f):
    return [f(run_dir(dial, layout, est, s)) for s in seeds]


def field(agent, key):
    def get(d):
        a = inspect_agent(d, agent)
        return a.get(key) if a else None
    return get


def num(x, fmt="{:.3g}"):
    if x is None:
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return fmt.format(x)


def dfmt(r, fmt="{:+.3f}"):
    if r is None:
        return "–", "–"
    return fmt.format(r[0]), "{:.3f}".format(2 * r[1])


pool = {name: load(os.path.join(out, f"{name}.json")) for name in ("pool", "pool-helper", "pool-helper-sep", "pool-helper-shared")}

print("# The dial study: when does Dr. MAS matter?\n")
print(f"`make reproduce-dial` (scripts/reproduce-dial.sh) on {meta['date']}, commit {meta['commit']}: "
      f"{meta['wall_min']} min on {meta['cores']} cores ({meta['jobs']} runs at a time). Dial settings "
      f"(p_wrong:p_right) {', '.join(dials)}; GRPO (`preset: grpo`) and Dr. MAS (`preset: drmas`); "
      f"{' and '.join(LAYOUT[l] for l in layouts)}; seeds {', '.join(map(str, seeds))}; {meta['steps']} iterations "
      f"of 16 questions × 8 rollouts; `drmas eval` avg@{K} on {meta['limit']} held-out questions; the counterfactual "
      f"on the step-{meta['mid']} and step-{meta['steps']} checkpoints of every run, {meta['cf_batches']} batches each. "
      "Every run of a dial setting and seed has the same rewards, model, warm-up and data; only the estimator "
      "(and, between the layouts, the model sharing) changes. The team: configs/toy-dial.yaml (docs/dial.md).\n")

# ---- 1. the dialled agent's norms
print(f"## 1. Pre-clip gradient norms during training\n")
print("Per run, from `drmas inspect-grads RUN --json` over all iterations: each agent's median and largest pre-clip "
      "norm, and its spikes (a norm above 5× the trailing median of 20). Mean ± sd over seeds; the "
      "difference is GRPO − Dr. MAS with its 2 SE. Non-finite steps: summed over the seeds.\n")
print("| agent | dial | layout | median GRPO | median Dr. MAS | diff (2 SE) | max GRPO | max Dr. MAS | diff (2 SE) | spikes GRPO | spikes Dr. MAS | non-finite steps (G / D) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
norm_claims = []
for agent, dial, layout in [(a, d, l) for a in (DIALED, "solver") for d in dials for l in layouts]:
        med = {e: cell(dial, layout, e, field(agent, "median")) for e in EST}
        mx = {e: cell(dial, layout, e, field(agent, "max")) for e in EST}
        sp = {e: cell(dial, layout, e, field(agent, "spikes")) for e in EST}
        nf = {e: sum(finite(cell(dial, layout, e, nonfinite_steps))) for e in EST}
        dm, dx = diff(med["grpo"], med["drmas"]), diff(mx["grpo"], mx["drmas"])
        a, b = dfmt(dm)
        c, e2 = dfmt(dx)
        print(f"| {agent} | {dial} | {layout} | {mean_sd(med['grpo'])} | {mean_sd(med['drmas'])} | {a} ({b}) | "
              f"{mean_sd(mx['grpo'])} | {mean_sd(mx['drmas'])} | {c} ({e2}) | {mean_sd(sp['grpo'], '{:.1f}')} | "
              f"{mean_sd(sp['drmas'], '{:.1f}')} | {nf['grpo']} / {nf['drmas']} |")
        if agent == DIALED:
            norm_claims.append((dial, layout, dm, dx))
print()

# ---- 2. the predictors against the measured ratio
print("## 2. The measured ratio against the predictors\n")
print("Counterfactual mode (`drmas inspect-grads --config … --checkpoint …`) on each run's mid-run and final "
      "checkpoints: on the same rollout batches, every agent's gradient norm under GRPO and under Dr. MAS, the "
      "measured ratio |g_GRPO|²/|g_DrMAS|², the Lemma 4.2 inflation factor (σ_k² + (μ_k − μ)²)/σ² "
      "(`inflation/agent/<a>`) and the advantage energy ratio ΣA²_GRPO/ΣA²_DrMAS (`adv_energy_ratio/agent/<a>`). "
      "∞: Dr. MAS gave the agent no gradient on the batch (its scores did not vary within the groups) while GRPO "
      "did; it ranks above every finite ratio. Medians over the rows of each dial setting and layout (both "
      "training estimators, all seeds and both checkpoints), from `drmas inspect-grads --pool`:\n")
p = pool["pool"]
if p:
    print("| dial, layout | agent | rows | median measured | median inflation | median ΣA² ratio | median centered | median weighted |")
    print("|---|---|---|---|---|---|---|---|")
    for c in p["cells"]:
        m = math.inf if c["measured_infinite"] else c["measured"]
        en = math.inf if c["energy_infinite"] else c["energy"]
        w = math.inf if c["weighted_infinite"] else c["weighted"]
        print(f"| {c['label']} | {c['agent']} | {c['rows']} | {num(m)} | {num(c['inflation'])} | {num(en)} | "
              f"{num(math.inf if c['centered_infinite'] else c['centered'])} | {num(w)} |")
    print()
    print("Spearman rank correlation with the measured ratio, over every (agent, batch) row and over the medians of "
          "each (dial, layout, agent) cell (which average out the batch-to-batch noise of the measured ratio), with "
          "its 95% bootstrap interval (2,000 resamples). Predictors: `inflation` (Lemma 4.2), `energy` (ΣA² ratio), "
          "`centered` (ΣA² of the advantages' within-group variation, the shift μ_k − μ left out), `weighted` (ΣA² "
          "with each call weighted by Σ_t (1 − p_t)² over its sampled tokens):\n")
    print("| pooled | predictor | Spearman | 95% CI | points |")
    print("|---|---|---|---|---|")
    for name, title in (("pool", "both agents, both layouts"), ("pool-helper", "Helper, both layouts"),
                        ("pool-helper-sep", f"Helper, {LAYOUT['sep']}"), ("pool-helper-shared", f"Helper, {LAYOUT['shared']}")):
        q = pool[name]
        if not q:
            continue
        for key, unit in (("correlations", "(agent, batch) rows"), ("cell_correlations", "(dial, layout, agent) medians")):
            for c in q[key]:
                print(f"| {title}: {unit} | {c['predictor']} | {num(c['spearman'], '{:.3f}')} | "
                      f"[{num(c['ci95_lo'], '{:.3f}')}, {num(c['ci95_hi'], '{:.3f}')}] | {c['pairs']} |")
    print()
    print("![the Helper's measured ratio against each predictor, one colour per dial setting and layout](ratios.png)\n")
    print("The logged means over training (from each run's metrics, the Helper, mean over seeds and both estimators):\n")
    print("| dial | layout | mean inflation | mean ΣA² ratio |")
    print("|---|---|---|---|")
    for dial in dials:
        for layout in layouts:
            inf = sum((cell(dial, layout, e, field(DIALED, "inflation")) for e in EST), [])
            en = sum((cell(dial, layout, e, field(DIALED, "energy_ratio")) for e in EST), [])
            print(f"| {dial} | {layout} | {mean_sd(inf, '{:.2f}')} | {mean_sd(en, '{:.2f}')} |")
    print()

# ---- 2b. over training
print("## 2b. Over training: the norm inflation a user sees, against the logged predictors\n")
print("Per dial setting and layout, the Helper's training-time squared-norm inflation (mean over seeds of the GRPO runs' "
      "median pre-clip norm ÷ the same for the Dr. MAS runs)², against the statistics training logs (means over "
      "iterations, seeds and both estimators) and the counterfactual medians of section 2. Spearman over the "
      "settings, with its 95% bootstrap interval (2,000 resamples of the settings).\n")
train_rows = []
cellmap = {(c["label"], c["agent"]): c for c in (pool["pool-helper"] or {}).get("cells", [])}
for dial in dials:
    for layout in layouts:
        g = finite(cell(dial, layout, "grpo", field(DIALED, "median")))
        d = finite(cell(dial, layout, "drmas", field(DIALED, "median")))
        le = finite(sum((cell(dial, layout, e, field(DIALED, "energy_ratio")) for e in EST), []))
        li = finite(sum((cell(dial, layout, e, field(DIALED, "inflation")) for e in EST), []))
        c = cellmap.get((f"{dial} {layout}", DIALED), {})
        inf = lambda k: math.inf if c.get(k + "_infinite") else c.get(k)
        train_rows.append(dict(dial=dial, layout=layout, ratio=(st.mean(g) / st.mean(d)) ** 2 if g and d else None,
                               energy=st.mean(le) if le else None, inflation=st.mean(li) if li else None,
                               cf_measured=inf("measured"), cf_energy=inf("energy"), cf_weighted=inf("weighted")))
print("| dial | layout | (GRPO ÷ Dr. MAS median norm)² | logged ΣA² ratio | logged inflation | CF measured | CF ΣA² ratio | CF weighted |")
print("|---|---|---|---|---|---|---|---|")
for r in train_rows:
    print(f"| {r['dial']} | {r['layout']} | {num(r['ratio'])} | {num(r['energy'])} | {num(r['inflation'])} | "
          f"{num(r['cf_measured'])} | {num(r['cf_energy'])} | {num(r['cf_weighted'])} |")
print()
print("| predictor of the training-time inflation | Spearman | 95% CI | settings |")
print("|---|---|---|---|")
big = 1e300  # ∞ ranks above every finite value
for key, title in (("energy", "logged ΣA² ratio (`adv_energy_ratio`)"), ("inflation", "logged Lemma 4.2 inflation"),
                   ("cf_measured", "counterfactual measured ratio"), ("cf_energy", "counterfactual ΣA² ratio"),
                   ("cf_weighted", "counterfactual score-weighted ratio")):
    xs = [min(r[key], big) if r[key] is not None else None for r in train_rows]
    ys = [r["ratio"] for r in train_rows]
    keep = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    rho, n = spearman([k[0] for k in keep], [k[1] for k in keep])
    lo, hi = spearman_ci([k[0] for k in keep], [k[1] for k in keep])
    print(f"| {title} | {num(rho, '{:.3f}')} | [{num(lo, '{:.3f}')}, {num(hi, '{:.3f}')}] | {n} |")
print()

# ---- 3. reward
print(f"## 3. Final reward\n")
print(f"avg@{K} of the final checkpoint, mean ± sd over seeds; Dr. MAS − GRPO with its 2 SE. Learning speed: the first "
      f"iteration whose trailing 10-iteration mean training reward reaches {REACH} (runs that never did are left out; "
      "their count is given).\n")
print("| dial | layout | GRPO | Dr. MAS | Dr. MAS − GRPO | 2 SE | verdict: Dr. MAS raises avg@k | reached GRPO | reached Dr. MAS |")
print("|---|---|---|---|---|---|---|---|---|")
reward_claims = []
for dial in dials:
    for layout in layouts:
        r = {e: cell(dial, layout, e, avg_at_k) for e in EST}
        d = diff(r["drmas"], r["grpo"])
        v = verdict(*d) if d else "not tested"
        a, b = dfmt(d)
        sp = {e: cell(dial, layout, e, reached) for e in EST}
        never = {e: sum(x is None for x in sp[e]) for e in EST}
        print(f"| {dial} | {layout} | {mean_sd(r['grpo'])} | {mean_sd(r['drmas'])} | {a} | {b} | {v} | "
              f"{mean_sd(sp['grpo'], '{:.0f}')} ({never['grpo']} never) | {mean_sd(sp['drmas'], '{:.0f}')} ({never['drmas']} never) |")
        reward_claims.append((dial, layout, d, v))
print()

# ---- 4. claims
print("## 4. The claims, as tested here\n")
print("Rule (as in docs/reproduce/report.md): a difference of seed means *held* when it has the claim's sign and "
      "exceeds 2 SE (SE = √(sd_a²/n_a + sd_b²/n_b)), is *contradicted* when it has the other sign and exceeds 2 SE, "
      f"and is *not distinguishable* otherwise; {len(seeds)} seeds per row.\n")
print("| claim | dial | layout | figure | difference | 2 SE | verdict |")
print("|---|---|---|---|---|---|---|")
for dial, layout, dm, dx in norm_claims:
    for name, d in (("median", dm), ("max", dx)):
        v = verdict(*d) if d else "not tested"
        a, b = dfmt(d)
        print(f"| GRPO's pre-clip norms for the Helper exceed Dr. MAS's | {dial} | {layout} | {name} | {a} | {b} | {v} |")
for dial, layout, d, v in reward_claims:
    a, b = dfmt(d)
    print(f"| Dr. MAS raises avg@{K} | {dial} | {layout} | avg@{K} | {a} | {b} | {v} |")
print()
