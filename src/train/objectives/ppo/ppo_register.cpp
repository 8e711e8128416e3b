// ppo's registration: its config section with its checks and the names
// other trainers give its keys, and the algorithm with the keys it reads,
// registered as a linking program registers its objectives
// (examples/custom_objective). The objective is in ppo.cpp.
#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/train/ppo.h"

namespace anvil::train {

namespace {

void check_ppo(const PpoConfig& p, const config::RunConfig& cfg, const config::Checks& checks) {
  const auto& r = p.reward;
  const bool single =
      !r.model.empty() || !r.command.empty() || !r.exact_match.empty() || !r.regex.empty() || !r.function.empty();
  if (single && !p.rewards.empty())
    checks.fail("ppo.rewards", "cannot be set together with a source in ppo.reward (list every source in ppo.rewards)");
  for (size_t i = 0; i < p.rewards.size(); ++i) {
    const auto& item = p.rewards[i];
    const auto key = concat("ppo.rewards[", i, "]");
    if (item.scale != "none" || item.clip != 0)
      checks.fail(key + (item.scale != "none" ? ".scale" : ".clip"),
                  "applies to the summed score: set ppo.reward.scale / ppo.reward.clip");
    checks.model_folder(key + ".model", item.model);
  }
  if (p.dynamic_sampling && p.samples_per_prompt < 2)
    checks.fail("ppo.dynamic_sampling", concat("drops groups whose samples all scored the same, so it needs "
                                               "ppo.samples_per_prompt of at least 2, got ",
                                               p.samples_per_prompt));
  // Keys of multi-turn rollouts, which would do nothing without an environment (defaults pass: a printed config).
  if (p.environment.command.empty()) {
    const PpoConfig defaults;
    if (p.max_turns != defaults.max_turns)
      checks.fail("ppo.max_turns",
                  "applies to multi-turn rollouts, which need ppo.environment.command; without it "
                  "every rollout is one turn (set the command, or remove the key)");
    if (p.environment.timeout_s != defaults.environment.timeout_s)
      checks.fail("ppo.environment.timeout_s",
                  "applies to the environment program, and ppo.environment.command "
                  "names none (set the command, or remove the key)");
  }
  // The correction's keys, which would do nothing on the synchronous schedule (defaults pass).
  const AsyncConfig defaults;
  const auto& a = p.async;
  if (!a.one_step_off()) {
    if (a.correction != defaults.correction)
      checks.fail("ppo.async.correction",
                  "applies to the one-step-off schedule: set ppo.async.rollout_ranks or ppo.async.emulate: true, "
                  "or remove the key (a synchronous batch is its own weights')");
    if (a.is_cap != defaults.is_cap)
      checks.fail("ppo.async.is_cap",
                  "applies to the one-step-off schedule: set ppo.async.rollout_ranks or ppo.async.emulate: true, "
                  "or remove the key");
  }
  if (a.check_weights && a.rollout_ranks == 0)
    checks.fail("ppo.async.check_weights",
                "compares the weights rollout ranks sample with; set ppo.async.rollout_ranks");
  if (a.rollout_ranks > 0) {
    if (a.emulate)
      checks.fail("ppo.async.emulate",
                  "runs the one-step-off schedule without rollout ranks (its oracle); with ppo.async.rollout_ranks "
                  "the schedule runs on them: set one of the two");
    if (p.dynamic_sampling)
      checks.fail("ppo.dynamic_sampling",
                  "draws more rounds once a rollout is scored, which the trainers do after the rollout ranks have "
                  "moved on; it is not available with ppo.async.rollout_ranks");
    if (!p.critic_from.empty() && a.correction == OffPolicyCorrection::kBypass)
      checks.fail("ppo.async.correction",
                  "bypass keeps the values of the weights that sampled a batch, and a separate critic "
                  "(ppo.critic_from) stays on the training ranks; use truncated_is, which recomputes them");
  }
  checks.model_folder("ppo.reference", p.reference);
  checks.model_folder("ppo.reward.model", p.reward.model);
  checks.model_folder("ppo.critic_from", p.critic_from);
  if (!p.critic_from.empty() && p.advantage != Advantage::kGae)
    checks.fail("ppo.critic_from",
                concat("advantage ", kAdvantages.name(p.advantage), " has no critic; a separate critic serves gae"));
  // Under tensor parallelism the ranks of a group sample together; what they cannot share yet is refused.
  if (const auto T = cfg.dist.tensor_parallel; T > 1) {
    const auto refuse = [&](const std::string& key, const std::string& what) {
      checks.fail(key, concat(what, " is not supported under tensor parallelism (dist.tensor_parallel: ", T,
                              ") yet; set dist.tensor_parallel: 1"));
    };
    if (p.async.rollout_ranks > 0) refuse("ppo.async.rollout_ranks", "sampling on rollout ranks of their own");
    if (!p.environment.command.empty())
      refuse("ppo.environment.command", "a multi-turn rollout with an environment program");
    if (!p.critic_from.empty()) refuse("ppo.critic_from", "a critic trained beside the policy");
  }
}

}  // namespace

// Called from the list of built-in objectives (objective_registry.cpp).
void register_ppo_objective() {
  config::register_section<PpoConfig>("ppo", "Online RL: PPO, GRPO and RLOO (algorithm: ppo; docs/algorithms.md).",
                                      "ppo", check_ppo,
                                      {{"num_generations", "ppo.samples_per_prompt"},
                                       {"max_completion_length", "ppo.max_new_tokens"},
                                       {"num_ppo_epochs", "ppo.ppo_epochs"},
                                       {"num_iterations", "ppo.ppo_epochs"},
                                       {"epsilon", "ppo.cliprange"},
                                       {"cliprange", "ppo.cliprange"},
                                       {"epsilon_high", "ppo.cliprange_high"},
                                       {"beta", "ppo.kl_coef"},
                                       {"loss_type", "ppo.loss_aggregation"},
                                       {"reward_funcs", "ppo.rewards"},
                                       {"reward_weights", "ppo.rewards"},
                                       {"rloo_k", "ppo.samples_per_prompt"},
                                       {"response_length", "ppo.max_new_tokens"},
                                       {"vf_coef", "ppo.vf_coef"},
                                       {"kl_coef", "ppo.kl_coef"}});
  auto reads = config::dataset_keys({"eval_fraction", "prompt_field"});
  reads.insert(reads.end(), {"data.template", "data.on_error", "train.fused_loss", "eval.generate_samples",
                             "eval.max_new_tokens", "eval.table_rows", "dist.tensor_parallel"});
  register_objective<PpoObjective>("ppo", reads);
  register_side_ranks("ppo", "ppo.async.rollout_ranks",
                      [](const config::RunConfig& cfg) { return ppo_config(cfg).async.rollout_ranks; });
}

}  // namespace anvil::train
