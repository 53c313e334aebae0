#!/usr/bin/python3
"""Golden logits for pkg/policy: tiny random checkpoints of every family (Llama, Qwen2, Qwen3,
Mistral, Gemma, Qwen3-MoE) and the logits a plain-PyTorch transcription of Hugging Face's modeling
code gives for fixed token ids.

Run with Debian's python3-torch (no transformers needed), from this folder:

    /usr/bin/python3 golden.py [name ...]

It writes golden/<name>/{config.json, model.safetensors, logits.json} for the models named (all of
them when none is). `golden.py --check FOLDER IDS GREEDY` instead loads a Qwen3-MoE folder drmas wrote
by key names, as transformers' loader does, and prints the reference's logits, experts and greedy
continuation (TestMoECheckpointLoadsByKeyNames). The committed goldens are those the build of PyTorch that wrote them computed:
another build's logits differ in the last float32 digits, so write only the models you add. The forward below follows
transformers' modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py / modeling_mistral.py /
modeling_gemma.py (eager attention) line by line: RMSNorm in float32, rotate_half rotary embeddings
(with llama3 rope scaling), repeat_kv for grouped-query attention, q/k/v biases for Qwen2, per-head
q_norm/k_norm before RoPE for Qwen3, SiLU-gated MLP, tied or separate lm_head; Mistral's
sliding-window mask (key index > query index - sliding_window, shorter here than the sequence);
Gemma's (1 + w) RMSNorm, GELU (tanh) MLP, embeddings times sqrt(hidden_size) and a head_dim that is
not hidden_size / heads. Weights are drawn with a large scale (and biases and norm
weights are random too) so that a wrong layout changes the logits well beyond the 1e-4 tolerance.

The Qwen3-MoE models (MOE_MODELS) follow transformers' src/transformers/models/qwen3_moe/
modeling_qwen3_moe.py and configuration_qwen3_moe.py (v4.51 – v4.57, whose checkpoints keep one
tensor per expert): Qwen3 attention, Qwen3MoeSparseMoeBlock (router mlp.gate, softmax over the
experts, top-k, renormalized when norm_topk_prob, each picked expert's SwiGLU output weighted by its
probability, experts taken in order and their outputs index_add-ed), a dense Qwen3MoeMLP of
intermediate_size where mlp_only_layers lists the layer or (layer + 1) % decoder_sparse_step != 0,
and load_balancing_loss_func over the sparse layers' router logits with an attention mask. Their
reference runs in float64 throughout (transformers' float32 softmax of the router too), from the
weights as stored, so that a float64 model must match it to 1e-9 and a float32 one to 1e-4; it also
writes each token's experts, the greedy continuation of a prompt (the whole sequence recomputed
for every token) and the load-balancing loss of a right-padded batch.
"""
import json
import math
import os
import struct
import sys

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


# ---- Qwen3-MoE (modeling_qwen3_moe.py), float64 ----

MOE_MODELS = {
    # 4 experts, top-2 renormalized; layer 0 dense (mlp_only_layers), 3 layers; GQA 2, untied,
    # float32 on disk
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=48,
                      rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                      attention_bias=False, max_position_embeddings=64, torch_dtype="float32",
                      eos_token_id=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                      router_aux_loss_coef=0.001, output_router_logits=False, use_sliding_window=False),
    # 4 experts, top-2 not renormalized; layer 0 dense (decoder_sparse_step 2), 2 layers; MQA,
    # tied embeddings, bfloat16 on disk
    "qwen3_moe-nonorm": dict(model_type="qwen3_moe", hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=48,
                             rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
                             attention_bias=False, max_position_embeddings=64, torch_dtype="bfloat16",
                             eos_token_id=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=10,
                             norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
                             router_aux_loss_coef=0.01, output_router_logits=True),
}
MOE_SEEDS = {"qwen3_moe": 53, "qwen3_moe-nonorm": 54}

GREEDY_PROMPT, GREEDY_TOKENS = [1, 5, 9, 17, 33], 10
AUX_IDS = [[1, 5, 9, 17, 33, 2, 40, 7, 11], [1, 44, 3, 3, 28, 19, 0, 0, 0]]
AUX_MASK = [[1] * 9, [1] * 6 + [0] * 3]


def sparse_layer(c, l):
    """Qwen3MoeDecoderLayer: the sparse block unless mlp_only_layers lists the layer or the step skips it."""
    return l not in c["mlp_only_layers"] and c["num_experts"] > 0 and (l + 1) % c["decoder_sparse_step"] == 0


def moe_weights(c):
    """Random weights with HF names (one tensor per expert), as weights() draws them."""
    h, i, v, d = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    q, kv, e, mi = c["num_attention_heads"] * d, c["num_key_value_heads"] * d, c["num_experts"], c["moe_intermediate_size"]
    w = {}

    def mat(name, rows, cols):
        w[name] = torch.randn(rows, cols) * 0.3

    def vec(name, n, around=0.0):
        w[name] = around + torch.randn(n) * 0.2

    mat("model.embed_tokens.weight", v, h)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        vec(p + "input_layernorm.weight", h, 1.0)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            mat(p + f"self_attn.{name}.weight", rows, h)
        mat(p + "self_attn.o_proj.weight", h, q)
        vec(p + "self_attn.q_norm.weight", d, 1.0)
        vec(p + "self_attn.k_norm.weight", d, 1.0)
        vec(p + "post_attention_layernorm.weight", h, 1.0)
        if sparse_layer(c, l):
            w[p + "mlp.gate.weight"] = torch.randn(e, h)  # a router of scale 1: well separated top-k
            for j in range(e):
                mat(p + f"mlp.experts.{j}.gate_proj.weight", mi, h)
                mat(p + f"mlp.experts.{j}.up_proj.weight", mi, h)
                mat(p + f"mlp.experts.{j}.down_proj.weight", h, mi)
        else:
            mat(p + "mlp.gate_proj.weight", i, h)
            mat(p + "mlp.up_proj.weight", i, h)
            mat(p + "mlp.down_proj.weight", h, i)
    vec("model.norm.weight", h, 1.0)
    if not c["tie_word_embeddings"]:
        mat("lm_head.weight", v, h)
    if c["torch_dtype"] == "bfloat16":
        w = {k: t.to(torch.bfloat16).to(torch.float32) for k, t in w.items()}
    return w


def rms_norm64(x, weight, eps):
    """Qwen3MoeRMSNorm in float64 (transformers upcasts to float32; a float64 model computes in float64)."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotary64(c, t):
    """Qwen3MoeRotaryEmbedding (default rope) for positions 0 … t-1, in float64."""
    d = c["head_dim"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None], emb.sin()[None]


def sparse_moe_block(c, w, p, hs):
    """Qwen3MoeSparseMoeBlock.forward: the block's output, its router logits and each token's experts."""
    b, t, hdim = hs.shape
    hs = hs.reshape(-1, hdim)
    router_logits = torch.nn.functional.linear(hs, w[p + "mlp.gate.weight"])
    routing_weights = torch.nn.functional.softmax(router_logits, dim=1)
    routing_weights, selected = torch.topk(routing_weights, c["num_experts_per_tok"], dim=-1)
    if c["norm_topk_prob"]:
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    final = torch.zeros_like(hs)
    expert_mask = torch.nn.functional.one_hot(selected, num_classes=c["num_experts"]).permute(2, 1, 0)
    for j in range(c["num_experts"]):
        idx, top_x = torch.where(expert_mask[j])
        if top_x.numel() == 0:
            continue
        x = hs[top_x]
        e = p + f"mlp.experts.{j}."
        out = torch.nn.functional.linear(
            torch.nn.functional.silu(torch.nn.functional.linear(x, w[e + "gate_proj.weight"]))
            * torch.nn.functional.linear(x, w[e + "up_proj.weight"]), w[e + "down_proj.weight"])
        final.index_add_(0, top_x, out * routing_weights[top_x, idx, None])
    return final.reshape(b, t, hdim), router_logits, selected.reshape(b, t, -1)


def forward_moe(c, w, ids):
    """Qwen3MoeForCausalLM.forward (eager attention, causal mask) in float64: logits [b, t, vocab],
    the sparse layers' router logits and the experts of every token [b, t, layers, k] (-1 in dense
    layers)."""
    w = {k: t.double() for k, t in w.items()}
    ids = torch.tensor(ids)
    b, t = ids.shape
    d, nh, nkv, eps = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    x = torch.nn.functional.embedding(ids, w["model.embed_tokens.weight"])
    cos, sin = rotary64(c, t)
    allowed = torch.arange(t)[None, :] <= torch.arange(t)[:, None]
    causal = torch.zeros(t, t, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)[None, None]
    router_logits, routes = [], torch.full((b, t, c["num_hidden_layers"], c["num_experts_per_tok"]), -1)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        residual = x
        hs = rms_norm64(x, w[p + "input_layernorm.weight"], eps)
        q = rms_norm64(linear(hs, w, p + "self_attn.q_proj").view(b, t, -1, d), w[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm64(linear(hs, w, p + "self_attn.k_proj").view(b, t, -1, d), w[p + "self_attn.k_norm.weight"], eps)
        v = linear(hs, w, p + "self_attn.v_proj").view(b, t, -1, d)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
        attn = torch.matmul(q, k.transpose(2, 3)) * d ** -0.5 + causal
        attn = torch.nn.functional.softmax(attn, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, -1)
        x = residual + linear(out, w, p + "self_attn.o_proj")
        residual = x
        hs = rms_norm64(x, w[p + "post_attention_layernorm.weight"], eps)
        if sparse_layer(c, l):
            hs, logits, picked = sparse_moe_block(c, w, p, hs)
            router_logits.append(logits)
            routes[:, :, l] = picked
        else:
            gate = torch.nn.functional.silu(linear(hs, w, p + "mlp.gate_proj"))
            hs = linear(gate * linear(hs, w, p + "mlp.up_proj"), w, p + "mlp.down_proj")
        x = residual + hs
    x = rms_norm64(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return torch.nn.functional.linear(x, head), tuple(router_logits), routes


def load_balancing_loss_func(gate_logits, num_experts, top_k, attention_mask):
    """transformers' load_balancing_loss_func (modeling_qwen3_moe.py), with an attention mask."""
    concatenated_gate_logits = torch.cat(list(gate_logits), dim=0)
    routing_weights = torch.nn.functional.softmax(concatenated_gate_logits, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected_experts, num_experts)
    batch_size, sequence_length = attention_mask.shape
    num_hidden_layers = concatenated_gate_logits.shape[0] // (batch_size * sequence_length)
    expert_attention_mask = (attention_mask[None, :, :, None, None]
                             .expand((num_hidden_layers, batch_size, sequence_length, top_k, num_experts))
                             .reshape(-1, top_k, num_experts))
    tokens_per_expert = torch.sum(expert_mask.double() * expert_attention_mask, dim=0) / torch.sum(expert_attention_mask, dim=0)
    router_per_expert_attention_mask = (attention_mask[None, :, :, None]
                                        .expand((num_hidden_layers, batch_size, sequence_length, num_experts))
                                        .reshape(-1, num_experts))
    router_prob_per_expert = torch.sum(routing_weights * router_per_expert_attention_mask, dim=0) / torch.sum(
        router_per_expert_attention_mask, dim=0)
    overall_loss = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0))
    return overall_loss * num_experts


def write_moe(here, name, c):
    torch.manual_seed(MOE_SEEDS[name])
    out = os.path.join(here, "golden", name)
    os.makedirs(out, exist_ok=True)
    w = moe_weights(c)
    disk = torch.bfloat16 if c["torch_dtype"] == "bfloat16" else torch.float32
    write_safetensors(os.path.join(out, "model.safetensors"), w, disk)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(c, architectures=["Qwen3MoeForCausalLM"]), f, indent=2)
    with torch.no_grad():
        logits, _, routes = forward_moe(c, w, IDS)
        seq = list(GREEDY_PROMPT)
        for _ in range(GREEDY_TOKENS):  # greedy, the whole sequence recomputed each time
            seq.append(int(forward_moe(c, w, [seq])[0][0, -1].argmax()))
        _, gate_logits, _ = forward_moe(c, w, AUX_IDS)
        aux = load_balancing_loss_func(gate_logits, c["num_experts"], c["num_experts_per_tok"],
                                       torch.tensor(AUX_MASK, dtype=torch.float64))
    with open(os.path.join(out, "logits.json"), "w") as f:
        json.dump({"ids": IDS, "logits": [[[float("%.17g" % v) for v in pos] for pos in row] for row in logits.tolist()],
                   "routes": routes.tolist(), "greedy": {"prompt": GREEDY_PROMPT, "tokens": seq[len(GREEDY_PROMPT):]},
                   "aux": {"ids": AUX_IDS, "mask": AUX_MASK, "loss": float(aux)}}, f, separators=(",", ":"))
    print(name, "logits", tuple(logits.shape), "greedy", seq[len(GREEDY_PROMPT):], "aux", float(aux))


def read_folder(path):
    """A Hugging Face folder as transformers' from_pretrained reads it, by key names: config.json,
    and the weights of model.safetensors or of the shards model.safetensors.index.json lists."""
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    files = ["model.safetensors"]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    dtypes = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16}
    w = {}
    for name in files:
        with open(os.path.join(path, name), "rb") as f:
            b = f.read()
        n = struct.unpack("<Q", b[:8])[0]
        for key, t in json.loads(b[8:8 + n]).items():
            if key == "__metadata__":
                continue
            lo, hi = t["data_offsets"]
            w[key] = torch.frombuffer(bytearray(b[8 + n + lo:8 + n + hi]), dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return c, w


def check(folder, ids, greedy):
    """Loads a Qwen3-MoE folder by key names (read_folder) and prints, as JSON, the reference's logits
    of ids and its greedy continuation of ids[0] by greedy tokens."""
    c, w = read_folder(folder)
    if c["model_type"] != "qwen3_moe":
        sys.exit("check: %s is a %s folder; only qwen3_moe is checked" % (folder, c["model_type"]))
    with torch.no_grad():
        logits, _, routes = forward_moe(c, w, ids)
        seq = list(ids[0])
        for _ in range(greedy):
            seq.append(int(forward_moe(c, w, [seq])[0][0, -1].argmax()))
    json.dump({"logits": logits.tolist(), "routes": routes.tolist(), "greedy": seq[len(ids[0]):]}, sys.stdout)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--check":  # --check FOLDER IDS_JSON GREEDY_TOKENS
        check(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))
        return
    here = os.path.dirname(os.path.abspath(__file__))
    names = sys.argv[1:] or list(MODELS) + list(MOE_MODELS)
    for name in names:
        if name in MOE_MODELS:
            write_moe(here, name, MOE_MODELS[name])
            continue
        c = MODELS[name]
        torch.manual_seed(0)  # each model's draws from its own seed, whichever others are written
        for skipped in list(MODELS)[:list(MODELS).index(name)]:
            weights(MODELS[skipped])
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
