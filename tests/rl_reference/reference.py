"""An independent implementation of FusionRL's RL step math, in float64.

Written from the published formulas, not from FusionRL's C++:
  * verl `trainer/ppo/core_algos.py`: GRPO (group mean, unbiased std, eps
    1e-6 on the std, a lone response has mean 0 and std 1), RLOO
    (s_i * n/(n-1) - mean * n/(n-1)), REINFORCE++ (discounted returns of
    token rewards, `masked_whiten` with the unbiased variance and eps 1e-8),
    the KL estimators (`kl_penalty`: k1 "kl", k2 "mse", k3 "low_var_kl"
    with its clamps), the dual-clip PPO surrogate (`compute_policy_loss`,
    log-ratio clamped to [-20, 20]), the loss aggregation modes (`agg_loss`);
  * DAPO: clip-higher, the soft overlong punishment
    min(-(L - (L_max - B)) / B * penalty, 0), overlong filtering (the cut
    sample leaves the loss only);
  * Dr.GRPO: no std normalisation, token sums divided by the constant
    generation budget;
  * decoupled PPO (AReaL `ppo_actor_loss_fn`): ratio against the proximal
    policy, each token's loss times the behaviour importance weight
    pi_prox / pi_behaviour, masked above the cap (or truncated), per token
    or per sequence; TIS (truncated at the cap) and MIS (masked outside
    [1/cap, cap]).

FusionRL's documented choices where these sources differ or are silent
(docs/testing.md "The RL math reference"):
  * REINFORCE++ over a multi-turn episode: an environment token passes the
    return on unchanged, discounting counts the policy's tokens only, and
    only the padding after the episode resets it (verl's loop resets at
    every mask hole, meant for the padding after EOS);
  * masked_whiten with fewer than 2 valid entries gives 0 (verl raises);
  * the seq-mean modes count the sequences with at least one loss token;
    seq-mean-token-sum-norm divides by num_seqs * max(T, max_new_tokens);
  * an excluded sample (a whole group, over-stale or failed) leaves every
    statistic; an overlong-masked one leaves only the loss.
"""

import torch

DT = torch.float64
GRPO_EPS = 1e-6
WHITEN_EPS = 1e-8


def masks(case, s):
    """episode, token and loss masks [B, T] of a case."""
    samples = case["samples"]
    t_n = max(1, max(len(x["loss_mask"]) for x in samples))
    b_n = len(samples)
    episode = torch.zeros(b_n, t_n, dtype=DT)
    token = torch.zeros(b_n, t_n, dtype=DT)
    loss = torch.zeros(b_n, t_n, dtype=DT)
    for b, x in enumerate(samples):
        n = len(x["loss_mask"])
        episode[b, :n] = 1
        if x["excluded"]:
            continue
        token[b, :n] = torch.tensor(x["loss_mask"], dtype=DT)
        cut_masked = s["overlong"] == "mask" and not x["finished"]
        if not cut_masked:
            loss[b] = token[b]
    return episode, token, loss


def rewards_of(case, s):
    out = []
    for x in case["samples"]:
        r = x["reward"]
        if s["overlong"] == "penalize" and not x["excluded"]:
            length = len(x["loss_mask"])
            expected = s["max_new_tokens"] - s["overlong_buffer"]
            exceed = length - expected
            r += min(-exceed / s["overlong_buffer"] * s["overlong_penalty"], 0.0)
        out.append(r)
    return torch.tensor(out, dtype=DT)


def kl_penalty(logp, ref, estimator):
    if estimator == "k1":
        return logp - ref
    if estimator == "k2":
        return 0.5 * (logp - ref).square()
    kl = torch.clamp(ref - logp, -20, 20)
    return torch.clamp(kl.exp() - kl - 1, -10, 10)


def grpo(returns, group, norm_by_std):
    out = torch.zeros_like(returns)
    for g in range(0, len(returns), group):
        x = returns[g:g + group]
        if group == 1:
            mean, std = torch.tensor(0.0, dtype=DT), torch.tensor(1.0, dtype=DT)
        else:
            mean, std = x.mean(), x.std(unbiased=True)
        out[g:g + group] = (x - mean) / (std + GRPO_EPS) if norm_by_std else x - mean
    return out


def rloo(returns, group):
    out = torch.zeros_like(returns)
    for g in range(0, len(returns), group):
        x = returns[g:g + group]
        n = len(x)
        out[g:g + group] = x * n / (n - 1) - x.mean() * n / (n - 1)
    return out


def masked_whiten(values, mask):
    n = mask.sum()
    if n < 2:
        return torch.zeros_like(values)
    mean = (values * mask).sum() / n
    var = (((values - mean) ** 2) * mask).sum() / n * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS) * mask


def reinforce_pp(token_rewards, token, episode, gamma):
    b_n, t_n = token.shape
    returns = torch.zeros(b_n, t_n, dtype=DT)
    for b in range(b_n):
        running = 0.0
        for t in reversed(range(t_n)):
            if episode[b, t] == 0:
                running = 0.0  # padding after the episode
                continue
            if token[b, t] == 1:
                running = token_rewards[b, t].item() + gamma * running
            else:
                running = token_rewards[b, t].item() + running  # environment
            returns[b, t] = running
    return masked_whiten(returns, token)


def advantages(case, s, r, episode, token, old, ref):
    kl_tok = None
    if s["kl_coef"] > 0 and s["kl_mode"] == "reward":
        kl_tok = kl_penalty(old, ref, s["kl_estimator"]) * token
    if s["adv"] == "reinforce_pp":
        tr = torch.zeros_like(token)
        for b, x in enumerate(case["samples"]):
            tr[b, len(x["loss_mask"]) - 1] = r[b]
        if kl_tok is not None:
            tr = tr - s["kl_coef"] * kl_tok
        return reinforce_pp(tr, token, episode, s["gamma"])
    returns = r.clone()
    if kl_tok is not None:
        returns = returns - s["kl_coef"] * kl_tok.sum(1)
    if s["adv"] == "rloo":
        seq = rloo(returns, s["group"])
    else:
        seq = grpo(returns, s["group"], s["norm_by_std"])
    return seq[:, None] * token


def behaviour_weights(prox, behaviour, mask, s):
    corr = s["correction"]
    if corr == "none":
        return None
    if corr == "tis":
        level, cap, mode, floor = "token", s["correction_cap"], "truncate", 0.0
    elif corr == "mis":
        cap = s["correction_cap"]
        level, mode, floor = "token", "mask", 1.0 / cap
    else:  # decoupled-<level>-<mode>
        _, level, mode = corr.split("-")
        cap, floor = s["behaviour_cap"], 0.0
    d = torch.clamp((prox - behaviour) * mask, -20, 20)
    if level == "token":
        w = d.exp()
    else:
        w = torch.clamp(d.sum(1, keepdim=True), -20, 20).exp().expand_as(d)
    if mode == "truncate":
        w = torch.clamp(w, max=cap)
    else:
        keep = (w <= cap) & (w >= floor)
        w = torch.where(keep, w, torch.zeros_like(w))
    return w * mask


def agg(loss_mat, mask, mode, max_new_tokens):
    total = (loss_mat * mask).sum()
    seqs = float((mask.sum(1) > 0).sum())
    num_seqs = max(1.0, seqs)
    if mode == "token-mean":
        n = mask.sum()
        return total / n if n > 0 else total * 0
    if mode == "seq-mean-token-mean":
        per_seq = (loss_mat * mask).sum(1) / torch.clamp(mask.sum(1), min=1)
        return per_seq.sum() / num_seqs
    if mode == "seq-mean-token-sum":
        return total / num_seqs
    max_len = max(mask.shape[1], max_new_tokens)
    return total / (num_seqs * max_len)


def ppo_per_token(logp, old, adv, s):
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - s["clip_low"], 1 + s["clip_high"])
    clip1 = torch.maximum(l1, l2)
    if s["clip_c"] <= 1:
        return clip1
    clip2 = torch.minimum(-adv * s["clip_c"], clip1)
    return torch.where(adv < 0, clip2, clip1)


def step(case):
    """Everything the trainer computes for one case, as a dict of tensors."""
    s = case["settings"]
    t = lambda k: torch.tensor(case[k], dtype=DT)  # noqa: E731
    episode, token, loss_mask = masks(case, s)
    r = rewards_of(case, s)
    behaviour, prox, ref, entropy = (t("behaviour_logp"), t("prox_logp"),
                                     t("ref_logp"), t("entropy"))
    recompute = s["correction"] != "none"
    old = prox if recompute else behaviour
    adv = advantages(case, s, r, episode, token, old, ref)
    w = behaviour_weights(prox, behaviour, loss_mask, s)
    logp = t("logp").requires_grad_(True)
    per_token = ppo_per_token(logp, old, adv, s)
    if w is not None:
        per_token = per_token * w
    mode, mnt = s["agg"], s["max_new_tokens"]
    loss = agg(per_token, loss_mask, mode, mnt)
    if s["kl_coef"] > 0 and s["kl_mode"] == "loss":
        loss = loss + s["kl_coef"] * agg(kl_penalty(logp, ref, s["kl_estimator"]),
                                         loss_mask, mode, mnt)
    if s["entropy_coef"] > 0:
        loss = loss - s["entropy_coef"] * agg(entropy, loss_mask, mode, mnt)
    (grad,) = torch.autograd.grad(loss, logp)
    return {
        "rewards": r,
        "loss_mask": loss_mask,
        "advantages": adv,
        "pg_per_token": (per_token * loss_mask).detach(),
        "loss": loss.detach(),
        "grad_logp": grad,
        "weights": w,
    }
