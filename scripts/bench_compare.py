#!/usr/bin/env python3
"""Side-by-side benchmark: `drmas bench` against eager PyTorch (scripts/bench_torch.py) on the
same model folder, same batch and same thread settings, run back to back, alternating, for each
model size. Prints each round's figures and the ratios (drmas speed / PyTorch speed; above 1 means
drmas is faster), and the range over rounds.

  python3 scripts/bench_compare.py [--bin bin/drmas] [--rounds 3] [--presets tiny,small]

Both processes get the thread settings drmas picks for this machine (drmas bench --json reports
them: libtorch intra-op, inter-op and OpenBLAS threads), passed to the PyTorch script explicitly.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bin/drmas")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="libtorch intra-op threads for both (0: drmas's default)")
    ap.add_argument("--interop-threads", type=int, default=0, help="libtorch inter-op threads for both (0: drmas's default)")
    ap.add_argument("--blas-threads", type=int, default=0, help="OpenBLAS threads for both (0: drmas's default)")
    a = ap.parse_args()
    shape = ["--batch", str(a.batch), "--prompt-len", str(a.prompt_len), "--response-len", str(a.response_len),
             "--steps", str(a.steps)]
    summary = []
    with tempfile.TemporaryDirectory(prefix="drmas-bench-") as tmp:
        for preset in a.presets.split(","):
            folder = os.path.join(tmp, preset)
            run_json([a.bin, "bench", "--preset", preset, "--save-model", folder, "--steps", "1",
                      "--batch", "2", "--prompt-len", "4", "--response-len", "2", "--matmul-size", "64", "--json"])
            ratios = {"train": [], "gen": []}
            for rnd in range(1, a.rounds + 1):
                d = run_json([a.bin, "bench", "--model", folder, "--json", "--threads", str(a.threads),
                              "--interop-threads", str(a.interop_threads), "--blas-threads", str(a.blas_threads)] + shape)
                t = run_json([sys.executable, os.path.join(HERE, "bench_torch.py"), "--model", folder,
                              "--threads", str(d["threads"]), "--interop-threads", str(d.get("interop_threads", 0)),
                              "--blas-threads", str(d["blas_threads"])] + shape)
                tr = t["train_ms_per_step"] / d["train_ms_per_step"]
                gr = d["gen_tokens_per_s"] / t["gen_tokens_per_s"]
                ratios["train"].append(tr)
                ratios["gen"].append(gr)
                print(f"{preset} (hidden {d['hidden_size']}, {d['num_hidden_layers']} layers) round {rnd}: "
                      f"threads {d['threads']}/{d.get('interop_threads', '?')}/{d['blas_threads']} (intra/inter/BLAS)\n"
                      f"  train step  drmas {d['train_ms_per_step']:7.0f} ms   pytorch {t['train_ms_per_step']:7.0f} ms   ratio {tr:.2f}x\n"
                      f"  generation  drmas {d['gen_tokens_per_s']:7.0f} tok/s pytorch {t['gen_tokens_per_s']:7.0f} tok/s ratio {gr:.2f}x"
                      f"   (decode {d['decode_ms_per_step']:.1f} vs {t['decode_ms_per_step']:.1f} ms/step)\n"
                      f"  matmul      drmas {d['matmul_gflops']:7.1f} GF/s  pytorch {t['matmul_gflops']:7.1f} GF/s", flush=True)
            summary.append((preset, ratios))
    print("\ndrmas speed / eager PyTorch speed (>1: drmas faster), range over rounds:")
    for preset, r in summary:
        print(f"  {preset:6s} train step {min(r['train']):.2f}-{max(r['train']):.2f}x   "
              f"generation {min(r['gen']):.2f}-{max(r['gen']):.2f}x")


if __name__ == "__main__":
    main()
