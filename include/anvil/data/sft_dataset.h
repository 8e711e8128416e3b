#pragma once
// Supervised fine-tuning data: JSONL lines {"prompt": ..., "response": ...},
// tokenized once. Labels mask the prompt (unless asked otherwise) so the loss
// covers response tokens plus EOS.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "anvil/tokenizer/tokenizer.h"

namespace anvil::data {

/// Label value that the loss ignores (HF / PyTorch convention).
constexpr int64_t kIgnoreIndex = -100;

struct SftSample {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;  // aligned with input_ids; kIgnoreIndex where not trained
  std::string prompt;
  std::string response;
  int64_t prompt_tokens = 0;
};

struct SftOptions {
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  int64_t max_length = 0;        // 0 = unlimited
  bool drop_overflow = false;    // else truncate from the right
  bool train_on_prompt = false;
  bool add_eos = true;
};

/// What loading did to the data, reported to the user.
struct SftStats {
  int64_t lines = 0;
  int64_t truncated = 0;          // kept, cut to max_length
  int64_t dropped_overflow = 0;
  int64_t dropped_no_target = 0;  // nothing left to train on after truncation
};

/// Tokenizes one prompt/response pair (shared by datasets and tests).
SftSample make_sft_sample(const tokenizer::Tokenizer& tok, std::string prompt, std::string response,
                          const SftOptions& opt);

class SftDataset {
 public:
  /// Throws DataError naming the file, line and field of a malformed record.
  static SftDataset load(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                         const SftOptions& opt);

  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const SftSample& operator[](int64_t i) const { return samples_[static_cast<size_t>(i)]; }
  const SftStats& stats() const { return stats_; }

 private:
  std::vector<SftSample> samples_;
  SftStats stats_;
};

}  // namespace anvil::data
