#include "engine/rollout/agent_loop.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/seed.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"
#include "tasks/rewards.h"
#include "tasks/tool_calls.h"
#include "template/chat_format.h"

namespace fusionrl {
namespace {

using Clock = std::chrono::steady_clock;

// Environment calls run here, at most `threads` at once. The destructor
// waits for the calls in flight (each has a deadline).
class CallPool {
 public:
  explicit CallPool(int threads) {
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this] { Work(); });
    }
  }
  ~CallPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  void Submit(std::function<void()> call) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(call));
    }
    cv_.notify_one();
  }

 private:
  void Work() {
    while (true) {
      std::function<void()> call;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        call = std::move(queue_.front());
        queue_.pop_front();
      }
      call();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// One environment call's result, filled by a pool thread.
template <class T>
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  absl::StatusOr<T> result = absl::UnknownError("not answered");
  double seconds = 0;

  void Set(absl::StatusOr<T> r, double s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(r);
      seconds = s;
      ready = true;
    }
    cv.notify_all();
  }
  // Waits until `deadline` (plus a grace for the call's own deadline
  // handling); false if it has not answered by then.
  bool Wait(absl::Time deadline) {
    std::unique_lock<std::mutex> lock(mu);
    const absl::Duration left = deadline + absl::Seconds(2) - absl::Now();
    return cv.wait_for(lock, absl::ToChronoNanoseconds(left),
                       [this] { return ready; });
  }
};

// The tokens that follow an assistant turn (ChatRenderer::ObservationText),
// tokenized once.
absl::StatusOr<std::vector<int>> ObservationIds(
    const JobContext& ctx, const std::vector<ChatMessage>& conversation,
    const std::vector<ChatMessage>& answer, const std::string& tools_json,
    bool stopped) {
  FUSIONRL_ASSIGN_OR_RETURN(
      std::string text,
      ctx.chat.ObservationText(conversation, answer, tools_json, stopped));
  return ctx.tokenizer->Encode(text);
}

// The turn the environment sees: the decoded text, its tool calls parsed
// in the job's format, and its content: the text outside the calls after
// any thinking block (tasks/rewards.h AnswerText; "" for a turn that ends
// inside one). `opens_thinking`: the text before the turn (the prompt, or
// the last answer with its generation prompt) left a thinking block open.
AssistantTurn MakeTurn(const JobContext& ctx, std::string text,
                       const std::vector<ToolSpec>& tools, int index,
                       bool stopped, bool opens_thinking) {
  AssistantTurn t;
  t.index = index;
  t.text = std::move(text);
  ParsedTurn parsed = ParseToolCalls(ctx.tool_format, t.text, tools);
  const std::optional<std::string_view> answer =
      tasks::AnswerText(parsed.content, opens_thinking);
  t.content = answer.has_value() ? std::string(*answer) : std::string();
  t.tool_calls = std::move(parsed.calls);
  t.call_errors = std::move(parsed.errors);
  t.truncated = !stopped;
  return t;
}

// A token for the prompt of a sample that has none (its episode failed
// before it had one): bos, or eos for tokenizers without one.
int PlaceholderToken(const JobContext& ctx) {
  return ctx.tokenizer->bos_id() >= 0 ? ctx.tokenizer->bos_id()
                                      : ctx.tokenizer->eos_id();
}

struct EpisodeState {
  const Problem* problem = nullptr;
  std::shared_ptr<Episode> episode;
  std::vector<ChatMessage> conversation;
  std::vector<ToolSpec> tools;
  std::string tools_json;
  std::vector<int> prompt_ids;
  // The current turn.
  std::shared_ptr<Pending<Observation>> pending;
  absl::Time deadline;
  std::vector<std::string> call_errors;
  std::string content;
  bool stopped = true;
  bool opens_thinking = false;  // the text before the turn opened <think>
  double env_seconds_left = 0;
  bool cut = false;  // a limit ended it: its Truncate is pending
  // The outcome.
  bool failed = false;
  std::string failure;
  bool unreachable = false;  // failed as UNAVAILABLE (retried by Run)
  bool done = false;
  bool scored = false;  // reward and correct are set (done or cut)
  double reward = 0;
  bool correct = false;
  EpisodeStats stats;
};

class Driver final : public TurnDriver {
 public:
  Driver(const JobContext& ctx, CallPool& pool,
         std::vector<EpisodeState>& episodes, std::vector<size_t> index)
      : ctx_(ctx), pool_(pool), episodes_(episodes), index_(std::move(index)) {}

  void TurnEnded(int64_t i, const std::vector<int>& turn,
                 bool stopped) override {
    EpisodeState& ep = episodes_[index_[i]];
    AssistantTurn t = MakeTurn(ctx_, DecodeResponse(ctx_, turn), ep.tools,
                               ep.stats.turns++, stopped, ep.opens_thinking);
    ep.stats.tool_calls += static_cast<int32_t>(t.tool_calls.size());
    ep.stats.tool_errors += static_cast<int32_t>(t.call_errors.size());
    ep.call_errors = t.call_errors;
    ep.content = t.content;
    ep.stopped = stopped;
    ep.conversation.push_back({"assistant", t.text});
    StartCall(ep, "",
              [episode = ep.episode, turn = std::move(t)](absl::Time deadline) {
                return episode->Step(turn, deadline);
              });
  }

  // Starts one environment call of `ep` on the pool, with the episode's
  // call deadline; when its environment time is spent, the call's answer is
  // a DeadlineExceeded at once (`when` ends that message).
  template <typename Call>
  void StartCall(EpisodeState& ep, absl::string_view when, Call call) {
    ep.pending = std::make_shared<Pending<Observation>>();
    const double left =
        std::min(ctx_.env.call_deadline_seconds, ep.env_seconds_left);
    ep.deadline = absl::Now() + absl::Seconds(std::max(0.0, left));
    if (left <= 0) {
      ep.pending->Set(absl::DeadlineExceededError(absl::StrCat(
                          "the episode's environment time (env."
                          "episode_env_seconds: ",
                          ctx_.env.episode_env_seconds, ") is spent", when)),
                      0);
      return;
    }
    pool_.Submit(
        [pending = ep.pending, deadline = ep.deadline, call = std::move(call)] {
          const auto t0 = Clock::now();
          absl::StatusOr<Observation> r = call(deadline);
          pending->Set(std::move(r), SecondsSince(t0));
        });
  }

  Answer Await(int64_t i) override {
    EpisodeState& ep = episodes_[index_[i]];
    Answer done;
    done.done = true;
    if (!ep.pending->Wait(ep.deadline)) {
      Fail(ep, absl::DeadlineExceededError(
                   "the environment did not answer by the call's deadline"));
      return done;
    }
    ep.stats.env_seconds += ep.pending->seconds;
    ep.env_seconds_left -= ep.pending->seconds;
    absl::StatusOr<Observation> obs = std::move(ep.pending->result);
    ep.pending.reset();
    if (!obs.ok()) {
      Fail(ep, obs.status());
      return done;
    }
    for (const auto& [k, v] : obs->metrics) ep.stats.metrics[k] += v;
    if (obs->done) {
      Score(ctx_, ep, *obs);
      ep.done = true;
      return done;
    }
    std::vector<ChatMessage> answer = std::move(obs->messages);
    for (const std::string& e : ep.call_errors) {
      answer.push_back({"tool", absl::StrCat("error: ", e)});
    }
    absl::StatusOr<std::vector<int>> ids = ObservationIds(
        ctx_, ep.conversation, answer, ep.tools_json, ep.stopped);
    if (!ids.ok()) {
      Fail(ep, ids.status());
      return done;
    }
    ep.conversation.insert(ep.conversation.end(), answer.begin(), answer.end());
    ep.opens_thinking = OpensThinking(ctx_, *ids);
    Answer next;
    next.tokens = *std::move(ids);
    return next;
  }

  // A limit cut the episode: its Truncate goes to the pool (as a Step;
  // FinishCuts waits for it).
  void EpisodeCut(int64_t i, const std::vector<int>& turn,
                  bool max_turns) override {
    EpisodeState& ep = episodes_[index_[i]];
    Cut cut;
    cut.reason =
        max_turns ? CutReason::kMaxTurns : CutReason::kMaxEpisodeTokens;
    if (!turn.empty()) {
      cut.turn =
          MakeTurn(ctx_, DecodeResponse(ctx_, turn), ep.tools, ep.stats.turns++,
                   /*stopped=*/false, ep.opens_thinking);
      ep.content = cut.turn->content;  // the last turn's, for the default
    }
    ep.cut = true;
    StartCall(
        ep, " before its truncation",
        [episode = ep.episode, cut = std::move(cut)](absl::Time deadline) {
          return episode->Truncate(cut, deadline);
        });
  }

  // Every cut episode's verdict, waited for (each by its deadline).
  void FinishCuts() {
    for (size_t i : index_) {
      EpisodeState& ep = episodes_[i];
      if (!ep.cut || ep.failed || ep.pending == nullptr) continue;
      if (!ep.pending->Wait(ep.deadline)) {
        Fail(ep, absl::DeadlineExceededError(
                     "the environment did not answer the episode's "
                     "truncation by the call's deadline"));
        continue;
      }
      ep.stats.env_seconds += ep.pending->seconds;
      absl::StatusOr<Observation> obs = std::move(ep.pending->result);
      ep.pending.reset();
      if (!obs.ok()) {
        Fail(ep, obs.status());
        continue;
      }
      for (const auto& [k, v] : obs->metrics) ep.stats.metrics[k] += v;
      Score(ctx_, ep, *obs);
    }
  }

  // The episode's reward: the environment's, else the task's reward of the
  // last turn's content.
  static void Score(const JobContext& ctx, EpisodeState& ep,
                    const Observation& obs) {
    if (obs.reward.has_value()) {
      ep.reward = *obs.reward;
      ep.correct = obs.correct.value_or(ep.reward > 0);
    } else {
      const Verdict v = ctx.reward->Score(*ep.problem, ep.content);
      ep.reward = v.reward;
      ep.correct = obs.correct.value_or(v.correct);
    }
    ep.scored = true;
  }

  static void Fail(EpisodeState& ep, const absl::Status& status) {
    ep.failed = true;
    ep.stats.env_failed = true;
    ep.failure = status.ToString();
    ep.unreachable = status.code() == absl::StatusCode::kUnavailable;
  }

 private:
  const JobContext& ctx_;
  CallPool& pool_;
  std::vector<EpisodeState>& episodes_;
  std::vector<size_t> index_;  // decoder episode -> episodes_ index
};

// The opening of every episode, concurrently; failures are recorded.
void OpenEpisodes(const JobContext& ctx, CallPool& pool,
                  const std::vector<SequenceKey>& keys,
                  std::vector<EpisodeState>& episodes) {
  struct Opened {
    std::shared_ptr<Episode> episode;
    EpisodeStart start;
  };
  const absl::Time deadline =
      absl::Now() + absl::Seconds(std::min(ctx.env.call_deadline_seconds,
                                           ctx.env.episode_env_seconds));
  std::vector<std::shared_ptr<Pending<Opened>>> pending;
  for (size_t i = 0; i < episodes.size(); ++i) {
    auto p = std::make_shared<Pending<Opened>>();
    pending.push_back(p);
    const uint64_t seed = MixSeed(keys[i].seed, keys[i].index);
    pool.Submit([p, env = ctx.environment, problem = *episodes[i].problem, seed,
                 deadline] {
      const auto t0 = Clock::now();
      Opened o;
      absl::StatusOr<std::unique_ptr<Episode>> e =
          env->Open(problem, seed, deadline, &o.start);
      if (!e.ok()) {
        p->Set(e.status(), SecondsSince(t0));
        return;
      }
      o.episode = std::shared_ptr<Episode>(*std::move(e));
      p->Set(std::move(o), SecondsSince(t0));
    });
  }
  for (size_t i = 0; i < episodes.size(); ++i) {
    EpisodeState& ep = episodes[i];
    ep.env_seconds_left = ctx.env.episode_env_seconds;
    if (!pending[i]->Wait(deadline)) {
      Driver::Fail(ep, absl::DeadlineExceededError(
                           "the environment did not open the episode by the "
                           "call's deadline"));
      continue;
    }
    ep.stats.env_seconds += pending[i]->seconds;
    ep.env_seconds_left -= pending[i]->seconds;
    if (!pending[i]->result.ok()) {
      Driver::Fail(ep, pending[i]->result.status());
      continue;
    }
    Opened& o = *pending[i]->result;
    ep.episode = std::move(o.episode);
    ep.tools = std::move(o.start.tools);
    ep.conversation = o.start.messages.empty()
                          ? ProblemMessages(*ep.problem, ctx.system_prompt)
                          : std::move(o.start.messages);
    if (!ep.tools.empty()) {
      absl::StatusOr<std::string> tools = ToolsJson(ep.tools);
      if (!tools.ok()) {
        Driver::Fail(ep, tools.status());
        continue;
      }
      ep.tools_json = *std::move(tools);
    }
    absl::StatusOr<std::vector<int>> ids =
        EncodeConversation(ctx, ep.conversation, ep.tools_json);
    if (!ids.ok()) {
      Driver::Fail(ep, ids.status());
      continue;
    }
    ep.prompt_ids = *std::move(ids);
    ep.opens_thinking = OpensThinking(ctx, ep.prompt_ids);
  }
}

}  // namespace

absl::StatusOr<EpisodeBatch> AgentLoop::RunOnce(
    PolicyModel& model, const std::vector<Problem>& problems,
    const std::vector<SequenceKey>& keys, const SamplingParams& params,
    int64_t slots, int row_blocks, bool fused, GradientSync* expert_lockstep,
    std::vector<std::string>* unreachable) const {
  std::vector<EpisodeState> episodes(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    episodes[i].problem = &problems[i];
  }
  EpisodeBatch batch;
  {
    CallPool pool(ctx_.env.max_concurrency);
    OpenEpisodes(ctx_, pool, keys, episodes);
    std::vector<std::vector<int>> prompts;
    std::vector<SequenceKey> run_keys;
    std::vector<size_t> index;
    // An opening the environment made too long for the model fails its
    // episode, not the batch.
    const int64_t room = std::max<int64_t>(1, ctx_.env.max_episode_tokens);
    for (size_t i = 0; i < episodes.size(); ++i) {
      if (episodes[i].failed) continue;
      const int64_t len = static_cast<int64_t>(episodes[i].prompt_ids.size());
      if (len + room > model.config().max_seq_len) {
        Driver::Fail(episodes[i],
                     absl::InvalidArgumentError(absl::StrCat(
                         "the episode's opening is ", len,
                         " tokens; with env.max_episode_tokens (", room,
                         ") it does not fit model.max_seq_len (",
                         model.config().max_seq_len, ")")));
        // The sample keeps the shape of a failed one, within the model.
        episodes[i].prompt_ids = {PlaceholderToken(ctx_)};
        continue;
      }
      prompts.push_back(episodes[i].prompt_ids);
      run_keys.push_back(keys[i]);
      index.push_back(i);
    }
    Driver driver(ctx_, pool, episodes, index);
    EpisodeDecoder decoder(model, ctx_.tokenizer->pad_id(), ctx_.stop_ids);
    decoder.set_fused(fused);
    decoder.set_row_blocks(row_blocks);
    decoder.set_expert_lockstep(expert_lockstep);
    EpisodeLimits limits;
    limits.max_turns = ctx_.env.max_turns;
    limits.max_episode_tokens = ctx_.env.max_episode_tokens;
    limits.admit_after_steps = ctx_.env.admit_after_steps;
    limits.slots = slots;
    absl::StatusOr<std::vector<EpisodeTokens>> run =
        decoder.Run(prompts, run_keys, params, limits, driver);
    if (!run.ok()) return run.status();
    driver.FinishCuts();
    batch.decode = decoder.last_stats();
    batch.samples.resize(problems.size());
    for (size_t k = 0; k < index.size(); ++k) {
      EpisodeState& ep = episodes[index[k]];
      EpisodeTokens& t = (*run)[k];
      Sample& s = batch.samples[index[k]];
      s.response_ids = std::move(t.tokens);
      s.behaviour_logp = std::move(t.logp);
      s.loss_mask = std::move(t.model);
      s.routes = std::move(t.routes);
      ep.stats.turns = t.turns;
      s.finished = t.done && !ep.failed;
    }
    // The episodes close (their destructors) before the pool joins.
    for (EpisodeState& ep : episodes) ep.episode.reset();
  }
  int failed = 0;
  std::string first_failure;
  for (size_t i = 0; i < episodes.size(); ++i) {
    EpisodeState& ep = episodes[i];
    Sample& s = batch.samples[i];
    s.prompt_ids = ep.prompt_ids;
    if (s.prompt_ids.empty()) {
      absl::StatusOr<std::vector<int>> ids =
          EncodeProblemPrompt(ctx_, problems[i]);
      s.prompt_ids =
          ids.ok() ? *std::move(ids) : std::vector<int>{PlaceholderToken(ctx_)};
    }
    if (s.response_ids.empty()) {
      // Never decoded (the environment failed at the start): one masked
      // token keeps the sample's shape.
      s.response_ids = {ctx_.tokenizer->eos_id()};
      s.behaviour_logp = {0.0f};
      s.loss_mask = {0};
      s.routes.clear();
    }
    s.episode = ep.stats;
    if (ep.failed) {
      if (failed++ == 0) first_failure = ep.failure;
      s.finished = false;
    } else if (ep.scored) {
      s.reward = ep.reward;
      s.correct = ep.correct;
    }
    if (ep.unreachable && unreachable != nullptr) {
      (*unreachable)[i] = ep.failure;
    }
  }
  if (failed > 0) {
    spdlog::warn("env: {} of {} episodes failed in the environment ({})",
                 failed, episodes.size(), first_failure);
  }
  return batch;
}

absl::StatusOr<Sample> DemonstrationSample(const JobContext& ctx,
                                           const Problem& problem,
                                           uint64_t seed) {
  const absl::Time deadline =
      absl::Now() + absl::Seconds(ctx.env.call_deadline_seconds);
  EpisodeStart start;
  FUSIONRL_ASSIGN_OR_RETURN(
      std::unique_ptr<Episode> episode,
      ctx.environment->Open(problem, seed, deadline, &start));
  std::vector<ChatMessage> conversation =
      start.messages.empty() ? ProblemMessages(problem, ctx.system_prompt)
                             : start.messages;
  std::string tools_json;
  if (!start.tools.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(tools_json, ToolsJson(start.tools));
  }
  Sample s;
  FUSIONRL_ASSIGN_OR_RETURN(s.prompt_ids,
                            EncodeConversation(ctx, conversation, tools_json));
  bool opens_thinking = OpensThinking(ctx, s.prompt_ids);
  auto append = [&s](const std::vector<int>& ids, bool model) {
    for (int id : ids) {
      s.response_ids.push_back(id);
      s.behaviour_logp.push_back(0.0f);
      s.loss_mask.push_back(model ? 1 : 0);
    }
  };
  for (int turn = 0; turn < ctx.env.max_turns; ++turn) {
    std::optional<std::string> demo =
        ctx.environment->Demonstrate(problem, conversation);
    if (!demo.has_value()) break;
    // The demonstration writes calls as [name text]; the model writes them
    // in its own format.
    ParsedTurn plain = ParseToolCalls(ToolFormat::kPlain, *demo, start.tools);
    std::string text = *demo;
    if (ctx.tool_format != ToolFormat::kPlain && !plain.calls.empty()) {
      text = plain.content;
      for (const ToolCall& call : plain.calls) {
        FUSIONRL_ASSIGN_OR_RETURN(
            std::string written,
            WriteToolCall(ctx.tool_format, call, start.tools));
        absl::StrAppend(&text, text.empty() ? "" : "\n", written);
      }
    }
    // The turn as the chat format writes it, up to its first stop id.
    FUSIONRL_ASSIGN_OR_RETURN(std::string rendered,
                              ctx.chat.AssistantTurn(conversation, text));
    FUSIONRL_ASSIGN_OR_RETURN(std::vector<int> turn_ids,
                              TurnTokens(ctx, rendered));
    append(turn_ids, true);
    // The environment sees the turn as it would see the policy's.
    AssistantTurn t =
        MakeTurn(ctx, DecodeResponse(ctx, turn_ids), start.tools, turn,
                 /*stopped=*/true, opens_thinking);
    conversation.push_back({"assistant", t.text});
    FUSIONRL_ASSIGN_OR_RETURN(Observation obs, episode->Step(t, deadline));
    if (obs.done) {
      s.finished = true;
      s.reward = obs.reward.value_or(0);
      s.correct = obs.correct.value_or(s.reward > 0);
      return s;
    }
    for (const std::string& e : t.call_errors) {
      obs.messages.push_back({"tool", absl::StrCat("error: ", e)});
    }
    FUSIONRL_ASSIGN_OR_RETURN(
        std::vector<int> answer,
        ObservationIds(ctx, conversation, obs.messages, tools_json, true));
    opens_thinking = OpensThinking(ctx, answer);
    append(answer, false);
    conversation.insert(conversation.end(), obs.messages.begin(),
                        obs.messages.end());
  }
  if (s.response_ids.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "env: no demonstration for the problem '", problem.prompt, "'"));
  }
  return s;
}

}  // namespace fusionrl
