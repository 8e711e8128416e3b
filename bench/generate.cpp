// Generation throughput of generation::generate on a model folder, for the
// side-by-side comparison with transformers.generate (bench/gpu/run.sh):
// the same prompts (a JSON list of id lists), a fixed number of new tokens
// (no stop token), greedy or sampled (temperature 1, no top-k/top-p).
// Prints one JSON line: median wall time over repeats, after one warm-up.
// With --keep-decoder 1 the warm-up and the repeats share one
// generation::Decoder that keeps its buckets: on CUDA the repeats replay the
// decode graph the warm-up recorded.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distributed/sharding.h"
#include "anvil/generation/generate.h"
#include "anvil/checkpoint/hf_model.h"
#include "bench_util.h"

int main(int argc, char** argv) {
  using namespace anvil;
  auto a = bench::parse_args(argc, argv,
                             {{"model", ""},
                              {"prompts", ""},
                              {"new", "128"},
                              {"mode", "greedy"},
                              {"device", "cpu"},
                              {"dtype", "float32"},
                              {"repeats", "3"},
                              {"threads", "0"},
                              {"tokens-out", ""},
                              {"cuda-graphs", "auto"},
                              {"keep-decoder", "0"},
                              {"seed", "0"}});
  if (a["model"].empty() || a["prompts"].empty()) {
    std::fprintf(stderr,
                 "usage: bench_generate --model DIR --prompts ids.json [--new N] [--mode greedy|sample] "
                 "[--device cuda] [--dtype bfloat16] [--repeats R] [--tokens-out F] [--cuda-graphs auto|on|off] "
                 "[--keep-decoder 0|1] "
                 "[--seed S]\n");
    return 2;
  }
  if (std::stoi(a["threads"]) > 0) at::set_num_threads(std::stoi(a["threads"]));
  const auto prompts = nlohmann::json::parse(std::ifstream(a["prompts"])).get<std::vector<std::vector<int64_t>>>();
  auto model = checkpoint::load_model_dir(a["model"]);
  const at::Device device(a["device"]);
  model->to(device, distributed::parse_dtype(a["dtype"]));
  generation::SamplingOptions opt;
  opt.max_new_tokens = std::stol(a["new"]);
  opt.eos_id = -1;
  opt.greedy = a["mode"] == "greedy";
  opt.temperature = 1.0;
  opt.seed = std::stoull(a["seed"]);
  opt.cuda_graphs = a["cuda-graphs"] == "on"    ? generation::CudaGraphs::kOn
                    : a["cuda-graphs"] == "off" ? generation::CudaGraphs::kOff
                                                : generation::CudaGraphs::kAuto;
  generation::DecoderOptions keep;
  keep.keep_buckets = a["keep-decoder"] == "1";
  generation::Decoder decoder(*model, keep);
  decoder.generate(prompts, opt);  // warm-up: allocator, kernels, caches (and the kept bucket)
  std::vector<double> times;
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < std::stoi(a["repeats"]); ++r) {
    const double t0 = bench::now_s();
    out = decoder.generate(prompts, opt);  // ends on the host: the tokens come back once, at the end
    times.push_back(bench::now_s() - t0);
  }
  int64_t produced = 0;
  for (const auto& o : out) produced += static_cast<int64_t>(o.size());
  if (!a["tokens-out"].empty()) std::ofstream(a["tokens-out"]) << nlohmann::json(out).dump() << "\n";
  const double med = bench::median(times);
  const char* impl = keep.keep_buckets ? "anvil-kept-decoder" : a["cuda-graphs"] == "off" ? "anvil-eager" : "anvil";
  std::printf("%s\n", nlohmann::json({{"impl", impl},
                                      {"family", model->family()},
                                      {"mode", a["mode"]},
                                      {"device", a["device"]},
                                      {"dtype", a["dtype"]},
                                      {"batch", prompts.size()},
                                      {"prompt_len", prompts.empty() ? 0 : prompts[0].size()},
                                      {"new_tokens", opt.max_new_tokens},
                                      {"graph_replays", decoder.replays()},
                                      {"median_s", med},
                                      {"tokens_per_s", static_cast<double>(produced) / med}})
                          .dump()
                          .c_str());
  return 0;
}
