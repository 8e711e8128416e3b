// Single-threaded encoding throughput of a tokenizer (tokenizer.json or
// tokenizer.model) over a corpus: one encode per line, or per document of
// --lines-per-doc lines joined by "\n", as a data pipeline tokenizes records. bench/tokenize_hf.py measures Hugging
// Face `tokenizers` (and sentencepiece) on the same files; bench/run.sh runs both.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "anvil/tokenizer/tokenizer.h"
#include "bench_util.h"

int main(int argc, char** argv) {
  using namespace anvil;
  auto a = bench::parse_args(
      argc, argv, {{"tokenizer", ""}, {"corpus", ""}, {"repeat", "5"}, {"warmup", "1"}, {"lines-per-doc", "1"}});
  if (a["tokenizer"].empty() || a["corpus"].empty()) {
    std::fprintf(stderr, "usage: bench_tokenize_throughput --tokenizer DIR_OR_FILE --corpus FILE [--repeat N]\n");
    return 2;
  }
  const auto tok = tokenizer::load_tokenizer("auto", a["tokenizer"]);
  std::vector<std::string> docs;
  size_t bytes = 0, lines = 0;
  {
    std::ifstream in(a["corpus"], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot open\n", a["corpus"].c_str());
      return 2;
    }
    const size_t per_doc = std::stoul(a["lines-per-doc"]);
    std::string line;
    while (std::getline(in, line)) {
      if (lines++ % per_doc == 0)
        docs.emplace_back();
      else
        docs.back() += '\n';
      docs.back() += line;
    }
    for (const auto& d : docs) bytes += d.size();
  }
  const int repeat = std::stoi(a["repeat"]), warmup = std::stoi(a["warmup"]);
  std::vector<double> times;
  size_t tokens = 0;
  for (int r = 0; r < warmup + repeat; ++r) {
    size_t n = 0;
    const double t0 = bench::now_s();
    for (const auto& d : docs) n += tok->encode(d).size();
    if (r >= warmup) times.push_back(bench::now_s() - t0);
    tokens = n;
  }
  const double med = bench::median(times);
  std::printf("%s\n", nlohmann::json({{"impl", "anvil"},
                                      {"kind", tok->kind()},
                                      {"tokenizer", a["tokenizer"]},
                                      {"corpus", a["corpus"]},
                                      {"lines", lines},
                                      {"docs", docs.size()},
                                      {"bytes", bytes},
                                      {"tokens", tokens},
                                      {"repeat", repeat},
                                      {"seconds", med},
                                      {"mb_per_s", static_cast<double>(bytes) / med / 1e6},
                                      {"tokens_per_s", static_cast<double>(tokens) / med}})
                          .dump()
                          .c_str());
  return 0;
}
