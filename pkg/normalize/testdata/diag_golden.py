#!/usr/bin/env python3
"""Writes diag_golden.json: the Dr. MAS reference code's own diagnostics, loss-balance weights,
advantages and adaptive KL coefficients on fixed random batches, for diag_test.go.

Usage: python3 diag_golden.py CORE_ALGOS [OUT]

CORE_ALGOS is verl/trainer/ppo/core_algos.py of langfengQ/DrMAS at commit 40f50a1 or later (the
commits that added compute_loss_balance_weights, summarize_group_diagnostics and
summarize_group_std_stats). Only the named functions are taken from it (parsed with ast and run here,
without the rest of verl); this script holds none of the reference's code. Needs numpy and torch.
Tests never run it: the JSON it writes is committed.

Everything runs in float64 so that Go can be held to 1e-9: the rewards are float64 tensors, and
compute_loss_balance_weights, which builds its weights as float32, sees a torch whose float32 is
float64 (the weights are then (1/n)/mean(1/n) without rounding to float32); and torch's default
dtype is float64, so that the one-sample rule's torch.tensor(0.0), torch.tensor(1.0) do not round
σ + ε to float32 (1 + 1e-6 would become 1.00000095).
"""
import ast
import json
import random
import sys
import types
from collections import Counter, defaultdict
from typing import Any, Dict, List, Sequence

import numpy as np
import torch

NAMES = ["AdaptiveKLController", "summarize_group_std_stats", "_compute_global_uid_stats",
         "_compute_per_agent_stats", "summarize_group_diagnostics", "compute_loss_balance_weights",
         "compute_grpo_outcome_advantage"]


class Torch64(types.ModuleType):
    """torch, with float32 standing for float64."""

    def __init__(self):
        super().__init__("torch")
        self.float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def load(path):
    src = open(path).read()
    tree = ast.parse(src)
    keep = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in NAMES]
    missing = set(NAMES) - {n.name for n in keep}
    if missing:
        sys.exit(f"{path}: no {sorted(missing)} (need langfengQ/DrMAS at 40f50a1 or later)")
    ns = {"np": np, "torch": Torch64(), "defaultdict": defaultdict, "Counter": Counter,
          "Dict": Dict, "Any": Any, "Sequence": Sequence, "List": List}
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), ns)
    return ns


def batch(rng):
    """1-5 prompt groups of 1-8 trajectories; each trajectory calls some of up to three agents 1-4
    times; scores binary with small penalties, continuous, or all equal in a group."""
    agents = ["solver", "verifier", "critic"]
    out = []
    for g in range(rng.randint(1, 5)):
        team = agents[: rng.randint(1, 3)]
        kind = rng.choice(["binary", "binary", "continuous", "equal"])
        for t in range(rng.randint(1, 8)):
            reward = float(rng.choice([0.0, 1.0]))
            for a in team:
                if rng.random() < 0.2:
                    continue  # the agent was not called in this trajectory
                for _ in range(rng.randint(1, 4)):
                    if kind == "continuous":
                        s = rng.uniform(-1, 1)
                    elif kind == "equal":
                        s = 0.5
                    else:
                        s = reward - (0.1 if rng.random() < 0.2 else 0.0)
                    out.append({"uid": f"u{g}", "traj_uid": f"t{t}", "agent": a, "score": s})
    if not out:
        out.append({"uid": "u0", "traj_uid": "t0", "agent": "solver", "score": 1.0})
    rng.shuffle(out)
    return out


def reference(ns, samples, norm_by_std):
    scores = torch.tensor([[x["score"]] for x in samples], dtype=torch.float64)
    mask = torch.ones_like(scores)
    uids = np.array([x["uid"] for x in samples], dtype=object)
    agents = np.array([x["agent"] for x in samples], dtype=object)
    trajs = np.array([x["traj_uid"] for x in samples], dtype=object)
    index = np.array([u + "\x00" + a for u, a in zip(uids, agents)], dtype=object)  # Dr. MAS grouping
    adv, _, extra = ns["compute_grpo_outcome_advantage"](
        scores, mask, index, trajs, epsilon=1e-6, norm_adv_by_std_in_grpo=norm_by_std, group_by_agent_id=True,
        agent_ids=agents, uids=uids, return_std_metrics=True, balance_loss_by_agent_freq=True)
    return {"advantages": adv[:, 0].tolist(), "metrics": extra["std_metrics"],
            "loss_weights": extra["loss_weights"].tolist()}


def kl_trace(ns, rng):
    init, target, horizon = rng.choice([0.001, 0.01, 0.2]), rng.choice([0.05, 0.1, 1.0]), rng.choice([10, 1000, 10000])
    ctl = ns["AdaptiveKLController"](init_kl_coef=init, target_kl=target, horizon=horizon)
    steps = []
    for _ in range(20):
        kl, n = rng.choice([0.0, rng.uniform(0, 3 * target)]), rng.choice([1, 8, 256])
        ctl.update(kl, n)
        steps.append({"kl": kl, "n_steps": n, "value": float(ctl.value)})
    return {"init": init, "target": target, "horizon": horizon, "steps": steps}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    torch.set_default_dtype(torch.float64)
    ns = load(sys.argv[1])
    out = sys.argv[2] if len(sys.argv) > 2 else "diag_golden.json"
    rng = random.Random(43)
    cases = []
    for i in range(24):
        samples = batch(rng)
        cases.append({"samples": samples, "drmas": reference(ns, samples, True),
                      "no_std": reference(ns, samples, False)})
    kl = [kl_trace(ns, rng) for _ in range(5)]
    with open(out, "w") as f:
        json.dump({"source": "langfengQ/DrMAS verl/trainer/ppo/core_algos.py", "cases": cases, "adaptive_kl": kl}, f)


if __name__ == "__main__":
    main()
