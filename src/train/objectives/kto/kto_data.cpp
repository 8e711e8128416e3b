// KTO's data (kto_data.h): reading examples, collating micro-batches with
// their KL rows, and the stream of them.
#include "train/objectives/kto/kto_data.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "anvil/chat/chat.h"
#include "anvil/core/error.h"
#include "data/jsonl.h"

namespace anvil::train {
namespace {

std::string completion_text(const data::Record& rec, const std::string& field) {
  const auto& v = rec.at(field);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array() && v.size() == 1 && v[0].is_object() && v[0].contains("role") && v[0]["role"] == "assistant" &&
      v[0].contains("content") && v[0]["content"].is_string())
    return v[0]["content"].get<std::string>();
  rec.fail(field, concat("expected a string or a list of one assistant message, got ", v.dump()));
}

}  // namespace

KtoDataset KtoDataset::load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                            const data::ReadOptions& opt) {
  KtoDataset ds;
  const auto& tmpl = data::chat_format(opt);
  const auto& pf = opt.prompt_field;
  const auto r = data::read_jsonl(path, opt.on_error, [&](const data::Record& rec) {
    const bool paired = rec.has("chosen") || rec.has("rejected");
    if (paired ? !(rec.has(pf) && rec.has("chosen") && rec.has("rejected"))
               : !(rec.has(pf) && rec.has("completion") && rec.has("label"))) {
      std::string fields;
      for (const auto& [k, v] : rec.json().items()) fields += (fields.empty() ? "" : ", ") + k;
      throw DataError(concat(rec.where(), ": expected a KTO record: {\"", pf,
                             "\", \"completion\", \"label\": true | false} (TRL's unpaired preference format) or a "
                             "pair {\"",
                             pf,
                             "\", \"chosen\", \"rejected\"} (unpaired into a desirable and an "
                             "undesirable example); this line has fields ",
                             fields.empty() ? std::string("none") : fields,
                             ". data.train[].prompt_field maps another prompt name"));
    }
    std::vector<std::pair<std::string, bool>> completions;
    if (paired) {
      completions = {{completion_text(rec, "chosen"), true}, {completion_text(rec, "rejected"), false}};
    } else {
      if (!rec.at("label").is_boolean())
        rec.fail("label", concat("expected true (desirable) or false (undesirable), got ", rec.at("label").dump()));
      completions = {{completion_text(rec, "completion"), rec.at("label").get<bool>()}};
    }
    const auto msgs = data::record_messages(rec, pf, "", false);
    std::vector<int64_t> prompt_ids;
    std::vector<std::vector<int64_t>> ids;
    try {
      prompt_ids = data::encode_record_prompt(tok, tmpl, msgs, data::is_text_prompt(rec, pf), data::record_tools(rec));
      for (const auto& [text, good] : completions) ids.push_back(tmpl.encode_reply(tok, text));
    } catch (const DataError& e) {
      if (std::string_view(e.what()).substr(0, rec.where().size()) == rec.where()) throw;
      throw DataError(concat(rec.where(), ": ", e.what()));
    }
    std::string prompt;
    for (size_t i = 0; i < msgs.size(); ++i) prompt += (i ? "\n" : "") + msgs[i].content;
    for (size_t i = 0; i < completions.size(); ++i) {
      auto& c = ids[i];
      std::vector<int64_t> uncut;
      if (opt.max_length > 0) {
        const auto room = opt.max_length - static_cast<int64_t>(prompt_ids.size());
        if (static_cast<int64_t>(c.size()) > room) {
          if (opt.drop_overflow) {
            ++ds.stats_.dropped_overflow;
            continue;
          }
          if (room < 1) {
            ++ds.stats_.dropped_no_target;
            continue;
          }
          uncut = c;
          c.resize(static_cast<size_t>(room));
          ++ds.stats_.truncated;
        }
      }
      ds.samples_.push_back(
          {prompt_ids, std::move(c), std::move(uncut), completions[i].second, prompt, completions[i].first});
    }
  });
  ds.stats_.lines = r.lines;
  ds.stats_.skipped_errors = r.skipped;
  ds.stats_.first_errors = r.first_errors;
  if (ds.samples_.empty()) throw DataError(concat(path.string(), ": no usable samples (", ds.stats_.summary(), ")"));
  return ds;
}

Batch collate_kto(const std::vector<const KtoSample*>& ex, int64_t pad_id, int64_t max_length, bool kl_rows) {
  TORCH_CHECK(!ex.empty(), "collate_kto: empty batch");
  const auto n = static_cast<int64_t>(ex.size());
  std::vector<std::pair<const std::vector<int64_t>*, std::vector<int64_t>>> rows;  // prompt, completion
  for (int64_t i = 0; i < n; ++i)
    rows.push_back({&ex[static_cast<size_t>(i)]->prompt_ids, ex[static_cast<size_t>(i)]->completion_ids});
  for (int64_t i = 0; kl_rows && i < n; ++i) {
    const auto* other = ex[static_cast<size_t>((i + n - 1) % n)];
    auto c = other->uncut_completion_ids.empty() ? other->completion_ids : other->uncut_completion_ids;
    const auto& p = ex[static_cast<size_t>(i)]->prompt_ids;
    if (max_length > 0 && static_cast<int64_t>(p.size() + c.size()) > max_length)
      c.resize(static_cast<size_t>(std::max<int64_t>(1, max_length - static_cast<int64_t>(p.size()))));
    rows.push_back({&p, std::move(c)});
  }
  int64_t T = 0;
  for (const auto& [p, c] : rows) T = std::max<int64_t>(T, static_cast<int64_t>(p->size() + c.size()));
  const auto R = static_cast<int64_t>(rows.size());
  auto ids = at::full({R, T}, pad_id, at::kLong);
  auto labels = at::full({R, T}, chat::kIgnoreIndex, at::kLong);
  auto mask = at::zeros({R, T}, at::kBool);
  auto* pi = ids.data_ptr<int64_t>();
  auto* pl = labels.data_ptr<int64_t>();
  Batch b;
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& [p, c] = rows[r];
    const auto row = static_cast<int64_t>(r) * T, P = static_cast<int64_t>(p->size());
    std::copy(p->begin(), p->end(), pi + row);
    std::copy(c.begin(), c.end(), pi + row + P);
    std::copy(c.begin(), c.end(), pl + row + P);
    mask[static_cast<int64_t>(r)].narrow(0, 0, P + static_cast<int64_t>(c.size())).fill_(true);
    b.num_tokens += P + static_cast<int64_t>(c.size());
  }
  std::vector<uint8_t> good;
  for (const auto* e : ex) good.push_back(e->desirable);
  b.tensors["input_ids"] = ids;
  b.tensors["labels"] = labels;
  b.tensors["attention_mask"] = mask;
  b.tensors["desirable"] = at::tensor(at::ArrayRef<uint8_t>(good), at::kByte).to(at::kBool);
  b.num_targets = n;
  return b;
}

std::vector<const KtoSample*> kto_samples(const std::vector<std::shared_ptr<const KtoDataset>>& sets,
                                          const std::vector<data::SampleRef>& refs) {
  std::vector<const KtoSample*> ex;
  for (const auto& r : refs) ex.push_back(&(*sets[static_cast<size_t>(r.dataset)])[r.index]);
  return ex;
}

Batch collate_kto_refs(const std::vector<std::shared_ptr<const KtoDataset>>& sets,
                       const std::vector<data::SampleRef>& refs, const std::vector<int64_t>& positions, int64_t pad_id,
                       int64_t max_length, bool kl_rows) {
  TORCH_CHECK(positions.size() == refs.size(), "collate_kto_refs: ", refs.size(), " examples, ", positions.size(),
              " positions");
  auto b = collate_kto(kto_samples(sets, refs), pad_id, max_length, kl_rows);
  std::vector<int64_t> dataset, index;
  for (const auto& r : refs) dataset.push_back(r.dataset), index.push_back(r.index);
  b.tensors["dataset"] = at::tensor(dataset, at::kLong);
  b.tensors["index"] = at::tensor(index, at::kLong);
  b.tensors["position"] = at::tensor(positions, at::kLong);
  return b;
}

KtoBatchSource::KtoBatchSource(std::vector<std::shared_ptr<const KtoDataset>> sets, data::MixtureSampler sampler,
                               int64_t micro_batch_size, int64_t pad_id, int64_t max_length, bool kl_rows)
    : sets_(std::move(sets)),
      sampler_(std::move(sampler)),
      micro_batch_size_(micro_batch_size),
      pad_id_(pad_id),
      max_length_(max_length),
      kl_rows_(kl_rows) {}

Batch KtoBatchSource::next() {
  std::vector<data::SampleRef> refs;
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < micro_batch_size_; ++i) {
    refs.push_back(sampler_.next());
    positions.push_back(sampler_.state().offset - 1);  // next() has moved past it, in its own epoch
  }
  return collate_kto_refs(sets_, refs, positions, pad_id_, max_length_, kl_rows_);
}

}  // namespace anvil::train
