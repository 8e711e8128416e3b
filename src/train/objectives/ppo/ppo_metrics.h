#pragma once
// Internal (not installed): PPO's metrics under TRL's names
// (docs/algorithms.md). Every run logs PPOTrainer's (objective/*, policy/*,
// loss/*, val/*); GRPO and RLOO runs log GRPOTrainer's and RLOOTrainer's
// too (reward, reward_std, frac_reward_zero_std, completions/*, kl,
// entropy), defined as TRL 1.16 defines them.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/train/objective.h"
#include "anvil/train/ppo.h"
#include "train/objectives/ppo/ppo_rollout.h"

namespace anvil::train {

/// Whether a run of ppo.advantage `advantage` logs GRPOTrainer's and
/// RLOOTrainer's names (grpo, rloo).
bool logs_group_metrics(Advantage advantage);

/// A rollout's metrics under GRPOTrainer's and RLOOTrainer's names, from
/// every rank's rows (N) and their generated tokens `g`:
///   reward, reward_std: the mean and unbiased std over the rollout of the
///     rows' scores (the reward sources' weighted sum, the environment's
///     reward included);
///   frac_reward_zero_std: the fraction of rows whose group (of `group`
///     rows) has an std of 0 among the `compared` scores (N), those the
///     advantages are computed from; with `batch_std`, 1 or 0 as the std of
///     the whole rollout is 0 or not (TRL's scale_rewards: batch);
///   completions/mean_length, min_length, max_length: each row's generated
///     tokens (its end of turn included, appended messages not);
///     completions/clipped_ratio: the fraction of rows that did not end
///     (cut by max_new_tokens); completions/mean_terminated_length,
///     min_terminated_length, max_terminated_length: over the rows that
///     ended (0 when none did);
///   kl, when `kl` (N, A: per generated token, 0 outside g.mask) is given:
///     its mean over the generated tokens (RLOO's KL penalty).
Metrics group_rollout_metrics(const std::vector<RolloutRow>& rows, const GeneratedTokens& g, const at::Tensor& compared,
                              int64_t group, bool batch_std, const at::Tensor& kl = {});

/// A training step's metrics from its summed statistics (the sums
/// PpoObjective::loss_sum adds): PPOTrainer's, and with `group_metrics`
/// GRPOTrainer's entropy and, when the loss has a KL term, kl (means over
/// the step's response tokens).
Metrics ppo_step_metrics(const Sums& sums, bool group_metrics);

}  // namespace anvil::train
