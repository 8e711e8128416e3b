// PPO's multi-turn rollouts (ppo.environment): turns of generation, each
// answered by the environment program, until it says done (docs/algorithms.md).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "train/objectives/ppo/ppo_state.h"

namespace anvil::train {

std::vector<int64_t> PpoObjective::State::appended_tokens(const std::vector<chat::Message>& conversation,
                                                          const chat::Message& message,
                                                          const chat::PromptSample& sample) const {
  // What the template writes after the turn's end of turn (chatml's newline),
  // then the message and the next assistant header: the rendering with the
  // message minus the rendering without it.
  const auto before = chat->encode(tok, conversation, false, sample.tools).input_ids;
  auto next = conversation;
  next.push_back(message);
  const auto after = chat->encode_prompt(tok, next, sample.tools);
  if (after.size() < before.size() || !std::equal(before.begin(), before.end(), after.begin()))
    throw DataError(concat(sample.where, ": data.template ", chat->name(), " renders the conversation with the ",
                           "environment's ", message.role, " message so that it does not begin with the ",
                           "conversation as rendered before it; its tokens cannot be appended to the rollout"));
  const auto eot = std::find(before.rbegin(), before.rend(), stop_id);
  if (eot == before.rend())
    throw Error(concat("data.template ", chat->name(), ": an assistant turn renders without its end of turn (token ",
                       stop_id, ")"));
  std::vector<int64_t> out(eot.base(), before.end());
  out.insert(out.end(), after.begin() + static_cast<std::ptrdiff_t>(before.size()), after.end());
  return out;
}

std::vector<RolloutRow> PpoObjective::State::episodes(models::CausalLM& policy, const std::vector<RolloutPrompt>& mine,
                                                      int64_t per_prompt, uint64_t seed, bool greedy) {
  struct Episode {
    const chat::PromptSample* sample;
    std::vector<chat::Message> conversation;
    uint64_t seed;
    bool open = true;
  };
  const int64_t budget = greedy ? cfg.eval.max_new_tokens : ppo.max_new_tokens;  // every token after the prompt
  std::vector<Episode> eps;
  std::vector<RolloutRow> rows;
  for (const auto& p : mine)
    for (int64_t k = 0; k < per_prompt; ++k) {
      // A text prompt is the user's first message.
      auto conversation = p.sample->messages;
      if (p.sample->text_prompt || conversation.empty()) conversation = {{"user", p.sample->prompt}};
      eps.push_back({p.sample, std::move(conversation),
                     seed ^ (static_cast<uint64_t>(p.global_index * per_prompt + k) * 0x9E3779B97F4A7C15ull)});
      rows.emplace_back();
      rows.back().prompt = p.sample->prompt_ids;
      rows.back().turns = 0;
    }
  for (int64_t turn = 1; turn <= ppo.max_turns; ++turn) {
    std::vector<size_t> open;
    for (size_t i = 0; i < eps.size(); ++i)
      if (eps[i].open) open.push_back(i);
    if (open.empty()) break;
    auto so = sampling(greedy);
    so.max_new_tokens = 0;  // the most any open episode has room for, below
    std::vector<std::vector<int64_t>> contexts;
    for (const auto i : open) {
      auto context = rows[i].prompt;
      context.insert(context.end(), rows[i].response.begin(), rows[i].response.end());
      contexts.push_back(std::move(context));
      // Each turn its own stream, from the sample's place in the prompt stream and the turn.
      so.row_seeds.push_back(eps[i].seed + static_cast<uint64_t>(turn - 1) * 0xD1B54A32D192ED03ull);
      so.max_new_tokens = std::max<int64_t>(so.max_new_tokens, budget - static_cast<int64_t>(rows[i].response.size()));
    }
    const auto out = decoder_of(policy).generate(contexts, so);
    for (size_t j = 0; j < open.size(); ++j) {
      auto& e = eps[open[j]];
      auto& r = rows[open[j]];
      auto t = out[j];
      const auto room = static_cast<size_t>(budget - static_cast<int64_t>(r.response.size()));
      if (t.size() > room) t.resize(room);  // a longer budget served another row
      const bool ended = !t.empty() && t.back() == stop_id;
      r.response.insert(r.response.end(), t.begin(), t.end());
      r.appended.resize(r.response.size(), 0);
      r.answer.assign(t.begin(), ended ? t.end() - 1 : t.end());
      r.ended = ended;
      r.turns = turn;
      e.conversation.push_back({"assistant", tok.decode(r.answer)});
      const bool out_of_room = static_cast<int64_t>(r.response.size()) >= budget;
      auto reply = environment->step(rewards::environment_line(e.sample->record, e.conversation, turn,
                                                               turn == ppo.max_turns || !ended || out_of_room, ended,
                                                               e.sample->where));
      if (!reply.done) {
        const auto more = appended_tokens(e.conversation, reply.message, *e.sample);
        if (static_cast<int64_t>(r.response.size() + more.size()) < budget) {
          r.response.insert(r.response.end(), more.begin(), more.end());
          r.appended.resize(r.response.size(), 1);
          e.conversation.push_back(reply.message);
          continue;  // the policy takes the next turn
        }
        // No room for the message and another turn: the episode ends here.
        reply = environment->step(
            rewards::environment_line(e.sample->record, e.conversation, turn, true, ended, e.sample->where));
      }
      r.env_reward = reply.reward;
      e.open = false;
    }
  }
  return rows;
}

}  // namespace anvil::train
