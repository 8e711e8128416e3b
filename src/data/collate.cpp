#include "anvil/data/collate.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace anvil::data {

SftBatch collate_sft(const std::vector<const SftSample*>& samples, int64_t pad_id) {
  TORCH_CHECK(!samples.empty(), "collate_sft: empty batch");
  size_t T = 0;
  for (const auto* s : samples) T = std::max(T, s->input_ids.size());
  const auto B = static_cast<int64_t>(samples.size());
  auto ids = at::full({B, static_cast<int64_t>(T)}, pad_id < 0 ? 0 : pad_id, at::kLong);
  auto labels = at::full({B, static_cast<int64_t>(T)}, kIgnoreIndex, at::kLong);
  auto ia = ids.accessor<int64_t, 2>();
  auto la = labels.accessor<int64_t, 2>();
  SftBatch out;
  for (int64_t b = 0; b < B; ++b) {
    const auto& s = *samples[static_cast<size_t>(b)];
    for (size_t t = 0; t < s.input_ids.size(); ++t) {
      ia[b][static_cast<int64_t>(t)] = s.input_ids[t];
      la[b][static_cast<int64_t>(t)] = s.labels[t];
      if (t > 0 && s.labels[t] != kIgnoreIndex) ++out.num_targets;
    }
    out.num_tokens += static_cast<int64_t>(s.input_ids.size());
  }
  out.input_ids = ids;
  out.labels = labels;
  return out;
}

}  // namespace anvil::data
