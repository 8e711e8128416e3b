#include "data/collate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <unordered_set>

namespace anvil::data {

LmBatch collate_unpacked(const std::vector<const LmSample*>& samples, int64_t pad_id, int64_t multiple, int64_t cap) {
  TORCH_CHECK(!samples.empty(), "collate_unpacked: empty batch");
  size_t T = 0;
  for (const auto* s : samples) T = std::max(T, s->input_ids.size());
  if (multiple > 0) {
    auto padded =
        (T + static_cast<size_t>(multiple) - 1) / static_cast<size_t>(multiple) * static_cast<size_t>(multiple);
    if (cap > 0) padded = std::min(padded, std::max(T, static_cast<size_t>(cap)));
    T = padded;
  }
  const auto B = static_cast<int64_t>(samples.size());
  auto ids = at::full({B, static_cast<int64_t>(T)}, pad_id < 0 ? 0 : pad_id, at::kLong);
  auto labels = at::full({B, static_cast<int64_t>(T)}, kIgnoreIndex, at::kLong);
  auto ia = ids.accessor<int64_t, 2>();
  auto la = labels.accessor<int64_t, 2>();
  auto mask = at::zeros({B, static_cast<int64_t>(T)}, at::kBool);
  LmBatch out;
  for (int64_t b = 0; b < B; ++b) {
    const auto& s = *samples[static_cast<size_t>(b)];
    mask[b].narrow(0, 0, static_cast<int64_t>(s.input_ids.size())).fill_(true);
    for (size_t t = 0; t < s.input_ids.size(); ++t) {
      ia[b][static_cast<int64_t>(t)] = s.input_ids[t];
      la[b][static_cast<int64_t>(t)] = s.labels[t];
      if (t > 0 && s.labels[t] != kIgnoreIndex) ++out.num_targets;
    }
    out.num_tokens += static_cast<int64_t>(s.input_ids.size());
  }
  out.input_ids = ids;
  out.labels = labels;
  out.attention_mask = mask;
  return out;
}

LmBatch collate_packed(const std::vector<std::vector<const LmSample*>>& rows, int64_t row_len, int64_t pad_id) {
  TORCH_CHECK(!rows.empty(), "collate_packed: empty batch");
  const auto B = static_cast<int64_t>(rows.size());
  auto ids = at::full({B, row_len}, pad_id < 0 ? 0 : pad_id, at::kLong);
  auto labels = at::full({B, row_len}, kIgnoreIndex, at::kLong);
  auto pos = at::zeros({B, row_len}, at::kLong);
  auto doc = at::full({B, row_len}, -1, at::kLong);
  auto ia = ids.accessor<int64_t, 2>();
  auto la = labels.accessor<int64_t, 2>();
  auto pa = pos.accessor<int64_t, 2>();
  auto da = doc.accessor<int64_t, 2>();
  LmBatch out;
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0, d = -1, p = 0;
    for (const auto* s : rows[static_cast<size_t>(b)]) {
      const auto n = static_cast<int64_t>(s->input_ids.size());
      TORCH_CHECK(t + n <= row_len, "collate_packed: samples overflow the row (", t + n, " > ", row_len, ")");
      size_t next_doc = 0;
      for (int64_t i = 0; i < n; ++i, ++t) {
        const bool starts = next_doc < s->doc_starts.size() && s->doc_starts[next_doc] == i;
        if (starts) ++next_doc, ++d, p = 0;
        ia[b][t] = s->input_ids[static_cast<size_t>(i)];
        // A document's first token has no context of its own: never a target.
        la[b][t] = starts ? kIgnoreIndex : s->labels[static_cast<size_t>(i)];
        pa[b][t] = p++;
        da[b][t] = d;
        if (t > 0 && la[b][t] != kIgnoreIndex) ++out.num_targets;
      }
      out.num_tokens += n;
    }
  }
  out.input_ids = ids;
  out.labels = labels;
  out.position_ids = pos;
  out.doc_ids = doc;
  return out;
}

std::optional<DocumentOffsets> document_offsets(const at::Tensor& doc_ids) {
  TORCH_CHECK(doc_ids.dim() == 2 && doc_ids.scalar_type() == at::kLong && !doc_ids.is_cuda(),
              "document_offsets: doc_ids must be (B, T) int64 on the host");
  const auto d = doc_ids.contiguous();
  const auto da = d.accessor<int64_t, 2>();
  const int64_t B = d.size(0), T = d.size(1);
  TORCH_CHECK(B * T <= std::numeric_limits<int32_t>::max(), "document_offsets: ", B * T, " tokens overflow int32");
  DocumentOffsets out;
  std::vector<int32_t> cu{0};
  std::unordered_set<int64_t> seen;
  for (int64_t b = 0; b < B; ++b) {
    seen.clear();
    for (int64_t t = 0; t < T; ++t) {
      if (t > 0 && da[b][t] == da[b][t - 1]) continue;
      if (!seen.insert(da[b][t]).second) return std::nullopt;  // the id comes back after another: not a run
      if (t > 0) cu.push_back(static_cast<int32_t>(b * T + t));
    }
    cu.push_back(static_cast<int32_t>((b + 1) * T));
  }
  for (size_t i = 1; i < cu.size(); ++i) out.max_seqlen = std::max<int64_t>(out.max_seqlen, cu[i] - cu[i - 1]);
  out.cu_seqlens = at::tensor(cu, at::kInt);
  return out;
}

}  // namespace anvil::data
