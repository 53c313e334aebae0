#!/usr/bin/env python3
"""Side-by-side benchmark: `drmas bench` against eager PyTorch (scripts/bench_torch.py) on the
same model folder, same batch and same thread settings, run back to back, alternating, for each
model size. Prints each round's figures and the ratios (drmas speed / PyTorch speed; above 1 means
drmas is faster), then the median and range over rounds.

  python3 scripts/bench_compare.py [--bin bin/drmas] [--rounds 3] [--presets tiny,small]

Each round runs, one after another:
  drmas            as `drmas train` runs (oneDNN matrix products when libtorch has them, tuned malloc)
  drmas/blas       the same binary with DRMAS_GEMM=blas (libtorch's own BLAS, OpenBLAS on Debian):
                   how much of the difference is the matrix-product library
  pytorch          eager PyTorch as a user runs it (python3 scripts/bench_torch.py)
  pytorch+tcmalloc the same script with tcmalloc preloaded, when Debian's libtcmalloc-minimal4 is
                   installed (a stronger baseline: glibc's default malloc faults memory in anew)
With --long (make bench passes it), a random 9.8M-parameter model (`drmas bench --preset long`: hidden
512, 8 layers, 8 query / 4 key-value heads, MLP 264, vocabulary 512) takes one training step of
1 × (256 + 256) and of 1 × (256 + 3,840) tokens (after one warm-up step each), drmas without and with
gradient checkpointing against eager PyTorch, each with its process's peak resident memory; and the
ratio of drmas's 4,096-token step to its 512-token step (attention is quadratic in the work, so 8× the
tokens cost more than 8× the time; eager attention also holds every layer's T × T scores).

This machine is noisy (other virtual machines share its cores), so only ratios measured in the
same round mean anything, and the median over rounds is the figure to quote.

Thread settings: drmas runs with what it picks for itself (drmas bench --json reports them:
libtorch intra-op, inter-op and matrix-product threads). PyTorch's matrix products run on OpenBLAS,
so the PyTorch script gets what drmas picks when its own products run on OpenBLAS (the drmas/blas
run: one intra-op thread, one OpenBLAS thread per core; two intra-op threads beside OpenBLAS's
spinning workers measured slower for both), passed explicitly (OpenBLAS's through its own API).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def run_json(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=e).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bin/drmas")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="libtorch intra-op threads for both (0: drmas's default)")
    ap.add_argument("--interop-threads", type=int, default=0, help="libtorch inter-op threads for both (0: drmas's default)")
    ap.add_argument("--blas-threads", type=int, default=0, help="matrix-product threads for both (0: drmas's default)")
    ap.add_argument("--tcmalloc", default=TCMALLOC, help="tcmalloc library for the second PyTorch baseline ('' to skip)")
    ap.add_argument("--no-blas-variant", action="store_true", help="skip the drmas run on libtorch's own BLAS")
    ap.add_argument("--long", action="store_true", help="also the long-sequence rows (1 × (256 + 256) and 1 × (256 + 3,840) tokens)")
    ap.add_argument("--long-lens", default="256,3840", help="response lengths of the long rows (prompt 256)")
    ap.add_argument("--torch-attention", choices=["eager", "sdpa"], default="eager",
                    help="PyTorch's attention: eager (as transformers' eager) or sdpa (PyTorch 2.x's fused kernel, "
                         "transformers' default there)")
    a = ap.parse_args()
    shape = ["--batch", str(a.batch), "--prompt-len", str(a.prompt_len), "--response-len", str(a.response_len),
             "--steps", str(a.steps)]
    tc = a.tcmalloc if a.tcmalloc and os.path.exists(a.tcmalloc) else ""
    summary = []
    with tempfile.TemporaryDirectory(prefix="drmas-bench-") as tmp:
        for preset in a.presets.split(","):
            folder = os.path.join(tmp, preset)
            run_json([a.bin, "bench", "--preset", preset, "--save-model", folder, "--steps", "1",
                      "--batch", "2", "--prompt-len", "4", "--response-len", "2", "--matmul-size", "64", "--json"])
            runs = {}  # name -> list of results, one per round

            def add(name, r):
                runs.setdefault(name, []).append(r)

            for rnd in range(1, a.rounds + 1):
                dcmd = [a.bin, "bench", "--model", folder, "--json", "--threads", str(a.threads),
                        "--interop-threads", str(a.interop_threads), "--blas-threads", str(a.blas_threads)] + shape
                d = run_json(dcmd)
                add("drmas", d)
                # PyTorch's products run on OpenBLAS: it gets the threads drmas picks when its own
                # products run there too (the drmas/blas run), which measured best for OpenBLAS.
                t = {"threads": 1, "interop_threads": d.get("interop_threads", 1), "blas_threads": d["blas_threads"]}
                if not a.no_blas_variant:
                    t = run_json(dcmd, {"DRMAS_GEMM": "blas"})
                    add("drmas/blas", t)
                tcmd = [sys.executable, os.path.join(HERE, "bench_torch.py"), "--model", folder,
                        "--threads", str(a.threads or t["threads"]), "--interop-threads", str(t.get("interop_threads", 0)),
                        "--blas-threads", str(t["blas_threads"]), "--attention", a.torch_attention] + shape
                add("pytorch", run_json(tcmd))
                if tc:
                    add("pytorch+tcmalloc", run_json(tcmd, {"LD_PRELOAD": tc}))
                print(f"{preset} (hidden {d['hidden_size']}, {d['num_hidden_layers']} layers) round {rnd}: threads "
                      f"(intra-op/inter-op/matrix products) drmas {d['threads']}/{d.get('interop_threads', '?')}/{d['blas_threads']} "
                      f"with products on {d.get('gemm', '?')}; OpenBLAS runs (drmas/blas, pytorch) "
                      f"{a.threads or t['threads']}/{t.get('interop_threads', '?')}/{t['blas_threads']}", flush=True)
                for name, rs in runs.items():
                    r = rs[-1]
                    print(f"  {name:17s} train {r['train_ms_per_step']:7.0f} ms/step   generation {r['gen_tokens_per_s']:6.0f} tok/s"
                          f" (decode {r.get('decode_ms_per_step', 0):5.1f} ms/step)   matmul {r['matmul_gflops']:6.1f} GF/s", flush=True)
            summary.append((preset, runs))
        if a.long:
            long_rows(a, tmp)
    print("\nspeed / eager PyTorch's speed, the same round (>1: faster); median [range] over rounds:")
    for preset, runs in summary:
        base = runs["pytorch"]
        for name, rs in runs.items():
            if name == "pytorch":
                continue
            tr = [b["train_ms_per_step"] / r["train_ms_per_step"] for r, b in zip(rs, base)]
            gr = [r["gen_tokens_per_s"] / b["gen_tokens_per_s"] for r, b in zip(rs, base)]
            print(f"  {preset:6s} {name:17s} train step {statistics.median(tr):.2f}x [{min(tr):.2f}-{max(tr):.2f}]   "
                  f"generation {statistics.median(gr):.2f}x [{min(gr):.2f}-{max(gr):.2f}]")
        if "pytorch+tcmalloc" in runs:
            tb = runs["pytorch+tcmalloc"]
            tr = [b["train_ms_per_step"] / r["train_ms_per_step"] for r, b in zip(runs["drmas"], tb)]
            gr = [r["gen_tokens_per_s"] / b["gen_tokens_per_s"] for r, b in zip(runs["drmas"], tb)]
            print(f"  {preset:6s} drmas vs pytorch+tcmalloc  train step {statistics.median(tr):.2f}x [{min(tr):.2f}-{max(tr):.2f}]   "
                  f"generation {statistics.median(gr):.2f}x [{min(gr):.2f}-{max(gr):.2f}]")


def long_rows(a, tmp):
    """The long-sequence rows: one training step per run, drmas (plain and checkpointing) and eager
    PyTorch back to back in each round, with each process's peak resident memory."""
    folder = os.path.join(tmp, "long")
    run_json([a.bin, "bench", "--preset", "long", "--save-model", folder, "--steps", "1", "--no-generate",
              "--batch", "1", "--prompt-len", "4", "--response-len", "2", "--matmul-size", "64", "--json"])
    lens = [int(x) for x in a.long_lens.split(",")]
    runs = {}  # (response len, name) -> results
    for rnd in range(1, a.rounds + 1):
        for R in lens:
            shape = ["--batch", "1", "--prompt-len", "256", "--response-len", str(R), "--steps", "1", "--no-generate"]
            dcmd = [a.bin, "bench", "--model", folder, "--json", "--matmul-size", "512", "--threads", str(a.threads),
                    "--interop-threads", str(a.interop_threads), "--blas-threads", str(a.blas_threads)] + shape
            d = run_json(dcmd)
            runs.setdefault((R, "drmas"), []).append(d)
            runs.setdefault((R, "drmas+ckpt"), []).append(run_json(dcmd + ["--checkpointing"]))
            # PyTorch on OpenBLAS: one intra-op thread, OpenBLAS on every core (its best, as above)
            tcmd = [sys.executable, os.path.join(HERE, "bench_torch.py"), "--model", folder, "--matmul-size", "512",
                    "--threads", str(a.threads or 1), "--interop-threads", str(d.get("interop_threads", 0)),
                    "--blas-threads", str(a.blas_threads or os.cpu_count()), "--attention", a.torch_attention] + shape
            runs.setdefault((R, "pytorch"), []).append(run_json(tcmd))
            for name in ("drmas", "drmas+ckpt", "pytorch"):
                r = runs[(R, name)][-1]
                print(f"long 1×(256+{R}) round {rnd}: {name:11s} train {r['train_ms_per_step']:9.0f} ms/step   "
                      f"peak RSS {r['train_peak_rss_mb']:6.0f} MB", flush=True)
    print("\nlong sequences (one step each; median [range] over rounds):")
    for R in lens:
        base = runs[(R, "pytorch")]
        for name in ("drmas", "drmas+ckpt"):
            rs = runs[(R, name)]
            sp = [b["train_ms_per_step"] / r["train_ms_per_step"] for r, b in zip(rs, base)]
            print(f"  1×(256+{R:<5d}) {name:11s} {statistics.median(sp):5.2f}x PyTorch's speed [{min(sp):.2f}-{max(sp):.2f}]; "
                  f"peak RSS {statistics.median([r['train_peak_rss_mb'] for r in rs]):.0f} MB vs PyTorch's "
                  f"{statistics.median([b['train_peak_rss_mb'] for b in base]):.0f} MB; the plan says "
                  f"{statistics.median([r['plan_peak_mb'] for r in rs]):.0f} MB")
    if len(lens) >= 2:
        lo, hi = min(lens), max(lens)
        for name in ("drmas", "drmas+ckpt", "pytorch"):
            ratio = [h["train_ms_per_step"] / l["train_ms_per_step"] for l, h in zip(runs[(lo, name)], runs[(hi, name)])]
            print(f"  {name:11s} step at 256+{hi} / step at 256+{lo}: {statistics.median(ratio):.1f}x [{min(ratio):.1f}-{max(ratio):.1f}]")


if __name__ == "__main__":
    main()
