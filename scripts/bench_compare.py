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
                        "--blas-threads", str(t["blas_threads"])] + shape
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


if __name__ == "__main__":
    main()
