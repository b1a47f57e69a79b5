#include "engine/rollout/episode_decoder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status_macros.h"
#include "engine/model/expert_parallel.h"
#include "engine/rollout/cpu_decoder.h"
#include "engine/rollout/rollout_batch.h"

namespace fusionrl {
namespace {

using rollout_internal::DistinctPrompts;
using rollout_internal::FindDistinctPrompts;

// Decode timings read the monotonic time of the process's Clock.
absl::Time MonotonicNow() { return RealClock().MonotonicNow(); }
double Since(absl::Time t0) { return RealClock().SecondsSince(t0); }

// Where the live episodes' KV caches are and how a step computes them.
// Slots [0, n) of a step are the live episodes; a parked episode keeps its
// cache entries outside the slots.
class Backend {
 public:
  virtual ~Backend() = default;
  // Prefills each distinct prompt; the logits [U, V] of its last token.
  virtual at::Tensor Prefill(
      const std::vector<const std::vector<int>*>& unique) = 0;
  // Slot `slot` takes episode `e`, whose prompt is unique prompt `u`.
  virtual void Start(int64_t u, int64_t slot, int64_t e) = 0;
  virtual void Park(int64_t slot, int64_t e) = 0;
  virtual void Resume(int64_t e, int64_t slot) = 0;
  virtual void Move(int64_t from, int64_t to) = 0;
  virtual void Drop(int64_t e) = 0;  // a parked or finished episode
  // Feeds tokens[s] to slot s < n; the logits [n, V].
  virtual at::Tensor Step(const int64_t* tokens, int64_t n) = 0;
  // MoE policies: the experts every token fed for episode `e` was routed
  // to (EpisodeTokens::routes); empty where the backend does not record.
  virtual std::vector<int8_t> TakeRoutes(int64_t e) { return {}; }
};

// A forward's recorded routes ([1, t, n_layers, top_k]) appended to `out`
// as bytes.
void AppendRoutes(const at::Tensor& routes, std::vector<int8_t>& out) {
  const at::Tensor host = routes.to(at::kCPU).to(at::kChar).contiguous();
  const int8_t* p = host.data_ptr<int8_t>();
  out.insert(out.end(), p, p + host.numel());
}

// The fused CpuDecoder: one batched step; parked caches copied out.
class FusedBackend final : public Backend {
 public:
  FusedBackend(PolicyModel& model, int pad_id, int64_t slots, int64_t capacity,
               int row_blocks)
      : model_(model), pad_id_(pad_id), decoder_(model, slots, capacity) {
    if (row_blocks > 0) decoder_.set_row_blocks(row_blocks);
  }
  at::Tensor Prefill(
      const std::vector<const std::vector<int>*>& unique) override {
    prompt_len_ = 0;
    for (const auto* p : unique) {
      prompt_len_ = std::max<int64_t>(prompt_len_, p->size());
      lengths_.push_back(static_cast<int64_t>(p->size()));
    }
    const int64_t n = static_cast<int64_t>(unique.size());
    const auto long_opts = at::TensorOptions().dtype(at::kLong);
    auto tokens = at::full({n, prompt_len_}, pad_id_, long_opts);
    auto valid = at::zeros({n, prompt_len_}, long_opts.dtype(at::kBool));
    auto tok = tokens.accessor<int64_t, 2>();
    auto val = valid.accessor<bool, 2>();
    for (int64_t b = 0; b < n; ++b) {
      const int64_t off = prompt_len_ - lengths_[b];
      for (int64_t j = 0; j < lengths_[b]; ++j) {
        tok[b][off + j] = (*unique[b])[j];
        val[b][off + j] = true;
      }
    }
    prefill_ = model_.NewCache(n, prompt_len_);
    return model_
        .ForwardCached(tokens, PositionsFromValid(valid), valid, prefill_,
                       /*last_only=*/true)
        .select(1, 0);
  }
  void Start(int64_t u, int64_t slot, int64_t) override {
    decoder_.LoadPrefill(prefill_, u, prompt_len_ - lengths_[u], lengths_[u],
                         slot);
  }
  void Park(int64_t slot, int64_t e) override {
    decoder_.ParkSlot(slot, &parked_[e]);
  }
  void Resume(int64_t e, int64_t slot) override {
    decoder_.RestoreSlot(parked_.at(e), slot);
    parked_.erase(e);
  }
  void Move(int64_t from, int64_t to) override { decoder_.MoveSlot(from, to); }
  void Drop(int64_t e) override { parked_.erase(e); }
  at::Tensor Step(const int64_t* tokens, int64_t n) override {
    return decoder_.Step(tokens, n);
  }

 private:
  PolicyModel& model_;
  int pad_id_;
  CpuDecoder decoder_;
  KvCache prefill_;
  int64_t prompt_len_ = 0;
  std::vector<int64_t> lengths_;
  std::map<int64_t, CpuDecoder::ParkedSlot> parked_;
};

// The model's ForwardCached, one cache per episode (every device and
// model); each step runs the live episodes one by one.
class CompositeBackend final : public Backend {
 public:
  // `lockstep`: null, or the call's expert lockstep (announced before every
  // forward).
  CompositeBackend(PolicyModel& model, int64_t slots, int64_t capacity,
                   ExpertLockstep* lockstep)
      : model_(model),
        lockstep_(lockstep),
        capacity_(capacity),
        slot_episode_(slots, -1),
        record_(model.config().moe_experts > 0) {
    if (record_) model_.set_record_routes(true);
  }
  at::Tensor Prefill(
      const std::vector<const std::vector<int>*>& unique) override {
    std::vector<at::Tensor> logits;
    const auto long_opts =
        at::TensorOptions().dtype(at::kLong).device(model_.device());
    for (const auto* p : unique) {
      const int64_t len = static_cast<int64_t>(p->size());
      KvCache cache = model_.NewCache(1, capacity_);
      std::vector<int64_t> ids(p->begin(), p->end());
      auto tokens = at::tensor(ids, long_opts).view({1, len});
      auto positions = at::arange(len, long_opts).view({1, len});
      auto valid = at::ones({1, len}, long_opts.dtype(at::kBool));
      Announce();
      logits.push_back(
          model_.ForwardCached(tokens, positions, valid, cache, true)
              .select(1, 0));
      prompts_.push_back(std::move(cache));
      prompt_routes_.emplace_back();
      if (record_) AppendRoutes(model_.last_routes(), prompt_routes_.back());
    }
    return at::cat(logits, 0);
  }
  void Start(int64_t u, int64_t slot, int64_t e) override {
    const KvCache& p = prompts_[u];
    KvCache c;
    for (const auto& k : p.keys) c.keys.push_back(k.clone());
    for (const auto& v : p.values) c.values.push_back(v.clone());
    c.length = p.length;
    c.capacity = p.capacity;
    caches_[e] = std::move(c);
    slot_episode_[slot] = e;
    routes_[e] = prompt_routes_[u];
  }
  void Park(int64_t slot, int64_t) override { slot_episode_[slot] = -1; }
  void Resume(int64_t e, int64_t slot) override { slot_episode_[slot] = e; }
  void Move(int64_t from, int64_t to) override {
    slot_episode_[to] = slot_episode_[from];
  }
  void Drop(int64_t e) override { caches_.erase(e); }
  at::Tensor Step(const int64_t* tokens, int64_t n) override {
    const auto long_opts =
        at::TensorOptions().dtype(at::kLong).device(model_.device());
    std::vector<at::Tensor> rows;
    for (int64_t s = 0; s < n; ++s) {
      KvCache& cache = caches_.at(slot_episode_[s]);
      const int64_t pos = cache.length;
      auto tok = at::full({1, 1}, tokens[s], long_opts);
      auto positions = at::full({1, 1}, pos, long_opts);
      auto valid = at::ones({1, pos + 1}, long_opts.dtype(at::kBool));
      Announce();
      rows.push_back(
          model_.ForwardCached(tok, positions, valid, cache).select(1, 0));
      if (record_)
        AppendRoutes(model_.last_routes(), routes_[slot_episode_[s]]);
    }
    return at::cat(rows, 0);
  }
  std::vector<int8_t> TakeRoutes(int64_t e) override {
    auto it = routes_.find(e);
    if (it == routes_.end()) return {};
    std::vector<int8_t> out = std::move(it->second);
    routes_.erase(it);
    return out;
  }

 private:
  void Announce() {
    if (lockstep_ == nullptr) return;
    const absl::Status status = lockstep_->Announce();
    TORCH_CHECK(status.ok(), std::string(status.message()));
  }

  PolicyModel& model_;
  ExpertLockstep* lockstep_;
  int64_t capacity_;
  std::vector<KvCache> prompts_;
  std::map<int64_t, KvCache> caches_;
  std::vector<int64_t> slot_episode_;
  bool record_;
  std::vector<std::vector<int8_t>> prompt_routes_;  // by distinct prompt
  std::map<int64_t, std::vector<int8_t>> routes_;   // by episode
};

// One RunOnce call's episodes as they move between the states of a
// multi-turn decode: in a slot (fed, then sampling), parked on the
// environment's answer, ready for a slot, or finished.
class EpisodeRun {
 public:
  struct Setup {
    const DistinctPrompts* prompts;
    int64_t budget;  // tokens an episode may hold (model's and env's)
    int64_t slots;
    const std::vector<SequenceKey>* keys;
    const SamplingParams* params;
    const EpisodeLimits* limits;
    const std::vector<int>* stop_ids;
  };
  EpisodeRun(const Setup& setup, TurnDriver& driver, Backend& backend,
             EpisodeDecodeStats& stats)
      : s_(setup),
        driver_(driver),
        backend_(backend),
        stats_(stats),
        n_(static_cast<int64_t>(setup.prompts->prompt_of.size())),
        out_(n_),
        first_(n_),
        first_logp_(n_),
        feed_(n_),
        turn_(n_),
        sampled_(n_, 0),
        slot_episode_(setup.slots, -1),
        step_tokens_(setup.slots),
        u_(at::empty({setup.slots}, at::TensorOptions().dtype(at::kFloat))) {}

  // Every episode's first token, from its prompt's prefill logits.
  void SampleFirstTokens() {
    const at::Tensor prefill_logits = backend_.Prefill(s_.prompts->unique);
    auto u = at::empty({n_}, at::TensorOptions().dtype(at::kFloat));
    const std::vector<SequenceKey>& keys = *s_.keys;
    for (int64_t i = 0; i < n_; ++i) {
      u.data_ptr<float>()[i] = RowUniform(keys[i].seed, keys[i].index, 0);
    }
    auto rows =
        at::tensor(s_.prompts->prompt_of, at::TensorOptions().dtype(at::kLong))
            .to(prefill_logits.device());
    auto [tok, lp] =
        SampleTokens(prefill_logits.index_select(0, rows), u, *s_.params);
    tok = tok.to(at::kCPU).contiguous();
    lp = lp.to(at::kCPU).to(at::kFloat).contiguous();
    for (int64_t i = 0; i < n_; ++i) {
      first_[i] = tok.data_ptr<int64_t>()[i];
      first_logp_[i] = lp.data_ptr<float>()[i];
    }
  }

  // Decodes until every episode has finished.
  void Decode() {
    while (true) {
      TakeDueAnswers();
      FillSlots();
      if (live_ == 0) {
        if (parked_.empty()) return;
        // Everyone waits on the environment: on to the next admission.
        step_ = std::max(step_, parked_.begin()->first);
        continue;
      }
      StepSlots();
    }
  }

  // The episodes' tokens, with the routes the backend recorded.
  std::vector<EpisodeTokens> Finish() {
    for (int64_t e = 0; e < n_; ++e) out_[e].routes = backend_.TakeRoutes(e);
    return std::move(out_);
  }

 private:
  bool IsStop(int id) const {
    return std::find(s_.stop_ids->begin(), s_.stop_ids->end(), id) !=
           s_.stop_ids->end();
  }

  // Answers due at this step, in (step, episode) order: appended to their
  // episodes to be fed, or the episode ends (done, full, or out of turns).
  void TakeDueAnswers() {
    while (!parked_.empty() && parked_.begin()->first <= step_) {
      const int64_t e = parked_.begin()->second;
      parked_.erase(parked_.begin());
      const auto t_wait = MonotonicNow();
      TurnDriver::Answer answer = driver_.Await(e);
      stats_.wait_seconds += Since(t_wait);
      EpisodeTokens& ep = out_[e];
      const bool fits = static_cast<int64_t>(ep.tokens.size() +
                                             answer.tokens.size()) < s_.budget;
      if (answer.done || !fits || ep.turns >= s_.limits->max_turns) {
        ep.done = answer.done;
        if (!answer.done) {
          driver_.EpisodeCut(e, {}, ep.turns >= s_.limits->max_turns);
        }
        backend_.Drop(e);
        continue;
      }
      for (const int id : answer.tokens) {
        ep.tokens.push_back(id);
        ep.logp.push_back(0.0f);
        ep.model.push_back(0);
        feed_[e].push_back(id);
      }
      stats_.env_tokens_fed += static_cast<int64_t>(answer.tokens.size());
      ready_.push_back(e);
    }
  }

  // Free slots: continued episodes first, then new ones.
  void FillSlots() {
    while (live_ < s_.slots && (!ready_.empty() || next_new_ < n_)) {
      const int64_t s = live_;
      if (!ready_.empty()) {
        const int64_t e = ready_.front();
        ready_.pop_front();
        backend_.Resume(e, s);
        slot_episode_[s] = e;
        ++live_;
        continue;
      }
      const int64_t e = next_new_++;
      backend_.Start(s_.prompts->prompt_of[e], s, e);
      slot_episode_[s] = e;
      ++live_;
      const size_t parked_before = parked_.size();
      if (Record(e, first_[e], first_logp_[e])) {
        Vacate(s, /*park=*/parked_.size() > parked_before);
      }
    }
  }

  // One decode step of the live slots: each fed its next token, and those
  // done feeding record the token they sample.
  void StepSlots() {
    for (int64_t s = 0; s < live_; ++s) {
      std::deque<int64_t>& f = feed_[slot_episode_[s]];
      step_tokens_[s] = f.front();
      f.pop_front();
    }
    const at::Tensor logits = backend_.Step(step_tokens_.data(), live_);
    ++step_;
    ++stats_.decode_steps;
    stats_.rows_computed += live_;
    float* ud = u_.data_ptr<float>();
    const std::vector<SequenceKey>& keys = *s_.keys;
    for (int64_t s = 0; s < live_; ++s) {
      const int64_t e = slot_episode_[s];
      ud[s] = RowUniform(keys[e].seed, keys[e].index, sampled_[e]);
    }
    auto [tok, lp] = SampleTokens(logits, u_.narrow(0, 0, live_), *s_.params);
    tok = tok.to(at::kCPU).contiguous();
    lp = lp.to(at::kCPU).to(at::kFloat).contiguous();
    const int64_t* td = tok.data_ptr<int64_t>();
    const float* ld = lp.data_ptr<float>();
    // From the last slot down: a vacated slot takes one already handled.
    for (int64_t s = live_ - 1; s >= 0; --s) {
      const int64_t e = slot_episode_[s];
      if (!feed_[e].empty()) continue;  // still feeding the answer
      const size_t parked_before = parked_.size();
      if (Record(e, td[s], ld[s])) Vacate(s, parked_.size() > parked_before);
    }
  }

  // Records a sampled token. Returns true when the episode left its slot
  // (its turn ended, or the token limit cut it).
  bool Record(int64_t e, int64_t token, float logp) {
    EpisodeTokens& ep = out_[e];
    ep.tokens.push_back(static_cast<int>(token));
    ep.logp.push_back(logp);
    ep.model.push_back(1);
    turn_[e].push_back(static_cast<int>(token));
    ++sampled_[e];
    feed_[e].assign(1, token);
    const bool stopped = IsStop(static_cast<int>(token));
    if (stopped ||
        static_cast<int64_t>(turn_[e].size()) >= s_.params->max_new_tokens) {
      ++ep.turns;
      driver_.TurnEnded(e, turn_[e], stopped);
      turn_[e].clear();
      parked_.emplace(step_ + s_.limits->admit_after_steps, e);
      return true;
    }
    if (static_cast<int64_t>(ep.tokens.size()) >= s_.budget) {
      ++ep.turns;  // cut inside a turn: the episode ends, not done
      driver_.EpisodeCut(e, turn_[e], /*max_turns=*/false);
      return true;
    }
    return false;
  }

  // Slot `s` leaves the batch (its episode parked or finished): the last
  // live slot moves into it.
  void Vacate(int64_t s, bool park) {
    const int64_t e = slot_episode_[s];
    if (park) {
      backend_.Park(s, e);
    } else {
      backend_.Drop(e);
    }
    const int64_t last = live_ - 1;
    if (s != last) {
      backend_.Move(last, s);
      slot_episode_[s] = slot_episode_[last];
    }
    slot_episode_[last] = -1;
    --live_;
  }

  const Setup s_;
  TurnDriver& driver_;
  Backend& backend_;
  EpisodeDecodeStats& stats_;
  const int64_t n_;
  std::vector<EpisodeTokens> out_;
  std::vector<int64_t> first_;  // each episode's first token
  std::vector<float> first_logp_;
  std::vector<std::deque<int64_t>> feed_;         // tokens to feed, in order
  std::vector<std::vector<int>> turn_;            // the current turn's tokens
  std::vector<int64_t> sampled_;                  // model tokens so far
  std::set<std::pair<int64_t, int64_t>> parked_;  // (admit step, episode)
  std::deque<int64_t> ready_;  // answered, waiting for a slot
  std::vector<int64_t> slot_episode_;
  int64_t live_ = 0, next_new_ = 0, step_ = 0;
  std::vector<int64_t> step_tokens_;
  at::Tensor u_;
};

}  // namespace

EpisodeDecoder::EpisodeDecoder(PolicyModel& model, int pad_id,
                               std::vector<int> stop_ids)
    : model_(model), pad_id_(pad_id), stop_ids_(std::move(stop_ids)) {}

bool EpisodeDecoder::fused() const {
  return fused_ && CpuDecoder::Supports(model_);
}

absl::StatusOr<std::vector<EpisodeTokens>> EpisodeDecoder::Run(
    const std::vector<std::vector<int>>& prompts,
    const std::vector<SequenceKey>& keys, const SamplingParams& params,
    const EpisodeLimits& limits, TurnDriver& driver) {
  if (lockstep_group_ == nullptr) {
    return RunOnce(prompts, keys, params, limits, driver);
  }
  FUSIONRL_RETURN_IF_ERROR(
      ExpertLockstep::Applies(model_, fused(), "episodes"));
  ExpertLockstep lockstep(lockstep_group_);
  lockstep_ = &lockstep;
  absl::Cleanup unset = [this] { lockstep_ = nullptr; };
  absl::StatusOr<std::vector<EpisodeTokens>> out;
  try {
    out = RunOnce(prompts, keys, params, limits, driver);
  } catch (const c10::Error& e) {
    // A failed announcement (the backend's steps return tensors): the
    // group is broken, joining would only wait out its deadline again.
    return absl::UnavailableError(e.what_without_backtrace());
  }
  // Whatever this call did, the group's other calls need this rank until
  // their last forward.
  out = lockstep.Finish(model_, std::move(out));
  stats_.expert_joins = lockstep.joins();
  return out;
}

absl::StatusOr<std::vector<EpisodeTokens>> EpisodeDecoder::RunOnce(
    const std::vector<std::vector<int>>& prompts,
    const std::vector<SequenceKey>& keys, const SamplingParams& params,
    const EpisodeLimits& limits, TurnDriver& driver) {
  const auto t_start = MonotonicNow();
  stats_ = EpisodeDecodeStats{};
  const int64_t n = static_cast<int64_t>(prompts.size());
  if (n == 0) return std::vector<EpisodeTokens>();
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (prompts[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("episode ", i, ": empty prompt"));
    }
    longest = std::max<int64_t>(longest, prompts[i].size());
  }
  // Distinct prompts are prefilled once (a GRPO group shares its prompt).
  const DistinctPrompts distinct = FindDistinctPrompts(prompts);
  const int64_t max_seq = model_.config().max_seq_len;
  const int64_t budget = limits.max_episode_tokens > 0
                             ? limits.max_episode_tokens
                             : max_seq - longest;
  if (budget < 1 || longest + budget > max_seq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a prompt of ", longest, " tokens plus an episode of ", budget,
        " tokens does not fit model.max_seq_len (", max_seq,
        "); lower env.max_episode_tokens or shorten the prompts"));
  }
  const int64_t slots = limits.slots > 0 ? std::min(limits.slots, n) : n;
  const int64_t capacity = longest + budget;
  std::unique_ptr<Backend> backend;
  if (fused()) {
    backend = std::make_unique<FusedBackend>(model_, pad_id_, slots, capacity,
                                             row_blocks_);
  } else {
    backend =
        std::make_unique<CompositeBackend>(model_, slots, capacity, lockstep_);
  }
  EpisodeRun run(
      {&distinct, budget, slots, &keys, &params, &limits, &stop_ids_}, driver,
      *backend, stats_);
  run.SampleFirstTokens();
  run.Decode();
  std::vector<EpisodeTokens> out = run.Finish();
  stats_.total_seconds = Since(t_start);
  return out;
}

}  // namespace fusionrl
