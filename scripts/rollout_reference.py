#!/usr/bin/env python3
"""The Python reference for `fusionrl bench-rollout`: a straightforward
PyTorch loop of the same shape as FusionRL's engine, for a side-by-side
measurement.

The model is the policy FusionRL trains (Llama-style: RMSNorm, half-split
rotary positions, grouped-query attention, SwiGLU, an untied or tied LM head)
with random weights. One iteration is what a synchronous GRPO step does:

  rollout  prefill the left-padded prompt batch into a KV cache, then decode
           one token per step for every sequence (temperature sampling with
           torch.multinomial), exactly max_new_tokens tokens each (no stop
           token, so both sides do the same work);
  train    a forward over prompt + response in micro-batches, response
           log-probs, a GRPO-style clipped surrogate with group-normalised
           advantages of random 0/1 rewards, backward, AdamW.

It is written the way a PyTorch user would write it (no custom kernels, no
torch.compile, which Debian's python3-torch 1.13 does not have).

Output: one JSON object on stdout with the median seconds of the measured
iterations and tokens/s. Usage: see --help.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d, heads, kv_heads, head_dim, d_ff, eps):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.mlp_norm = torch.nn.Parameter(torch.ones(d))
        self.wq = torch.nn.Linear(d, heads * head_dim, bias=False)
        self.wk = torch.nn.Linear(d, kv_heads * head_dim, bias=False)
        self.wv = torch.nn.Linear(d, kv_heads * head_dim, bias=False)
        self.wo = torch.nn.Linear(heads * head_dim, d, bias=False)
        self.w1 = torch.nn.Linear(d, d_ff, bias=False)
        self.w3 = torch.nn.Linear(d, d_ff, bias=False)
        self.w2 = torch.nn.Linear(d_ff, d, bias=False)

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    @staticmethod
    def rotate(x, cos, sin):
        x1, x2 = x.chunk(2, -1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def forward(self, x, cos, sin, mask, cache=None, start=0):
        b, t, _ = x.shape
        h = self.norm(x, self.attn_norm)
        q = self.wq(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        if cache is not None:
            ck, cv = cache
            ck[:, :, start:start + t] = k
            cv[:, :, start:start + t] = v
            k, v = ck[:, :, :start + t], cv[:, :, :start + t]
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, 1)
            v = v.repeat_interleave(rep, 1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, -1) @ v
        x = x + self.wo(out.transpose(1, 2).reshape(b, t, -1))
        h = self.norm(x, self.mlp_norm)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Policy(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        head_dim = a.head_dim or a.d_model // a.n_heads
        kv_heads = a.n_kv_heads or a.n_heads
        self.embed = torch.nn.Embedding(a.vocab, a.d_model)
        self.blocks = torch.nn.ModuleList(
            Block(a.d_model, a.n_heads, kv_heads, head_dim, a.d_ff, 1e-6)
            for _ in range(a.n_layers))
        self.norm = torch.nn.Parameter(torch.ones(a.d_model))
        self.head = None if a.tie_embeddings else torch.nn.Linear(a.d_model, a.vocab, bias=False)
        self.kv_heads, self.head_dim, self.eps = kv_heads, head_dim, 1e-6
        inv = a.rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        ang = torch.outer(torch.arange(a.max_seq_len, dtype=torch.float64), inv)
        self.cos, self.sin = ang.cos().float(), ang.sin().float()

    def forward(self, tokens, positions, valid, cache=None, start=0):
        t = tokens.shape[1]
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        k = valid.shape[1]
        key_idx = torch.arange(k).unsqueeze(0)
        query_idx = (torch.arange(t) + start).unsqueeze(1)
        mask = (key_idx <= query_idx).unsqueeze(0) & (
            valid.unsqueeze(1) | (key_idx == query_idx).unsqueeze(0))
        mask = mask.unsqueeze(1)
        x = self.embed(tokens)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, mask, None if cache is None else cache[i], start)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm
        return x

    def logits(self, h):
        return h @ self.embed.weight.t() if self.head is None else self.head(h)


def rollout(model, prompts, max_new, temperature, gen):
    """Left-padded prompts [B, L] (all the same length here) -> responses
    [B, N] and their log-probs."""
    b, plen = prompts.shape
    total = plen + max_new
    cache = [(torch.empty(b, model.kv_heads, total, model.head_dim),
              torch.empty(b, model.kv_heads, total, model.head_dim))
             for _ in model.blocks]
    valid = torch.ones(b, total, dtype=torch.bool)
    positions = torch.arange(plen).unsqueeze(0).expand(b, plen)
    h = model(prompts, positions, valid[:, :plen], cache, 0)
    logits = model.logits(h[:, -1])
    out = torch.empty(b, max_new, dtype=torch.long)
    logp = torch.empty(b, max_new)
    pos = torch.full((b, 1), plen, dtype=torch.long)
    for step in range(max_new):
        lp = torch.log_softmax(logits.float() / temperature, -1)
        nxt = torch.multinomial(lp.exp(), 1, generator=gen)
        out[:, step] = nxt[:, 0]
        logp[:, step] = lp.gather(-1, nxt)[:, 0]
        if step + 1 == max_new:
            break
        h = model(nxt, pos, valid[:, :plen + step + 1], cache, plen + step)
        logits = model.logits(h[:, -1])
        pos = pos + 1
    return out, logp


def train_step(model, opt, prompts, responses, old_logp, group, micro, temperature, gen):
    b, plen = prompts.shape
    n = responses.shape[1]
    rewards = torch.randint(0, 2, (b,), generator=gen).float().view(-1, group)
    adv = ((rewards - rewards.mean(1, keepdim=True)) /
           (rewards.std(1, keepdim=True) + 1e-6)).view(-1)
    seq = torch.cat([prompts, responses], 1)
    positions = torch.arange(plen + n).unsqueeze(0).expand(b, -1)
    valid = torch.ones(b, plen + n, dtype=torch.bool)
    opt.zero_grad(set_to_none=True)
    for s in range(0, b, micro):
        e = min(b, s + micro)
        h = model(seq[s:e], positions[s:e], valid[s:e])
        logits = model.logits(h[:, plen - 1:plen + n - 1]).float() / temperature
        logp = torch.log_softmax(logits, -1).gather(-1, responses[s:e].unsqueeze(-1))[..., 0]
        ratio = torch.exp(logp - old_logp[s:e])
        a = adv[s:e].unsqueeze(1)
        surrogate = torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a)
        loss = -surrogate.sum() / (b * n)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--n-layers", type=int, required=True)
    p.add_argument("--n-heads", type=int, required=True)
    p.add_argument("--n-kv-heads", type=int, default=0)
    p.add_argument("--head-dim", type=int, default=0)
    p.add_argument("--d-ff", type=int, required=True)
    p.add_argument("--max-seq-len", type=int, required=True)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--tie-embeddings", action="store_true")
    p.add_argument("--prompts", type=int, required=True)
    p.add_argument("--group-size", type=int, required=True)
    p.add_argument("--prompt-len", type=int, required=True)
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--micro-batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if a.prompt_len + a.max_new_tokens > a.max_seq_len:
        sys.exit("rollout_reference.py: --prompt-len + --max-new-tokens exceeds --max-seq-len")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    model = Policy(a)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    batch = a.prompts * a.group_size
    rollout_s, train_s = [], []
    for it in range(a.warmup + a.iterations):
        prompts = torch.randint(0, a.vocab, (a.prompts, a.prompt_len), generator=gen)
        prompts = prompts.repeat_interleave(a.group_size, 0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            responses, logp = rollout(model, prompts, a.max_new_tokens, a.temperature, gen)
        responses, logp = responses.clone(), logp.clone()  # out of inference mode
        t1 = time.perf_counter()
        train_step(model, opt, prompts, responses, logp, a.group_size,
                   a.micro_batch_size, a.temperature, gen)
        t2 = time.perf_counter()
        if it >= a.warmup:
            rollout_s.append(t1 - t0)
            train_s.append(t2 - t1)
    tokens = batch * a.max_new_tokens
    r, t = statistics.median(rollout_s), statistics.median(train_s)
    print(json.dumps({
        "engine": "python",
        "torch": torch.__version__,
        "threads": a.threads,
        "tokens_per_iteration": tokens,
        "rollout_seconds": r,
        "train_seconds": t,
        "rollout_tokens_per_second": tokens / r,
        "step_tokens_per_second": tokens / (r + t),
        "iterations": a.iterations,
    }))


if __name__ == "__main__":
    main()
