#!/usr/bin/python3
"""Golden logits for pkg/policy: tiny random checkpoints of every family (Llama, Qwen2, Qwen3,
Mistral, Gemma) and the logits a plain-PyTorch transcription of Hugging Face's modeling code gives
for fixed token ids.

Run with Debian's python3-torch (no transformers needed), from this folder:

    /usr/bin/python3 golden.py

It writes golden/<name>/{config.json, model.safetensors, logits.json}. The forward below follows
transformers' modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py / modeling_mistral.py /
modeling_gemma.py (eager attention) line by line: RMSNorm in float32, rotate_half rotary embeddings
(with llama3 rope scaling), repeat_kv for grouped-query attention, q/k/v biases for Qwen2, per-head
q_norm/k_norm before RoPE for Qwen3, SiLU-gated MLP, tied or separate lm_head; Mistral's
sliding-window mask (key index > query index - sliding_window, shorter here than the sequence);
Gemma's (1 + w) RMSNorm, GELU (tanh) MLP, embeddings times sqrt(hidden_size) and a head_dim that is
not hidden_size / heads. Weights are drawn with a large scale (and biases and norm
weights are random too) so that a wrong layout changes the logits well beyond the 1e-4 tolerance.
"""
import json
import math
import os
import struct

import torch

torch.manual_seed(0)

MODELS = {
    # llama3-style rope scaling, GQA 2, untied, float32 on disk
    "llama": dict(model_type="llama", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=48, rms_norm_eps=1e-5,
                  rope_theta=500000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                  max_position_embeddings=64, torch_dtype="float32", bos_token_id=1, eos_token_id=2,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=8192)),
    # q/k/v biases, MQA, tied embeddings, bfloat16 on disk
    "qwen2": dict(model_type="qwen2", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, vocab_size=48, rms_norm_eps=1e-6,
                  rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=64,
                  torch_dtype="bfloat16", bos_token_id=None, eos_token_id=[2, 3],
                  use_sliding_window=False),
    # explicit head_dim (8, not 16/4), q_norm/k_norm, GQA 2, untied, float32 on disk
    "qwen3": dict(model_type="qwen3", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=48,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                  attention_bias=False, max_position_embeddings=64, torch_dtype="float32",
                  eos_token_id=2),
    # sliding window of 4 tokens over 9-token rows, GQA 2, untied, float32 on disk
    "mistral": dict(model_type="mistral", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=48, rms_norm_eps=1e-5,
                    rope_theta=10000.0, sliding_window=4, tie_word_embeddings=False,
                    max_position_embeddings=64, torch_dtype="float32", bos_token_id=1, eos_token_id=2),
    # (1 + w) norms, GELU-tanh MLP, scaled embeddings, head_dim 12 (not 16/2), MQA, biases on
    # q/k/v/o (attention_bias), tied embeddings, float32 on disk
    "gemma": dict(model_type="gemma", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=12, vocab_size=48,
                  rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=True,
                  hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                  tie_word_embeddings=True, max_position_embeddings=64, torch_dtype="float32",
                  bos_token_id=2, eos_token_id=1, pad_token_id=0),
}

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "mistral": "MistralForCausalLM", "gemma": "GemmaForCausalLM"}

IDS = [[1, 5, 9, 17, 33, 2, 40, 7, 11], [1, 44, 3, 3, 28, 19, 6, 0, 47]]


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def weights(c):
    """Random weights with HF names; scale 0.3 for matrices, random biases and norm weights."""
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    d = head_dim(c)
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    qkv_bias = c["model_type"] == "qwen2" or c.get("attention_bias", False)
    o_bias = c["model_type"] != "qwen2" and c.get("attention_bias", False)
    norm_around = 0.0 if c["model_type"] == "gemma" else 1.0  # Gemma's norms multiply by (1 + w)
    w = {}

    def mat(name, rows, cols):
        w[name] = torch.randn(rows, cols) * 0.3

    def vec(name, n, around=0.0):
        w[name] = around + torch.randn(n) * 0.2

    mat("model.embed_tokens.weight", v, h)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        vec(p + "input_layernorm.weight", h, norm_around)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            mat(p + f"self_attn.{name}.weight", rows, h)
            if qkv_bias:
                vec(p + f"self_attn.{name}.bias", rows)
        mat(p + "self_attn.o_proj.weight", h, q)
        if o_bias:
            vec(p + "self_attn.o_proj.bias", h)
        if c["model_type"] == "qwen3":
            vec(p + "self_attn.q_norm.weight", d, 1.0)
            vec(p + "self_attn.k_norm.weight", d, 1.0)
        vec(p + "post_attention_layernorm.weight", h, norm_around)
        mat(p + "mlp.gate_proj.weight", i, h)
        mat(p + "mlp.up_proj.weight", i, h)
        mat(p + "mlp.down_proj.weight", h, i)
    vec("model.norm.weight", h, norm_around)
    if not c["tie_word_embeddings"]:
        mat("lm_head.weight", v, h)
    if c["torch_dtype"] == "bfloat16":  # what is on disk is what the reference computes with
        w = {k: t.to(torch.bfloat16).to(torch.float32) for k, t in w.items()}
    return w


def write_safetensors(path, tensors, dtype):
    names = {torch.float32: "F32", torch.bfloat16: "BF16"}
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].to(dtype).contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": names[dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hdr = json.dumps(header, separators=(",", ":")).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for b in blobs:
            f.write(b)


# ---- the reference forward (transformers, eager attention) ----

def rms_norm(x, weight, eps):
    input_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(input_dtype)


def gemma_rms_norm(x, weight, eps):  # GemmaRMSNorm: all in float32, times (1 + w), then cast
    out = x.float()
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(x)


def inv_freq(c):
    d = head_dim(c)
    base = c["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = c.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":  # _compute_llama3_parameters
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_len = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        inv_llama = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
        is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv = torch.where(is_medium, smoothed, inv_llama)
    return inv


def rotary(c, position_ids, dtype):
    inv = inv_freq(c)
    inv_expanded = inv[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    pos_expanded = position_ids[:, None, :].float()
    freqs = (inv_expanded.float() @ pos_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x, n_rep):
    b, kvh, s, d = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(b, kvh, n_rep, s, d)
    return x.reshape(b, kvh * n_rep, s, d)


def linear(x, w, name):
    return torch.nn.functional.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def forward(c, w, ids):
    ids = torch.tensor(ids)
    b, t = ids.shape
    d = head_dim(c)
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    eps = c["rms_norm_eps"]
    gemma = c["model_type"] == "gemma"
    norm = gemma_rms_norm if gemma else rms_norm
    act = (lambda z: torch.nn.functional.gelu(z, approximate="tanh")) if gemma else torch.nn.functional.silu
    x = torch.nn.functional.embedding(ids, w["model.embed_tokens.weight"])
    if gemma:
        x = x * torch.tensor(c["hidden_size"] ** 0.5, dtype=x.dtype)
    position_ids = torch.arange(t)[None, :].expand(b, t)
    cos, sin = rotary(c, position_ids, x.dtype)
    q_idx, kv_idx = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = kv_idx <= q_idx
    if c.get("sliding_window"):  # sliding_window_overlay: kv_idx > q_idx - sliding_window
        allowed = allowed & (kv_idx > q_idx - c["sliding_window"])
    causal = torch.zeros(t, t).masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        residual = x
        hs = norm(x, w[p + "input_layernorm.weight"], eps)
        q = linear(hs, w, p + "self_attn.q_proj").view(b, t, -1, d)
        k = linear(hs, w, p + "self_attn.k_proj").view(b, t, -1, d)
        v = linear(hs, w, p + "self_attn.v_proj").view(b, t, -1, d)
        if c["model_type"] == "qwen3":
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
        attn = torch.matmul(q, k.transpose(2, 3)) * d ** -0.5
        attn = attn + causal
        attn = torch.nn.functional.softmax(attn, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, -1)
        x = residual + linear(out, w, p + "self_attn.o_proj")
        residual = x
        hs = norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = act(linear(hs, w, p + "mlp.gate_proj"))
        x = residual + linear(gate * linear(hs, w, p + "mlp.up_proj"), w, p + "mlp.down_proj")
    x = norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return torch.nn.functional.linear(x, head).float()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for name, c in MODELS.items():
        out = os.path.join(here, "golden", name)
        os.makedirs(out, exist_ok=True)
        w = weights(c)
        disk = torch.bfloat16 if c["torch_dtype"] == "bfloat16" else torch.float32
        write_safetensors(os.path.join(out, "model.safetensors"), w, disk)
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(dict(c, architectures=[ARCHITECTURES[c["model_type"]]]), f, indent=2)
        with torch.no_grad():
            logits = forward(c, w, IDS)
        with open(os.path.join(out, "logits.json"), "w") as f:
            json.dump({"ids": IDS, "logits": [[[float("%.7g" % v) for v in pos] for pos in row]
                                              for row in logits.tolist()]}, f, separators=(",", ":"))
        print(name, "logits", tuple(logits.shape), "range", float(logits.min()), float(logits.max()))


if __name__ == "__main__":
    main()
