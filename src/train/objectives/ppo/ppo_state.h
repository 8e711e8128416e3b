#pragma once
// PPO's state (PpoObjective::State) and what its parts share: ppo.cpp (the
// iteration, advantages, the loss) and ppo_episodes.cpp (multi-turn rollouts
// with an environment program). Private to src/train.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "anvil/chat/chat.h"
#include "anvil/generation/generate.h"
#include "anvil/rewards/rewards.h"
#include "anvil/train/engine.h"
#include "anvil/train/ppo.h"
#include "data/datasets.h"
#include "data/mixture.h"
#include "distributed/comm.h"
#include "rewards/environment.h"
#include "train/objectives/lm_data.h"
#include "train/objectives/ppo/ppo_metrics.h"
#include "train/objectives/ppo/ppo_rollout.h"
#include "train/objectives/step_batches.h"

namespace anvil::train {

using rewards::ResponseRewards;

/// A prompt of the rollout: the sample and its place in the global stream.
struct RolloutPrompt {
  const chat::PromptSample* sample;
  int64_t global_index;
  data::SampleRef ref{};  // where it is in data.train (rollout ranks are told it)
};

/// (B, R) log-probabilities of `tokens` at the (B, R, C) hidden states
/// `sel` under softmax(logits / temperature): through the fused head
/// (train.fused_loss), or from the whole (B, R, V) logits. With `entropy`,
/// each position's entropy too (no grad).
at::Tensor token_logps(models::CausalLM& model, const at::Tensor& sel, const at::Tensor& tokens, double temperature,
                       bool fused, at::Tensor* entropy = nullptr);

/// Moves the metrics of `from` that describe a batch (not a time or a speed) into `batch`.
void move_batch_metrics(Metrics& from, Metrics& batch);

/// The seed of iteration `iteration`'s rollout: its rows' seeds derive from it.
inline uint64_t iteration_seed(int64_t run_seed, int64_t iteration) {
  return static_cast<uint64_t>(run_seed) * 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(iteration);
}

struct PpoObjective::State {
  config::RunConfig cfg;
  const PpoConfig& ppo;
  const tokenizer::Tokenizer& tok;
  int64_t pad_id = 0, stop_id = -1;
  MixtureData<data::PromptDataset> data;
  std::unique_ptr<data::MixtureSampler> prompts;
  std::unique_ptr<StepBatches> source;  // the rollout's minibatches; its state is the prompt stream's position
  RankContext ranks;
  FrozenModel reference;
  std::unique_ptr<ResponseRewards> rewards;
  std::unique_ptr<rewards::EnvironmentProgram> environment;  // ppo.environment.command: multi-turn rollouts
  const chat::ChatTemplate* chat = nullptr;                  // renders the environment's messages
  bool value_head = false;                                   // advantage gae: values from a head or a critic
  std::shared_ptr<models::CausalLM> critic;  // ppo.critic_from: trained beside the policy (RunContext::train)
  // dist.tensor_parallel: the group whose ranks sample and score the same rows together (null without it).
  std::shared_ptr<distributed::Communicator> tensor_parallel;
  double kl_coef = 0;
  RunningMoments moments;
  double rollout_kl = 0;     // mean summed KL of the last rollout, for the controller
  int64_t rollout_rows = 0;  // sequences per rollout (all ranks)
  int64_t steps_done_in_iteration = 0;
  double learn_seconds = 0;
  std::chrono::steady_clock::time_point learn_start;
  std::unique_ptr<generation::Decoder> decoder;  // the rollouts' (and eval's), kept from one to the next
  const models::CausalLM* decoded = nullptr;     // the model it decodes
  /// ppo.async: the batch the next iteration trains, sampled by this
  /// iteration's weights before its update, and its sampling metrics (logged
  /// when it trains); saved with each checkpoint.
  std::vector<RolloutRow> in_flight;
  int64_t in_flight_iteration = -1;  // the iteration whose weights sampled it
  Metrics in_flight_metrics;
  /// ppo.async.rollout_ranks, on the training ranks: the launch (ranks
  /// [trainers, world) sample), and the batch they are sampling.
  std::shared_ptr<distributed::Communicator> world;
  int64_t trainers = 0;
  bool requested = false;  // a batch is being sampled, not yet received
  std::vector<RolloutPrompt> requested_prompts;
  int64_t weights_version = -1;           // the last weights sent: the step they are after
  std::map<int64_t, uint64_t> sent_hash;  // ppo.async.check_weights: version -> hash of what was sent
  Metrics received_timing;                // the last hand-off's time/ metrics, logged with the next iteration

  State(const config::RunConfig& c, const tokenizer::Tokenizer& t) : cfg(c), ppo(ppo_config(cfg)), tok(t) {}

  int64_t minibatch_rows() const { return cfg.train.micro_batch_size * micro_per_step(); }
  LossWeighting weighting() const {
    return {ppo.loss_aggregation, ppo.loss_constant > 0 ? ppo.loss_constant : static_cast<double>(ppo.max_new_tokens),
            ppo.mask_truncated_completions};
  }
  int64_t micro_per_step() const {
    return cfg.train.global_batch_size > 0 ? cfg.train.global_batch_size / cfg.train.micro_batch_size
                                           : cfg.train.grad_accum_steps;
  }
  std::vector<double> score(const std::vector<RolloutPrompt>& prompts, const std::vector<RolloutRow>& rows,
                            int64_t per_prompt, std::vector<std::vector<double>>* components = nullptr);
  /// The rollout's sampling (greedy: eval's), up to max_new_tokens (eval's), without row seeds.
  generation::SamplingOptions sampling(bool greedy) const {
    generation::SamplingOptions so;
    so.greedy = greedy;
    so.temperature = ppo.temperature;
    so.top_k = ppo.top_k;
    so.top_p = ppo.top_p;
    so.eos_id = stop_id;
    so.max_new_tokens = greedy ? cfg.eval.max_new_tokens : ppo.max_new_tokens;
    so.batch_size = greedy ? cfg.eval.batch_size : ppo.generation_batch_size;
    return so;
  }
  std::vector<RolloutRow> generate(models::CausalLM& policy, const std::vector<RolloutPrompt>& mine, int64_t per_prompt,
                                   uint64_t seed, bool greedy);
  /// The decoder of `policy` (ppo.keep_decoder: its buckets stay between rollouts).
  generation::Decoder& decoder_of(models::CausalLM& policy) {
    if (!decoder || decoded != &policy) {
      generation::DecoderOptions o;
      o.keep_buckets = ppo.keep_decoder;
      decoder = std::make_unique<generation::Decoder>(policy, o);
      decoded = &policy;
    }
    return *decoder;
  }
  /// Multi-turn rollouts with the environment (ppo.environment): turns of
  /// generation, each answered by the program, until it says done.
  std::vector<RolloutRow> episodes(models::CausalLM& policy, const std::vector<RolloutPrompt>& mine, int64_t per_prompt,
                                   uint64_t seed, bool greedy);
  /// The tokens that follow an assistant turn's end of turn when `message`
  /// is appended to `conversation` (which ends with that turn), up to the
  /// next assistant header, as the chat template renders them.
  std::vector<int64_t> appended_tokens(const std::vector<chat::Message>& conversation, const chat::Message& message,
                                       const chat::PromptSample& sample) const;
  void forward_logps(models::CausalLM& model, std::vector<RolloutRow>& rows, bool reference_model, bool values);
  /// Per-token values (B, R) of the tokens at `pos` of `ids`: the critic's,
  /// or the value head's on the policy's hidden states `sel` there.
  at::Tensor values(models::CausalLM& policy, const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& sel);
  /// The rollout: prompts drawn, responses sampled and scored, rows exchanged.
  std::vector<RolloutRow> collect(Engine& engine, uint64_t seed, Metrics& m);
  /// A rollout's prompts_per_rollout prompts, drawn from the prompt stream.
  std::vector<RolloutPrompt> draw();
  /// The prompts of `all` that rank `rank` of `ranks` samples (a contiguous share).
  std::vector<RolloutPrompt> share(const std::vector<RolloutPrompt>& all, int64_t rank, int64_t ranks) const;
  /// `mine` sampled (samples_per_prompt each) by `policy` (whole), with the
  /// behaviour log-probs and, with `values`, the value head's values.
  std::vector<RolloutRow> sample_share(models::CausalLM& policy, const std::vector<RolloutPrompt>& mine, uint64_t seed,
                                       bool values, Metrics& m);
  /// The reference log-probs and scores of this rank's `local` rows (of
  /// `mine`), then every rank's rows in rank order (a collective).
  std::vector<RolloutRow> score_share(Engine& engine, const std::vector<RolloutPrompt>& mine,
                                      std::vector<RolloutRow> local, Metrics& m);
  /// rollout_ranks: asks the rollout ranks for batch `iteration` (its prompts
  /// drawn here); with `send_weights`, sends them the current weights first,
  /// those of iteration `weights_of` (else they keep the last ones sent).
  void request(Engine& engine, int64_t iteration, int64_t weights_of, bool send_weights);
  /// rollout_ranks: the rows of the batch requested, as the rollout ranks
  /// send them (not scored); the hand-off's times into received_timing.
  std::vector<RolloutRow> receive_rows(Engine& engine);
  /// rollout_ranks: the batch requested, once the rollout ranks send it,
  /// scored; its sampling metrics into `m`, the hand-off's times into
  /// received_timing.
  std::vector<RolloutRow> receive(Engine& engine, Metrics& m);
  /// rollout_ranks: receive() into the batch in flight and its metrics.
  void receive_in_flight(Engine& engine);
  /// ppo.dynamic_sampling: keeps the groups of `first` whose scores differ
  /// and collects more rounds until prompts_per_rollout such groups are in
  /// (at most dynamic_sampling_max_rounds rounds; then dropped groups fill).
  std::vector<RolloutRow> fill_groups(Engine& engine, uint64_t seed, std::vector<RolloutRow> first, Metrics& m);
  /// The rollout of iteration `iteration`'s seed: collect, then fill_groups under ppo.dynamic_sampling.
  std::vector<RolloutRow> sample(Engine& engine, int64_t iteration, Metrics& m);
  /// ppo.async, truncated_is: the rows' old log-probs (and values) recomputed
  /// by the current weights, and each token's truncated importance weight
  /// against the log-probs of the weights that sampled them.
  void correct_off_policy(Engine& engine, std::vector<RolloutRow>& rows, Metrics& m);
  /// (advantages, returns), (N, R) float32, and the rollout's metrics.
  std::pair<at::Tensor, at::Tensor> advantages(const std::vector<RolloutRow>& rows, Metrics& m);
  std::vector<Batch> schedule(const std::vector<RolloutRow>& rows, const at::Tensor& adv, const at::Tensor& ret,
                              uint64_t seed) const;
};

}  // namespace anvil::train
