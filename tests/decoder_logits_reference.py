#!/usr/bin/python3
"""Every decoder path's logits against a float64 PyTorch reference.

Writes small Hugging Face directories (Llama / Qwen2 / Qwen3 with real head
sizes, 64 and 128, grouped-query heads, Qwen3's q/k norm, Qwen2's q/k/v
biases, tied and untied heads, default / linear / llama3 rotary scaling)
with random bf16-valued weights, asks the engine (the decoder_logits_dump
tool, tests/decoder_logits/decoder_logits_dump.cc) for the logits of sequences of
hundreds of tokens through each of its decoder paths, and compares them with
a float64 forward of the same weights written from the Hugging Face modeling
formulas (scripts/make_hf_fixtures.py's `forward`, never from FusionRL's
code).

Paths compared (docs/testing.md, "Decoders against a float64 reference"):
  forward            PolicyModel::Forward, fused attention core (training)
  forward_composite  the same with model.attention_kernel: composite
  kv_cache           ForwardCached: the prompt in one call, then one token
                     a call (incremental decode against the full forward)
  cpu_decoder        the fused CpuDecoder (float32 rollout), prefilled as
                     the rollout prefills it, stepped token by token
  trainer_logp       ResponseTokenLogProbs, the trainer's chunked head
                     (autograd on, as in training), log-probs of the tokens
  trainer_logp_full  ResponseLogProbs (whole-vocabulary log-softmax)
  rollout_fused /    RolloutEngine greedy generation: each token's recorded
  rollout_composite  log-prob against the reference's log-softmax on the
                     generated sequence, and each token a reference argmax
                     within the bound

Error measure: for each sequence, max |x - ref| over every compared position
and vocabulary entry, divided by max |ref logit| over the same positions
(scale-relative; log-probs are measured the same way, against the logits'
scale). Bounds: float32 1e-5; bfloat16 the bound derived in BF16_BOUND.

Exit: 0 all within bounds; 1 a bound broken (the table says which); 77 no
torch in /usr/bin/python3 (a failure under FUSIONRL_REQUIRE_ALL_TESTS=1 or
CI=true).

Usage: decoder_logits_reference.py --dump PATH_TO_decoder_logits_dump
           --work DIR [--only CASE] [--keep]
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        msg = ("decoder_logits_reference: %s has no torch "
               "(apt-get install python3-torch)" % sys.executable)
        if (os.environ.get("FUSIONRL_REQUIRE_ALL_TESTS") == "1" or
                os.environ.get("CI") == "true"):
            print("FAIL: " + msg)
            sys.exit(1)
        print("SKIP: " + msg)
        sys.exit(77)


require_torch()
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import make_hf_fixtures as hf  # noqa: E402  (the reference forward)

VOCAB = 1024
LAYERS = 2

# float32: the bound. The engine computes in float32 with float32
# accumulation; two layers over a few hundred positions measure ~1e-6.
F32_BOUND = 1e-5

# bfloat16: every activation the composite path rounds to bf16 (8
# significant bits, unit roundoff u = 2^-8) adds a relative error of at most
# u. Along the path from the embedding to the logits a layer rounds 15
# times (norm output; q, k, v projections; q/k norm; rotary; scores;
# probabilities; attention output; o_proj; residual sum; norm output;
# gate and up projections; SiLU; their product; down projection; residual
# sum: counted as 15 for every architecture) and the head twice (final norm,
# logits); with each rounding's error carried forward at first order, the
# logits are within (15 L + 2) u of the float64 logits, relative to their
# scale: 32 u = 0.125 for two layers. Measured: 0.6-1.9 % (the tables).
BF16_UNIT_ROUNDOFF = 2.0 ** -8
BF16_ROUNDINGS_PER_LAYER = 15
BF16_BOUND = (BF16_ROUNDINGS_PER_LAYER * LAYERS + 2) * BF16_UNIT_ROUNDOFF

BOUNDS = {"float32": F32_BOUND, "bfloat16": BF16_BOUND}

# (name, architecture, hidden, heads, kv heads, head_dim (None: the config
# has no head_dim key), rope theta, rope scaling, tied, seed)
CASES = [
    # Issue 52, defect 5: Qwen3 without head_dim, so 128 (Qwen3Config's
    # default), hidden 64, GQA 4/2, q/k norm, tied.
    ("qwen3-hd128", "qwen3", 64, 4, 2, None, 1e6, None, True, 11),
    ("qwen3-hd64", "qwen3", 128, 4, 1, 64, 1e6, None, False, 12),
    ("qwen2-hd64", "qwen2", 256, 4, 2, 64, 1e6, None, True, 13),
    ("llama3-hd64", "llama", 128, 2, 1, 64, 5e5,
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
     False, 14),
    ("llama-linear-hd128", "llama", 256, 4, 2, 128, 1e4,
     {"rope_type": "linear", "factor": 4.0}, False, 15),
]

# (prompt length, total length) of each sequence: hundreds of positions.
SEQUENCES = [(37, 300), (12, 190)]
GREEDY_NEW_TOKENS = 40
MAX_POSITIONS = 512


def case_cfg(case):
    name, arch, hidden, nh, nkv, hd, theta, scaling, tie, _ = case
    head_dim = hd if hd is not None else (128 if arch == "qwen3" else hidden // nh)
    return dict(arch=arch, hidden_size=hidden, num_hidden_layers=LAYERS,
                intermediate_size=2 * hidden, max_position_embeddings=MAX_POSITIONS,
                rms_norm_eps=1e-6, vocab_size=VOCAB, num_attention_heads=nh,
                num_key_value_heads=nkv, head_dim=head_dim, qkv_bias=arch == "qwen2",
                qk_norm=arch == "qwen3", tie=tie, rope_theta=theta,
                rope_scaling=scaling)


def write_model(case, cfg, out_dir):
    """config.json as transformers writes it (head_dim dropped where the case
    says so) and model.safetensors of bf16 weights; returns the weights."""
    os.makedirs(out_dir, exist_ok=True)
    config = json.loads(hf.hf_config_json(cfg))
    if case[5] is None:
        config.pop("head_dim", None)
    # The tiny vocabulary's own special ids (nothing here stops at them).
    config["bos_token_id"], config["eos_token_id"] = 1, 2
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    weights = hf.make_weights_bf16(cfg, case[9])
    hf.write_safetensors(os.path.join(out_dir, "model.safetensors"), weights)
    back, _ = hf.read_safetensors(os.path.join(out_dir, "model.safetensors"))
    for n, t in weights.items():
        assert torch.equal(back[n].view(torch.int16), t.view(torch.int16)), n
    return weights


def read_dump(path):
    """The dump's F32 / I64 tensors (safetensors, read independently)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    types = {"F32": torch.float32, "I64": torch.int64}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=types[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out


class Reference:
    """float64 logits of a model's sequences, cached by token tuple."""

    def __init__(self, cfg, weights):
        self.cfg = cfg
        self.w = {k: v.to(torch.float64) for k, v in weights.items()}
        self.cache = {}

    def logits(self, ids):
        key = tuple(ids)
        if key not in self.cache:
            self.cache[key] = hf.forward(self.cfg, self.w, torch.tensor([ids]))[0]
        return self.cache[key]


def rel(diff, scale):
    return float(diff.abs().max()) / scale


def compare_case(ref, dump, seqs, dtype):
    """{path: worst relative error over the sequences}, plus notes."""
    errors, notes = {}, []

    def note(path, value):
        errors[path] = max(errors.get(path, 0.0), value)

    for b, ids in enumerate(seqs["ids"]):
        p = seqs["prompt_len"][b]
        full = ref.logits(ids)                                # [T, V]
        scale = float(full.abs().max())
        for path in ("forward", "forward_composite", "kv_cache"):
            key = "%s/%d" % (path, b)
            if key in dump:
                note(path, rel(dump[key].double() - full, scale))
        key = "cpu_decoder/%d" % b
        if key in dump:  # steps feed tokens p..T-1: logits at those positions
            part = full[p:]
            note("cpu_decoder", rel(dump[key].double() - part, float(part.abs().max())))
        resp = full[p - 1:-1]                                 # predicts ids[p:]
        lp_ref = torch.log_softmax(resp, -1).gather(
            -1, torch.tensor(ids[p:])[:, None])[:, 0]
        for path in ("trainer_logp", "trainer_logp_full"):
            key = "%s/%d" % (path, b)
            if key in dump:
                note(path, rel(dump[key].double() - lp_ref, float(resp.abs().max())))
        for path in ("rollout_fused", "rollout_composite"):
            key = "%s/%d/tokens" % (path, b)
            if key not in dump:
                continue
            gen = dump[key].tolist()
            logits = ref.logits(ids[:p] + gen[:-1])[p - 1:]   # predicts gen
            sc = float(logits.abs().max())
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen)[:, None])[:, 0]
            note(path, rel(dump["%s/%d/logp" % (path, b)].double() - lp, sc))
            # Greedy: each token is an argmax of the reference within the
            # error the bound allows (2 x bound x scale: both logits move).
            shortfall = (logits.max(-1).values -
                         logits.gather(-1, torch.tensor(gen)[:, None])[:, 0])
            note(path + "_argmax", float(shortfall.max()) / (2 * sc))
            if dtype == "float32":
                want = greedy_reference(ref, ids[:p], len(gen))
                same = next((i for i, (a, c) in enumerate(zip(gen, want)) if a != c), None)
                notes.append("%s seq %d: %s" % (
                    path, b, "greedy tokens equal the reference's" if same is None else
                    "first differs from the reference's greedy at token %d (%d vs %d)"
                    % (same, gen[same], want[same])))
    return errors, notes


def greedy_reference(ref, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(ref.logits(ids)[-1].argmax()))
    return ids[len(prompt):]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="the decoder_logits_dump binary")
    ap.add_argument("--work", required=True, help="scratch directory (replaced)")
    ap.add_argument("--only", help="run this case only")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    gen = torch.Generator().manual_seed(52)
    jobs, refs = [], {}
    for case in CASES:
        if args.only and case[0] != args.only:
            continue
        cfg = case_cfg(case)
        model_dir = os.path.join(args.work, case[0])
        weights = write_model(case, cfg, model_dir)
        ids = [torch.randint(3, VOCAB, (total,), generator=gen).tolist()
               for _, total in SEQUENCES]
        seqs = {"ids": ids, "prompt_len": [p for p, _ in SEQUENCES]}
        refs[case[0]] = (Reference(cfg, weights), seqs, cfg)
        for dtype in ("float32", "bfloat16"):
            jobs.append({"name": "%s/%s" % (case[0], dtype), "dir": model_dir,
                         "dtype": dtype, "sequences": seqs,
                         "greedy_new_tokens": GREEDY_NEW_TOKENS,
                         "out": os.path.join(args.work, "%s-%s.safetensors" % (case[0], dtype))})
    request = os.path.join(args.work, "request.json")
    with open(request, "w") as f:
        json.dump({"jobs": jobs}, f)
    t1 = time.time()
    run = subprocess.run([args.dump, request], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=300)
    if run.returncode != 0:
        print(run.stdout)
        sys.exit("decoder_logits_dump failed (exit %d)" % run.returncode)
    t2 = time.time()
    failed = []
    print("%-20s %-9s %-20s %12s %10s" % ("case", "dtype", "path", "max rel err", "bound"))
    all_notes = []
    for job in jobs:
        case, dtype = job["name"].split("/")
        ref, seqs, cfg = refs[case]
        dump = read_dump(job["out"])
        errors, notes = compare_case(ref, dump, seqs, dtype)
        all_notes += ["%s/%s %s" % (case, dtype, n) for n in notes]
        bound = BOUNDS[dtype]
        for path, err in sorted(errors.items()):
            ok = err <= bound
            print("%-20s %-9s %-20s %12.3e %10.1e %s" % (
                case, dtype, path, err, bound, "" if ok else "FAIL"))
            if not ok:
                failed.append("%s %s %s: %.3e > %.1e" % (case, dtype, path, err, bound))
        expected = {"forward", "kv_cache", "trainer_logp", "trainer_logp_full",
                    "rollout_composite", "rollout_composite_argmax"}
        if dtype == "float32":
            expected |= {"forward_composite", "cpu_decoder", "rollout_fused",
                         "rollout_fused_argmax"}
        missing = expected - set(errors)
        if missing:
            failed.append("%s %s: no output for %s" % (case, dtype, sorted(missing)))
    for n in all_notes:
        print(n)
    print("engine %.1fs, reference %.1fs, total %.1fs" % (t2 - t1, time.time() - t2,
                                                          time.time() - t0))
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
        sys.exit(1)
    print("all decoder paths within bounds (float32 %.0e, bfloat16 %.3f)" % (F32_BOUND, BF16_BOUND))


if __name__ == "__main__":
    main()
