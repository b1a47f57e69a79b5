#!/usr/bin/env python3
"""FusionRL's step math against reference.py, in float64.

Generates a pairwise-covering set of settings (every pair of values of any
two settings appears in at least one case; the script checks that it does)
plus named edge cases, each with a random batch (rewards, lengths,
environment-token masks, truncation and exclusion flags, behaviour /
proximal / reference log-probs), runs them through `rl_reference_dump`
(the trainer's own functions in float64) and compares rewards, masks,
advantages, per-token losses, behaviour weights, the loss and its gradient
with respect to the log-probs within 1e-9.

  /usr/bin/python3 tests/rl_reference/check.py --dump BUILD/rl_reference_dump
      [--work DIR] [--show N]

Exit 0: every case agrees; 1: a case differs (the first ones are printed);
77: no torch here (skipped), unless FUSIONRL_REQUIRE_ALL_TESTS=1 (fails).
"""

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    if os.environ.get("FUSIONRL_REQUIRE_ALL_TESTS") == "1":
        sys.exit("FAIL: rl_reference needs Debian's python3-torch "
                 "(FUSIONRL_REQUIRE_ALL_TESTS=1)")
    print("SKIP: rl_reference needs Debian's python3-torch")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

TOL = 1e-9

FACTORS = {
    "adv": ["grpo", "rloo", "reinforce_pp"],
    "norm_by_std": [True, False],
    "agg": ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
            "seq-mean-token-sum-norm"],
    "overlong": ["keep", "mask", "penalize"],
    "correction": ["none", "decoupled-token-truncate", "decoupled-sequence-mask",
                   "decoupled-token-mask", "tis", "mis"],
    "kl_mode": ["none", "loss", "reward"],
    "kl_estimator": ["k1", "k2", "k3"],
    "excluded": [False, True],
    "multi_turn": [False, True],
    "group": [1, 4],
    "gamma": [1.0, 0.9],
    "entropy": [False, True],
    "micro": [False, True],
}


def valid(s):
    """The combinations the job config accepts (config_validation.cc)."""
    if s.get("adv") == "rloo" and s.get("group") == 1:
        return False  # rloo needs group_size >= 2
    if s.get("multi_turn") and s.get("overlong") == "penalize":
        return False  # an environment job refuses the length ramp
    return True


def pairwise(seed=7, tries=200):
    names = list(FACTORS)
    uncovered = set()
    for a, b in itertools.combinations(names, 2):
        for va in FACTORS[a]:
            for vb in FACTORS[b]:
                if valid({a: va, b: vb}):
                    uncovered.add((a, va, b, vb))
    rng = random.Random(seed)
    cases = []
    while uncovered:
        best, best_gain = None, -1
        for _ in range(tries):
            # Start from one uncovered pair, fill the rest at random.
            a, va, b, vb = rng.choice(sorted(uncovered, key=repr))
            s = {n: rng.choice(FACTORS[n]) for n in names}
            s[a], s[b] = va, vb
            if not valid(s):
                continue
            gain = sum(1 for (x, vx, y, vy) in uncovered
                       if s[x] == vx and s[y] == vy)
            if gain > best_gain:
                best, best_gain = s, gain
        cases.append(best)
        uncovered = {p for p in uncovered
                     if not (best[p[0]] == p[1] and best[p[2]] == p[3])}
    return cases


def uncovered_pairs(array):
    """The valid pairs of setting values no case of `array` holds."""
    missing = []
    for a, b in itertools.combinations(list(FACTORS), 2):
        for va in FACTORS[a]:
            for vb in FACTORS[b]:
                if valid({a: va, b: vb}) and not any(
                        f[a] == va and f[b] == vb for f in array):
                    missing.append((a, va, b, vb))
    return missing


def settings_of(f):
    return {
        "adv": f["adv"], "norm_by_std": f["norm_by_std"], "agg": f["agg"],
        "overlong": f["overlong"], "correction": f["correction"],
        "kl_coef": 0.0 if f["kl_mode"] == "none" else 0.05,
        "kl_mode": "loss" if f["kl_mode"] == "none" else f["kl_mode"],
        "kl_estimator": f["kl_estimator"], "group": f["group"],
        "gamma": f["gamma"], "entropy_coef": 0.01 if f["entropy"] else 0.0,
        "clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0,
        "max_new_tokens": 8, "overlong_buffer": 4, "overlong_penalty": 1.0,
        "behaviour_cap": 1.5, "correction_cap": 1.4,
    }


def overrides_of(s):
    o = [
        f"algorithm.adv_estimator={s['adv']}",
        f"algorithm.norm_adv_by_std={'true' if s['norm_by_std'] else 'false'}",
        f"algorithm.loss_agg_mode={s['agg']}",
        f"algorithm.kl_coef={s['kl_coef']}",
        f"algorithm.kl_mode={s['kl_mode']}",
        f"algorithm.kl_estimator={s['kl_estimator']}",
        f"algorithm.gamma={s['gamma']}",
        f"algorithm.entropy_coef={s['entropy_coef']}",
        f"algorithm.clip_ratio_low={s['clip_low']}",
        f"algorithm.clip_ratio_high={s['clip_high']}",
        f"algorithm.clip_ratio_c={s['clip_c']}",
        f"rollout.group_size={s['group']}",
        f"rollout.max_new_tokens={s['max_new_tokens']}",
        f"rollout.overlong={s['overlong']}",
        f"rollout.overlong_buffer={s['overlong_buffer']}",
        f"rollout.overlong_penalty={s['overlong_penalty']}",
    ]
    c = s["correction"]
    if c in ("tis", "mis"):
        o += [f"algorithm.rollout_correction={c}",
              f"algorithm.rollout_correction_cap={s['correction_cap']}"]
    elif c != "none":
        _, level, mode = c.split("-")
        o += ["algorithm.decoupled_loss=true",
              f"algorithm.behaviour_weight_level={level}",
              f"algorithm.behaviour_weight_mode={mode}",
              f"algorithm.behaviour_weight_cap={s['behaviour_cap']}"]
    return o


def random_batch(rng, s, multi_turn, excluded, groups=3):
    """Samples and log-probs for a case: lengths 1..8 (8 = cut unless
    finished there), rewards with ties, environment segments inside
    multi-turn responses, one whole group excluded when asked."""
    group, mnt = s["group"], s["max_new_tokens"]
    n_groups = groups if group > 1 else 6
    samples = []
    for g in range(n_groups):
        for _ in range(group):
            n = rng.randint(1, mnt)
            mask = [1] * n
            if multi_turn and n >= 3:
                a = rng.randint(1, n - 2)
                b = rng.randint(a, n - 2)
                for j in range(a, b + 1):
                    mask[j] = 0
            samples.append({
                "loss_mask": mask,
                "finished": n < mnt or rng.random() < 0.3,
                "excluded": excluded and g == 1,
                "reward": rng.choice([0.0, 1.0, 1.0, -0.25, 0.5]),
            })
    return samples


def logprobs(rng, samples, t_n):
    def mat(f):
        return [[f(b, t) for t in range(t_n)] for b in range(len(samples))]
    logp = mat(lambda b, t: -rng.uniform(0.05, 3.0))
    noise = lambda scale: mat(lambda b, t: logp[b][t] + rng.gauss(0, scale))  # noqa
    return {
        "logp": logp,
        "behaviour_logp": noise(0.4),
        "prox_logp": noise(0.15),
        "ref_logp": noise(0.3),
        "entropy": mat(lambda b, t: rng.uniform(0.1, 2.0)),
    }


def make_case(name, s, samples, rng, micro=None):
    t_n = max(len(x["loss_mask"]) for x in samples)
    case = {"name": name, "settings": s, "overrides": overrides_of(s),
            "samples": samples, **logprobs(rng, samples, t_n)}
    if micro:
        case["micro_batch_size"] = micro
    return case


def named_cases(rng):
    base = settings_of(dict({n: v[0] for n, v in FACTORS.items()}, group=4))
    out = []

    def sample(mask, reward, finished=True, excluded=False):
        return {"loss_mask": mask, "finished": finished, "excluded": excluded,
                "reward": reward}

    # The defect 1: GRPO group [1 (cut), 1, 0, 0] with overlong mask.
    s = dict(base, overlong="mask")
    out.append(make_case("cut_sample_keeps_its_reward_in_the_group", s, [
        sample([1] * 8, 1.0, finished=False), sample([1] * 3, 1.0),
        sample([1] * 5, 0.0), sample([1] * 2, 0.0)], rng))
    # Defect 2: tokens [m m e e m m], reward 1 at the end, gamma 1.
    s = dict(base, adv="reinforce_pp", group=1)
    out.append(make_case("reinforce_pp_credits_earlier_turns", s, [
        sample([1, 1, 0, 0, 1, 1], 1.0), sample([1, 1, 1], 0.0),
        sample([1, 0, 1], 0.5), sample([1, 1, 1, 1, 0, 1], -0.25),
        sample([1], 1.0), sample([1, 1], 0.0)], rng))
    s = dict(base, adv="reinforce_pp", group=1, gamma=0.9,
             kl_coef=0.05, kl_mode="reward", kl_estimator="k2")
    out.append(make_case("reinforce_pp_multi_turn_discount_and_kl", s, [
        sample([1, 0, 0, 1, 1, 0, 1, 1], 1.0, finished=False),
        sample([1, 1, 0, 1], 0.5), sample([0, 1, 1], 1.0),
        sample([1, 1, 1, 0], -0.25), sample([1, 1], 0.0),
        sample([1, 0, 0, 0, 1], 1.0)], rng))
    for adv in ("grpo", "rloo"):
        s = dict(base, adv=adv)
        out.append(make_case(f"{adv}_constant_rewards_in_a_group", s, [
            sample([1] * 3, 1.0), sample([1] * 5, 1.0), sample([1] * 2, 1.0),
            sample([1] * 4, 1.0), sample([1] * 2, 0.0), sample([1] * 6, 1.0),
            sample([1], 0.0), sample([1] * 3, 1.0)], rng))
    for agg in FACTORS["agg"]:
        s = dict(base, agg=agg)
        out.append(make_case(f"all_masked_rows_{agg}", s, [
            sample([0, 0, 0], 1.0), sample([1, 0, 0, 1], 0.0),
            sample([0], 0.5), sample([1], 1.0)], rng))
        s = dict(base, agg=agg, adv="reinforce_pp")
        out.append(make_case(f"single_model_token_{agg}", s, [
            sample([1], 1.0), sample([0, 0, 1], 0.0), sample([1], 0.0),
            sample([0, 1, 0, 0], 1.0)], rng))
    s = dict(base, correction="decoupled-sequence-mask")
    out.append(make_case("whole_batch_excluded", s, [
        sample([1, 1], 1.0, excluded=True), sample([1], 0.0, excluded=True),
        sample([1, 1, 1], 0.0, excluded=True),
        sample([1], 1.0, excluded=True)], rng))
    s = dict(base, overlong="mask")
    out.append(make_case("every_sample_cut_and_masked", s, [
        sample([1] * 8, 1.0, finished=False), sample([1] * 8, 0.0, False),
        sample([1] * 8, 1.0, False), sample([1] * 8, 0.5, False)], rng))
    s = dict(base, group=1, norm_by_std=True)
    out.append(make_case("grpo_group_of_one", s, [
        sample([1, 1], 1.0), sample([1], -0.25), sample([1, 1, 1], 0.0),
        sample([1] * 4, 0.5)], rng))
    return out


def compare(ours, ref, name):
    if "error" in ours:
        return [f"{name}: rl_reference_dump refused the config: {ours['error']}"]
    bad = []
    for key, want in ref.items():
        got = ours.get(key)
        if want is None:
            if got is not None:
                bad.append(f"{name}: {key}: ours set, reference has none")
            continue
        if got is None:
            bad.append(f"{name}: {key}: missing from ours")
            continue
        got = torch.tensor(got, dtype=torch.float64)
        if got.shape != want.shape:
            bad.append(f"{name}: {key}: shape {tuple(got.shape)} vs "
                       f"reference {tuple(want.shape)}")
            continue
        diff = (got - want).abs()
        worst = diff.max().item() if diff.numel() else 0.0
        scale = max(1.0, want.abs().max().item() if want.numel() else 0.0)
        if not worst <= TOL * scale:
            at = divmod(int(diff.argmax()), want.shape[-1]) if want.dim() == 2 \
                else int(diff.argmax()) if want.dim() == 1 else ()
            bad.append(f"{name}: {key}: max |ours - reference| {worst:.3g} at "
                       f"{at}: ours {got.reshape(-1)[int(diff.argmax())]:.9g}, "
                       f"reference {want.reshape(-1)[int(diff.argmax())]:.9g}")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--show", type=int, default=12)
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp()
    os.makedirs(work, exist_ok=True)
    rng = random.Random(52)
    cases = []
    for seed in (7, 8):
        array = pairwise(seed)
        missing = uncovered_pairs(array)
        if missing:
            sys.exit(f"FAIL: the covering array misses {len(missing)} pairs, "
                     f"e.g. {missing[0]}")
        for i, f in enumerate(array):
            s = settings_of(f)
            samples = random_batch(rng, s, f["multi_turn"], f["excluded"])
            micro = 5 if f["micro"] else None
            cases.append(make_case(f"pairwise{seed}_{i:02d}", s, samples, rng,
                                   micro))
    n_pairwise = len(cases)
    cases += named_cases(rng)
    cases_path = os.path.join(work, "cases.json")
    out_path = os.path.join(work, "ours.json")
    with open(cases_path, "w") as f:
        json.dump(cases, f)
    run = subprocess.run([args.dump, cases_path, out_path], timeout=120)
    if run.returncode != 0:
        sys.exit(f"FAIL: rl_reference_dump exited {run.returncode}")
    with open(out_path) as f:
        ours = {c["name"]: c for c in json.load(f)}
    failures, failed_cases = [], 0
    for case in cases:
        bad = compare(ours[case["name"]], reference.step(case), case["name"])
        if bad:
            failed_cases += 1
            failures += bad
    print(f"rl_reference: {n_pairwise} pairwise cases over "
          f"{len(FACTORS)} settings + {len(cases) - n_pairwise} named edge "
          f"cases; tolerance {TOL:g} (relative to max(1, |reference|))")
    for line in failures[:args.show]:
        print("  " + line)
    print(f"{len(cases) - failed_cases} passed, {failed_cases} failed")
    sys.exit(1 if failed_cases else 0)


if __name__ == "__main__":
    main()
