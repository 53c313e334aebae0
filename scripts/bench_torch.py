#!/usr/bin/env python3
"""Eager PyTorch counterpart of `drmas bench`: the same work on the same model folder.

Loads a Hugging Face Qwen2/Llama folder (config.json + model.safetensors, as `drmas bench
--save-model` writes it) into a plain PyTorch module written the way transformers' modeling_qwen2
is (nn.Linear projections, RMSNorm in float32, rotary tables computed per forward, eager attention
with repeat_kv, a cache that grows by torch.cat as DynamicCache does), then times:

  train step   B sequences of P random prompt tokens + R random response tokens: forward with
               grad, lm_head on the R positions that predict response tokens, token-mean of
               -log p(response token), backward, torch.optim.AdamW(lr 1e-5, weight decay 0.01);
  generation   R tokens for B prompts of P tokens: one prefill, then one step per token with the
               KV cache, lm_head on the last position only, temperature-1 multinomial sampling and
               the log-prob of the chosen token (as drmas records it);
  matmul       a 2048² float32 matmul, for calibration.

Thread settings are explicit so both sides run with the same ones: --threads (libtorch intra-op),
--interop-threads and --blas-threads (OpenBLAS's own API). Prints JSON with the keys drmas bench
--json uses. Needs only torch (Debian: apt-get install python3-torch) and the standard library.
"""
import argparse
import ctypes
import ctypes.util
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION = "eager"  # --attention

ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def load_safetensors(path):
    """Reads a safetensors file into a dict of tensors (the format is a JSON header + raw data)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = bytearray(f.read())
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        start, end = t["data_offsets"]
        dt = ST_DTYPES[t["dtype"]]
        buf = data[start:end]
        out[name] = torch.frombuffer(buf, dtype=dt).reshape(t["shape"]).clone() if end > start else torch.empty(t["shape"], dtype=dt)
    return out


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dt)


class Rotary(nn.Module):
    def __init__(self, head_dim, theta):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x, n):
    if n == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)


class Attention(nn.Module):
    def __init__(self, c, bias):
        super().__init__()
        h = c["hidden_size"]
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or h // self.heads
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.scale = self.head_dim ** -0.5

    def forward(self, x, cos, sin, mask, cache, layer):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        if cache is not None:
            if len(cache) > layer:
                k = torch.cat([cache[layer][0], k], dim=-2)
                v = torch.cat([cache[layer][1], v], dim=-2)
                cache[layer] = (k, v)
            else:
                cache.append((k, v))
        k = repeat_kv(k, self.heads // self.kv_heads)
        v = repeat_kv(v, self.heads // self.kv_heads)
        if ATTENTION == "sdpa":  # transformers' attn_implementation="sdpa" (its default on PyTorch 2.x)
            causal = mask is not None and k.shape[2] == t
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask, is_causal=causal, scale=self.scale)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        w = torch.matmul(q, k.transpose(2, 3)) * self.scale
        if mask is not None:
            w = w + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(w, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c, bias):
        super().__init__()
        self.self_attn = Attention(c, bias)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask, cache, layer):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        bias = c["model_type"] == "qwen2" or c.get("attention_bias", False)
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c, bias) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        self.rotary_emb = Rotary(head_dim, c.get("rope_theta", 10000.0))

    def forward(self, ids, cache=None):
        b, t = ids.shape
        past = cache[0][0].shape[2] if cache else 0
        pos = torch.arange(past, past + t).unsqueeze(0).expand(b, -1)
        x = self.embed_tokens(ids)
        cos, sin = self.rotary_emb(x, pos)
        mask = None
        if t > 1:  # causal mask for the new tokens; a single new token sees every key
            mask = torch.full((t, past + t), torch.finfo(x.dtype).min).triu(past + 1)[None, None]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i)
        return self.norm(x)


class CausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = Decoder(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c.get("tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight


def load_model(folder):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("rms_norm_eps", 1e-6)
    m = CausalLM(c)
    weights = load_safetensors(os.path.join(folder, "model.safetensors"))
    missing, unexpected = m.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and c.get("tie_word_embeddings"))]
    if missing or unexpected:
        sys.exit(f"bench_torch: {folder}: missing {missing}, unexpected {unexpected}")
    return m.float(), c


def set_blas_threads(n):
    """Sets OpenBLAS's thread count through its own API; returns the count after (or -1)."""
    for name in ("openblas", "blas"):
        path = ctypes.util.find_library(name)
        if not path:
            continue
        try:
            lib = ctypes.CDLL(path)
            if n > 0:
                lib.openblas_set_num_threads(n)
            return lib.openblas_get_num_threads()
        except (OSError, AttributeError):
            continue
    return -1


def matmul_gflops(n):
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    reps = 1
    while True:
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        sec = time.perf_counter() - start
        if sec > 0.3:
            return 2 * n ** 3 * reps / sec / 1e9
        reps = math.ceil(reps * 0.4 / max(sec, 1e-6))


def train_bench(m, ids, P, steps):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, weight_decay=0.01)
    targets = ids[:, P:]

    def step():
        h = m.model(ids)[:, P - 1:-1]  # the positions that predict response tokens
        logits = m.lm_head(h).float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        loss = -logp.mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if math.isnan(loss.item()):
            sys.exit("bench_torch: loss is NaN")

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


@torch.no_grad()
def generate(m, prompts, n, gen):
    cache = []
    h = m.model(prompts, cache)[:, -1:]
    toks = []
    for i in range(n):
        logits = m.lm_head(h).float()[:, -1]
        probs = torch.softmax(logits, dim=-1)
        tok = torch.multinomial(probs, 1, generator=gen)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, tok)
        toks.append(tok)
        logp.tolist()  # the host reads each step's tokens and log-probs (stop checks)
        tok.tolist()
        if i + 1 < n:
            h = m.model(tok, cache)
    return torch.cat(toks, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: libtorch's default)")
    ap.add_argument("--interop-threads", type=int, default=0, help="inter-op threads (0: default)")
    ap.add_argument("--blas-threads", type=int, default=0, help="OpenBLAS threads (0: its default)")
    ap.add_argument("--matmul-size", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--attention", choices=["eager", "sdpa"], default="eager",
                    help="eager: transformers' eager attention (scores in float32, mask added, softmax); "
                         "sdpa: torch's scaled_dot_product_attention (PyTorch 2.x; transformers' default there)")
    ap.add_argument("--no-generate", action="store_true", help="time the training step only")
    a = ap.parse_args()
    global ATTENTION
    ATTENTION = a.attention
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.interop_threads > 0:
        torch.set_num_interop_threads(a.interop_threads)
    blas = set_blas_threads(a.blas_threads)
    torch.manual_seed(a.seed)
    m, c = load_model(a.model)
    B, P, R = a.batch, a.prompt_len, a.response_len
    ids = torch.randint(0, c["vocab_size"], (B, P + R))
    r = {"impl": "pytorch " + torch.__version__, "attention": a.attention, "threads": torch.get_num_threads(),
         "interop_threads": torch.get_num_interop_threads(), "blas_threads": blas,
         "params": sum(p.numel() for p in m.parameters())}
    r["matmul_gflops"] = matmul_gflops(a.matmul_size)
    sec = train_bench(m, ids, P, a.steps)
    r["train_ms_per_step"] = sec * 1000
    r["train_tokens_per_s"] = B * (P + R) / sec
    r["train_peak_rss_mb"] = __import__("resource").getrusage(0).ru_maxrss / 1024
    if a.no_generate:
        json.dump(r, sys.stdout, indent=2)
        print()
        return
    gen = torch.Generator().manual_seed(a.seed)
    prompts = ids[:, :P]
    generate(m, prompts, 2, gen)  # warm-up
    prefill = math.inf
    for _ in range(3):
        start = time.perf_counter()
        generate(m, prompts, 1, gen)
        prefill = min(prefill, time.perf_counter() - start)
    start = time.perf_counter()
    generate(m, prompts, R, gen)
    total = time.perf_counter() - start
    r["gen_seconds"] = total
    r["gen_tokens_per_s"] = B * R / total
    if R > 1:
        r["decode_ms_per_step"] = (total - prefill) / (R - 1) * 1000
    r["max_rss_mb"] = __import__("resource").getrusage(0).ru_maxrss / 1024
    json.dump(r, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
