// Tensor parallelism installed from outside the model (distributed/tensor_parallel.h) and the mesh its groups
// come from (distributed/mesh.h). In one process: the mesh's rank layout, the shares' round trip and a virtual
// mesh (the shares computed one after another, the all-reduce a sum) of a column- then row-parallel pair. Under
// mpirun (this binary re-run as the ranks): every family's debug flavor split over 2 ranks, and over the tensor-
// parallel groups of a 2 x 2 mesh, gives the logits and gradients of the whole model in one process.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>
#include <filesystem>
#include <set>
#include <string>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/models/registry.h"
#include "distributed/context_parallel.h"
#include "distributed/dist_runs.h"
#include "distributed/env.h"
#include "distributed/mesh.h"
#include "distributed/sharding.h"
#include "distributed/tensor_parallel.h"
#include "io/safetensors.h"
#include "models/init.h"
#include "models/layers.h"
#include "models/lora.h"
#include "test_util.h"

namespace anvil::distributed {
namespace {

namespace stdfs = std::filesystem;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MeshLayout, TensorParallelIsInnermostThenContextThenData) {
  const MeshLayout mesh(8, {2, 2});
  EXPECT_EQ(mesh.dp(), 2);
  // Rank 5 = dp 1, cp 0, tp 1.
  const auto c = mesh.coordinates(5);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(mesh.rank_of(c), 5);
  EXPECT_EQ(mesh.group(5, "tp"), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(mesh.group(5, "cp"), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(mesh.group(5, "dp"), (std::vector<int64_t>{1, 5}));
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(mesh.rank_of(mesh.coordinates(r)), r);
  // Every rank is in exactly one group per dimension, and groups are disjoint.
  for (const char* dim : {"tp", "cp", "dp"}) {
    std::vector<int> seen(8, 0);
    for (int64_t r = 0; r < 8; ++r)
      if (mesh.group(r, dim).front() == r)
        for (const auto m : mesh.group(r, dim)) ++seen[m];
    EXPECT_EQ(seen, std::vector<int>(8, 1)) << dim;
  }
  const MeshLayout tp_only(4, {4, 1});
  EXPECT_EQ(tp_only.group(2, "tp"), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(tp_only.dp(), 1);
}

TEST(MeshLayout, AWorldTheMeshDoesNotDivideIsRefusedByKey) {
  EXPECT_EQ(error_of([] {
              MeshLayout(6, {4, 1});
            }),
            "dist.tensor_parallel (4) x dist.context_parallel (1) must divide the world size, 6 ranks; FSDP takes the "
            "ranks left over (world / (tensor x context parallel))");
  EXPECT_NE(error_of([] {
              MeshLayout(4, {0, 1});
            }).find("dist.tensor_parallel: expected a positive integer, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              MeshLayout(4, {1, -2});
            }).find("dist.context_parallel: expected a positive integer"),
            std::string::npos);
}

TEST(TensorParallelShares, RoundTripThroughFusedParts) {
  const auto whole = at::arange(24 * 3, at::kFloat).view({24, 3});
  // Three fused parts (Phi-3's q, k, v): each is cut on its own.
  const ParallelShard cut{0, {12, 6, 6}};
  std::vector<at::Tensor> shares;
  for (int64_t r = 0; r < 3; ++r) shares.push_back(share_of(whole, cut, r, 3));
  EXPECT_EQ(shares[1].size(0), 8);
  // Rank 1 holds rows 4..7 of q, 14..15 of k, 20..21 of v.
  EXPECT_TRUE(shares[1].narrow(0, 0, 4).equal(whole.narrow(0, 4, 4)));
  EXPECT_TRUE(shares[1].narrow(0, 4, 2).equal(whole.narrow(0, 14, 2)));
  EXPECT_TRUE(shares[1].narrow(0, 6, 2).equal(whole.narrow(0, 20, 2)));
  EXPECT_TRUE(whole_from_shares(shares, cut).equal(whole));
  // Along the input features (a row-parallel weight), one part.
  const ParallelShard columns{1, {}};
  const auto w = at::randn({5, 8});
  EXPECT_TRUE(whole_from_shares({share_of(w, columns, 0, 2), share_of(w, columns, 1, 2)}, columns).equal(w));
}

// The shares of a column-parallel layer (fused parts, with bias) feeding a row-parallel one, computed rank after
// rank and summed as the all-reduce would: the two plain linears' output, and the shares' gradients are the
// whole gradients' shares.
TEST(TensorParallelShares, AVirtualMeshOfColumnThenRowEqualsThePlainLinears) {
  at::manual_seed(3);
  const int64_t C = 8, F = 12, tp = 2;
  const auto x = at::randn({3, 5, C});
  auto w1 = at::randn({F, C}).requires_grad_(), b1 = at::randn({F}).requires_grad_();
  auto w2 = at::randn({C, F}).requires_grad_(), b2 = at::randn({C}).requires_grad_();
  const auto target = at::randn({3, 5, C});
  const auto want = at::linear(at::gelu(at::linear(x, w1, b1)), w2, b2);
  (want * target).sum().backward();
  const ParallelShard col{0, {4, 8}}, bias{0, {4, 8}}, row{1, {4, 8}};
  at::Tensor sum;
  for (int64_t r = 0; r < tp; ++r) {
    auto s1 = share_of(w1.detach(), col, r, tp).requires_grad_();
    auto sb = share_of(b1.detach(), bias, r, tp).requires_grad_();
    auto s2 = share_of(w2.detach(), row, r, tp).requires_grad_();
    auto partial = at::linear(at::gelu(at::linear(x, s1, sb)), s2);
    (partial * target).sum().backward();  // the reduce's backward is the identity
    sum = r == 0 ? partial.detach() : sum + partial.detach();
    EXPECT_TRUE(at::allclose(s1.grad(), share_of(w1.grad(), col, r, tp), 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(sb.grad(), share_of(b1.grad(), bias, r, tp), 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(s2.grad(), share_of(w2.grad(), row, r, tp), 1e-5, 1e-6));
  }
  EXPECT_TRUE(at::allclose(sum + b2.detach(), want.detach(), 1e-5, 1e-5));
}

TEST(ContextParallel, HeadAndTailChunksRoundTripAndBadLengthsAreRefused) {
  // 16 positions over cp 2: four chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_TRUE(context_parallel_positions(16, 0, 2).equal(at::tensor({0, 1, 2, 3, 12, 13, 14, 15}, at::kLong)));
  EXPECT_TRUE(context_parallel_positions(16, 1, 2).equal(at::tensor({4, 5, 6, 7, 8, 9, 10, 11}, at::kLong)));
  const auto x = at::randn({3, 24, 5});
  for (const int64_t cp : {1, 2, 3, 4}) {
    std::vector<at::Tensor> shares;
    for (int64_t r = 0; r < cp; ++r) shares.push_back(context_parallel_share(x, r, cp));
    EXPECT_TRUE(context_parallel_whole(shares).equal(x)) << cp;
    // Causal work balances: every rank's positions sum to the same.
    for (int64_t r = 1; r < cp; ++r)
      EXPECT_EQ(context_parallel_positions(24, r, cp).sum().item<int64_t>(),
                context_parallel_positions(24, 0, cp).sum().item<int64_t>());
  }
  EXPECT_EQ(error_of([] { context_parallel_positions(20, 0, 4, "data.max_length"); }),
            "data.max_length: rows of 20 positions do not split into 2 x 4 chunks (context parallelism gives each "
            "rank a head and a tail chunk); expected a multiple of 8");
}

// Ring attention on a virtual mesh: each context-parallel rank's queries attend to every rank's key/value block
// in ring order (its own first), the partial outputs merged by their log-sum-exp; the shares put together are
// ATen's causal attention over the whole row, forward and backward, also with a sliding window.
TEST(ContextParallel, RingMergeOfKeyBlocksEqualsFullAttention) {
  at::manual_seed(5);
  const int64_t B = 2, H = 3, T = 16, D = 8, cp = 2;
  for (const int64_t window : {0, 5}) {
    SCOPED_TRACE(window);
    auto q = at::randn({B, H, T, D}).requires_grad_(), k = at::randn({B, H, T, D}).requires_grad_();
    auto v = at::randn({B, H, T, D}).requires_grad_();
    const auto pos = at::arange(T, at::kLong);
    auto allowed = pos.unsqueeze(1) >= pos.unsqueeze(0);
    if (window > 0) allowed = allowed & (pos.unsqueeze(1) - pos.unsqueeze(0) < window);
    const auto want = at::scaled_dot_product_attention(q, k, v, allowed);
    const auto w = at::randn(want.sizes());
    const auto grads = torch::autograd::grad({(want * w).sum()}, {q, k, v});
    std::vector<at::Tensor> outs;
    for (int64_t r = 0; r < cp; ++r) {
      const auto qr = context_parallel_share(q, r, cp, 2);
      const auto pq = context_parallel_positions(T, r, cp);
      at::Tensor out, lse;
      for (int64_t step = 0; step < cp; ++step) {
        const int64_t s = (r - step + cp) % cp;  // the block the ring has brought
        const auto pk = context_parallel_positions(T, s, cp);
        auto mask = pq.unsqueeze(1) >= pk.unsqueeze(0);
        if (window > 0) mask = mask & (pq.unsqueeze(1) - pk.unsqueeze(0) < window);
        auto [o, l] =
            attention_block(qr, context_parallel_share(k, s, cp, 2), context_parallel_share(v, s, cp, 2), mask);
        if (step == 0) {
          out = o, lse = l;
        } else {
          std::tie(out, lse) = merge_attention(out, lse, o, l);
        }
      }
      outs.push_back(out);
    }
    const auto got = context_parallel_whole(outs, 2);
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max().item<double>();
    const auto ring_grads = torch::autograd::grad({(got * w).sum()}, {q, k, v});
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(at::allclose(ring_grads[i], grads[i], 1e-5, 1e-5))
          << i << " " << (ring_grads[i] - grads[i]).abs().max().item<double>();
  }
  // A query no block lets attend: output 0, log-sum-exp -inf.
  const auto q = at::randn({1, 1, 2, 4}), k = at::randn({1, 1, 3, 4});
  auto none = at::ones({2, 3}, at::kBool);
  none[0].fill_(false);
  const auto [o, l] = attention_block(q, k, k, none);
  EXPECT_TRUE(o[0][0][0].eq(0).all().item<bool>());
  EXPECT_TRUE(std::isinf(l[0][0][0].item<float>()));
}

std::shared_ptr<models::CausalLM> build_flavor(const std::string& flavor, const std::vector<std::string>& extra = {},
                                               int64_t vocab = 61) {
  const auto src = anvil::testing::source_dir();
  auto overrides = extra;
  overrides.push_back("output_dir=unused");
  auto cfg =
      config::load_config({src + "/configs/quickstart.yaml", src + "/configs/models/" + flavor + ".yaml"}, overrides);
  auto mc = cfg.model;
  mc.vocab_size = vocab;
  at::manual_seed(17);
  return models::family_by_name(mc.family).from_config(mc);
}

/// max |a - b| over max(max |b|, 1): relative, except for values that are round-off of zero (OPT's key bias gets
/// a zero gradient in exact arithmetic, softmax being blind to a constant added to every score of a query).
double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1.0)).item<double>();
}

// Ring attention (dist.context_parallel_mode: ring) through the layers' attention on a group of one rank (the
// ring has one share; the mpirun tests below run 2 ranks): the output and the gradients of q, k and v equal the
// attention without context parallelism, causal or through a packed row's document mask, with grouped key/value
// heads, a sliding window, a scale and Gemma 2's soft cap.
TEST(ContextParallel, RingAttentionOfOneRankIsTheLayersAttention) {
  at::manual_seed(6);
  const auto one = make_communicator(ProcessInfo{}, at::kCPU, {});
  const int64_t B = 2, Hq = 4, Hkv = 2, T = 8, D = 8;
  const auto docs = at::tensor({0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}, at::kLong).view({B, T});
  for (const bool packed : {false, true})
    for (const int64_t window : {0, 3})
      for (const double softcap : {0.0, 5.0}) {
        SCOPED_TRACE(::testing::Message() << "packed " << packed << ", window " << window << ", cap " << softcap);
        models::layers::AttentionOptions o;
        o.sliding_window = window, o.softcap = softcap, o.scale = softcap > 0 ? 0.3 : 0.0;
        auto q = at::randn({B, Hq, T, D}).requires_grad_(), k = at::randn({B, Hkv, T, D}).requires_grad_();
        auto v = at::randn({B, Hkv, T, D}).requires_grad_();
        models::ForwardArgs plain, ring;
        if (packed) plain.attention_mask = models::layers::document_causal_mask(docs);
        ring.attention_mask = plain.attention_mask;
        ring.context = context_share(one, T, at::kCPU, /*ring=*/true);
        const auto want = models::layers::attention(q, k, v, plain, 0, o);
        const auto got = models::layers::attention(q, k, v, ring, 0, o);
        EXPECT_LE(relative_difference(got, want), 1e-6);
        const auto w = at::randn(want.sizes());
        const auto wg = torch::autograd::grad({(want * w).sum()}, {q, k, v});
        const auto gg = torch::autograd::grad({(got * w).sum()}, {q, k, v});
        for (size_t i = 0; i < 3; ++i) EXPECT_LE(relative_difference(gg[i], wg[i]), 1e-5) << "q, k, v"[3 * i];
      }
}

// One flavor on this rank's tensor-parallel group: logits of padded and of packed rows, and the gradients of a
// loss over them, against the whole model here. `data` picks the inputs (different per data-parallel rank). With
// `sequence`, sequence parallelism too, on rows of 7 positions (the last rank's part padded); a mixture of
// experts is refused by key then.
void expect_matches_whole(const std::string& flavor, const std::shared_ptr<Communicator>& tp, int64_t data,
                          bool sequence = false) {
  SCOPED_TRACE(flavor + (sequence ? ", sequence parallel" : ""));
  // Gemma 3's debug flavor has one key/value head (refused below): two here.
  auto whole =
      build_flavor(flavor, flavor == "gemma3_text-debug" ? std::vector<std::string>{"model.num_key_value_heads=2"}
                                                         : std::vector<std::string>{});
  auto split = models::clone_model(*whole);
  whole->train(), split->train();
  if (sequence && whole->num_experts() > 0) {
    EXPECT_NE(error_of([&] {
                apply_tensor_parallel(*split, tp, "dist.tensor_parallel", true);
              }).find("dist.sequence_parallel: sequence parallelism with a mixture-of-experts model"),
              std::string::npos);
    return;
  }
  const auto cuts = apply_tensor_parallel(*split, tp, "dist.tensor_parallel", sequence);
  ASSERT_FALSE(cuts.empty());
  ASSERT_EQ(split->sequence_parallel != nullptr, sequence);
  at::manual_seed(100 + data);
  const int64_t B = 2, T = sequence ? 7 : 8;
  const auto ids = at::randint(61, {B, T}, at::kLong);
  // Row 0 left-padded by 3; row 1 packs documents of 3 and 5 (or 4) tokens.
  models::ForwardArgs padded;
  auto mask = at::ones({B, T}, at::kBool);
  mask.index_put_({0, at::indexing::Slice(0, 3)}, false);
  padded.position_ids = (mask.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  const auto causal = at::ones({T, T}, at::kBool).tril();
  padded.attention_mask = (causal.unsqueeze(0) & mask.unsqueeze(1)).unsqueeze(1);
  models::ForwardArgs packed;
  packed.documents.doc_ids =
      at::tensor({0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}, at::kLong).view({B, 8}).narrow(1, 0, T);
  packed.position_ids =
      at::tensor({0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7}, at::kLong).view({B, 8}).narrow(1, 0, T);
  const auto weights = at::randn({B, T, 61});
  for (auto* args : {&padded, &packed}) {
    for (auto& p : whole->parameters()) p.mutable_grad() = at::Tensor();
    for (auto& p : split->parameters()) p.mutable_grad() = at::Tensor();
    const auto want = whole->forward(ids, *args);
    const auto got = split->forward(ids, *args);
    EXPECT_LE(relative_difference(got.detach(), want.detach()), 1e-5);
    (want * weights).sum().backward();
    (got * weights).sum().backward();
    auto whole_params = whole->named_parameters();
    for (const auto& p : split->named_parameters()) {
      const auto& w = whole_params[p.key()];
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      const auto cut = cuts.find(p.key());
      const auto expected =
          cut == cuts.end() ? w.grad() : share_of(w.grad(), cut->second, tp->rank(), tp->world_size());
      EXPECT_LE(relative_difference(p.value().grad(), expected), 1e-5) << p.key();
      if (cut != cuts.end() && args == &packed) {  // the whole parameter back from the shares
        at::NoGradGuard no_grad;
        EXPECT_TRUE(gather_whole(p.value().detach(), cut->second, *tp).equal(w.detach())) << p.key();
      }
    }
  }
  // Under no_grad (evaluation, generation) the same logits.
  at::NoGradGuard no_grad;
  EXPECT_LE(relative_difference(split->forward(ids, padded), whole->forward(ids, padded)), 1e-5);
}

// One flavor with a vocabulary of 62 rows split over this rank's tensor-parallel group too (the input embedding
// and an untied LM head): the logits gathered from the ranks' columns are the whole model's, the loss of the
// ranks' columns over chunks of rows is ATen's cross entropy of them, and every gradient the whole model's (a
// cut parameter's share).
void expect_vocab_parallel_matches_whole(const std::string& flavor, const std::shared_ptr<Communicator>& tp,
                                         int64_t data) {
  SCOPED_TRACE(flavor + ", vocabulary parallel");
  auto whole = build_flavor(flavor,
                            flavor == "gemma3_text-debug" ? std::vector<std::string>{"model.num_key_value_heads=2"}
                                                          : std::vector<std::string>{},
                            62);
  auto split = models::clone_model(*whole);
  whole->train(), split->train();
  const auto cuts = apply_tensor_parallel(*split, tp, "dist.tensor_parallel", false, /*vocab_parallel=*/true);
  ASSERT_TRUE(split->vocab_parallel != nullptr);
  ASSERT_TRUE(cuts.count(split->token_embedding_parameter()));
  for (const auto& head : split->lm_head_parameters()) EXPECT_TRUE(cuts.count(head)) << head;
  at::manual_seed(500 + data);
  const int64_t B = 2, T = 8, V = 62;
  const auto ids = at::randint(V, {B, T}, at::kLong);
  auto targets = at::randint(V, {B * T}, at::kLong);
  targets.index_put_({at::indexing::Slice(0, 3)}, -100);
  const auto weights = at::randn({B, T, V});
  const auto want_logits = whole->forward(ids, models::ForwardArgs{});
  const auto got_logits = split->forward(ids, models::ForwardArgs{});
  EXPECT_LE(relative_difference(got_logits.detach(), want_logits.detach()), 1e-5);
  auto want = (want_logits * weights).sum(), got = (got_logits * weights).sum();
  if (whole->final_logit_softcap() == 0) {  // soft-capped logits take the plain loss (objectives/sft.cpp)
    want = want + at::cross_entropy_loss(want_logits.reshape({-1, V}), targets, {}, at::Reduction::Sum, -100);
    const auto head = split->output_head();
    const auto hidden = split->hidden_states(ids, models::ForwardArgs{});
    const auto loss =
        split->vocab_parallel->vocab_parallel_loss_sum(hidden.reshape({B * T, -1}), head.weight, head.bias, targets,
                                                       /*chunk=*/5, -100);
    got = got + loss;
  }
  EXPECT_LE(relative_difference(got.detach(), want.detach()), 1e-5);
  want.backward();
  got.backward();
  auto whole_params = whole->named_parameters();
  for (const auto& p : split->named_parameters()) {
    const auto& w = whole_params[p.key()];
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    const auto cut = cuts.find(p.key());
    const auto expected = cut == cuts.end() ? w.grad() : share_of(w.grad(), cut->second, tp->rank(), tp->world_size());
    EXPECT_LE(relative_difference(p.value().grad(), expected), 1e-5) << p.key();
  }
  // Generation's forwards, under no_grad: the same logits.
  at::NoGradGuard no_grad;
  EXPECT_LE(relative_difference(split->forward(ids, models::ForwardArgs{}), whole->forward(ids, models::ForwardArgs{})),
            1e-5);
}

// The vocabulary-parallel cross entropy over this rank's group: ATen's cross entropy of the whole logits, per row
// and in the gradient of each rank's columns, in float32 and bfloat16, with ignored rows.
void expect_vocab_parallel_cross_entropy(const std::shared_ptr<Communicator>& tp, int64_t data) {
  at::manual_seed(40 + data);
  const int64_t N = 7, V = 10;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto whole = (at::randn({N, V}) * 4).to(dtype).requires_grad_();
    auto targets = at::randint(V, {N}, at::kLong);
    targets[2] = -100;
    const auto want = at::cross_entropy_loss(whole.to(at::kFloat), targets, {}, at::Reduction::None, -100);
    const auto w = at::randn({N});
    (want * w).sum().backward();
    const ParallelShard columns{1, {}};
    auto share = share_of(whole.detach(), columns, tp->rank(), tp->world_size()).requires_grad_();
    const auto got = vocab_parallel_cross_entropy(share, targets, tp);
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << got << want;
    (got * w).sum().backward();
    EXPECT_EQ(share.grad().scalar_type(), dtype);
    const auto expected = share_of(whole.grad(), columns, tp->rank(), tp->world_size());
    EXPECT_TRUE(at::allclose(share.grad().to(at::kFloat), expected.to(at::kFloat), 1e-5, 1e-5))
        << share.grad() << expected;
  }
}

// FSDP over the data-parallel group of a tensor-parallel model: each data-parallel rank's batch through the
// sharded shares gives the whole model's gradients summed over those batches (in every rank's master shards) and
// their norm, the cut parameters' squares counted over the tensor-parallel group and the whole ones' once.
void expect_sharded_over_the_rest(const Mesh& mesh, distributed::Sharding strategy) {
  SCOPED_TRACE(to_string(strategy));
  auto whole = build_flavor("qwen3-debug");  // per-head q/k norms: gradients summed over the group
  auto split = models::clone_model(*whole);
  const auto cuts = apply_tensor_parallel(*split, mesh.tp);
  const int64_t dp = mesh.dp->world_size(), B = 2, T = 8;
  std::vector<at::Tensor> batches;
  at::manual_seed(77);
  for (int64_t d = 0; d < dp; ++d) batches.push_back(at::randint(61, {B, T}, at::kLong));
  const auto weights = at::randn({B, T, 61});
  for (const auto& ids : batches) (whole->forward(ids) * weights).sum().backward();
  double sq = 0;
  for (const auto& p : whole->parameters()) sq += p.grad().to(at::kDouble).square().sum().item<double>();
  ShardingOptions so;
  so.strategy = strategy;
  so.tensor_parallel = mesh.tp, so.data_parallel = mesh.dp, so.tensor_parallel_cuts = cuts;
  ShardedModel sharded(split, mesh.world, so);
  EXPECT_EQ(sharded.shard_comm().world_size(), dp);
  sharded.begin_step();
  sharded.set_grad_sync(true);
  (split->forward(batches[static_cast<size_t>(mesh.at.dp)]) * weights).sum().backward();
  sharded.finish_backward();
  const double norm = sharded.clip_grad_norm_on_device(0).item<double>();
  EXPECT_NEAR(norm, std::sqrt(sq), 1e-5 * std::sqrt(sq));
  auto want = whole->named_parameters();
  for (size_t u = 0; u < sharded.layouts().size(); ++u) {
    const auto grads = sharded.gather_master(u, sharded.master_parameters()[u].grad());
    for (const auto& p : sharded.layouts()[u].params) {
      const auto got = grads.narrow(0, p.offset, p.numel).view(p.shape);
      const auto cut = cuts.find(p.name);
      const auto& g = want[p.name].grad();
      const auto expected = cut == cuts.end() ? g : share_of(g, cut->second, mesh.tp->rank(), mesh.tp->world_size());
      EXPECT_LE(relative_difference(got, expected), 1e-5) << p.name;
    }
  }
}

// One flavor under context parallelism on this rank's group of `mesh` (tensor-parallel too when its tp group has
// several ranks): each rank runs its head and tail chunks of padded rows (their mask) and of packed rows (the
// documents' mask), attention gathering the group's keys and values; its logits are the whole model's at those
// positions and the gradients summed over the group the whole model's (a rank's share under tensor parallelism).
// With `sequence`, the tensor-parallel group splits each share's positions too (sequence parallelism).
void expect_context_parallel_matches_whole(const std::string& flavor, const Mesh& mesh, bool sequence = false,
                                           bool ring = false) {
  SCOPED_TRACE(flavor + ", context parallel" + (sequence ? ", sequence parallel" : "") + (ring ? ", ring" : ""));
  auto whole =
      build_flavor(flavor, flavor == "gemma3_text-debug" ? std::vector<std::string>{"model.num_key_value_heads=2"}
                                                         : std::vector<std::string>{});
  if (sequence && whole->num_experts() > 0) return;  // refused (expect_matches_whole)
  auto split = models::clone_model(*whole);
  whole->train(), split->train();
  std::map<std::string, ParallelShard> cuts;
  if (mesh.tp->world_size() > 1) cuts = apply_tensor_parallel(*split, mesh.tp, "dist.tensor_parallel", sequence);
  at::manual_seed(300 + mesh.at.dp);
  const int64_t B = 2, T = 8, cp = mesh.cp->world_size();
  const auto ids = at::randint(61, {B, T}, at::kLong);
  // Row 0 left-padded by 3; row 1 packs documents of 3 and 5 tokens (a window of 4 binds across chunks).
  models::ForwardArgs padded;
  auto mask = at::ones({B, T}, at::kBool);
  mask.index_put_({0, at::indexing::Slice(0, 3)}, false);
  padded.position_ids = (mask.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  padded.attention_mask = (at::ones({T, T}, at::kBool).tril().unsqueeze(0) & mask.unsqueeze(1)).unsqueeze(1);
  models::ForwardArgs packed;
  const auto docs = at::tensor({0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}, at::kLong).view({B, T});
  packed.position_ids = at::tensor({0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7}, at::kLong).view({B, T});
  packed.attention_mask = models::layers::document_causal_mask(docs);
  const auto slots = context_parallel_positions(T, mesh.cp->rank(), cp);
  const auto weights = at::randn({B, T, 61});
  for (auto* args : {&padded, &packed}) {
    for (auto& p : whole->parameters()) p.mutable_grad() = at::Tensor();
    for (auto& p : split->parameters()) p.mutable_grad() = at::Tensor();
    models::ForwardArgs mine;
    mine.context = context_share(mesh.cp, T, at::kCPU, ring);
    mine.position_ids = args->position_ids.index_select(1, slots);
    mine.attention_mask = args->attention_mask.index_select(2, slots);
    const auto want = whole->forward(ids, *args);
    const auto got = split->forward(ids.index_select(1, slots), mine);
    EXPECT_LE(relative_difference(got.detach(), want.detach().index_select(1, slots)), 1e-5);
    (want * weights).sum().backward();
    (got * weights.index_select(1, slots)).sum().backward();
    auto whole_params = whole->named_parameters();
    for (const auto& p : split->named_parameters()) {
      const auto& w = whole_params[p.key()];
      // A mixture's expert that no token of a rank's share chose has no gradient there (every rank still joins
      // the sum): zero.
      const auto grad_of = [](const at::Tensor& t) { return t.grad().defined() ? t.grad() : at::zeros_like(t); };
      auto sum = grad_of(p.value()).contiguous().clone();
      mesh.cp->all_reduce_sum(sum, "test: gradients over the context-parallel group");
      const auto cut = cuts.find(p.key());
      const auto expected =
          cut == cuts.end() ? grad_of(w) : share_of(grad_of(w), cut->second, mesh.tp->rank(), mesh.tp->world_size());
      EXPECT_LE(relative_difference(sum, expected), 1e-5) << p.key();
    }
  }
}

void run_rank() {
  at::set_num_threads(1);
  auto world = make_communicator(discover_from_environment(), at::kCPU, {});
  const auto n = world->world_size();
  // A ring: every rank sends its rank to the next and receives the previous one's.
  const int me = world->rank();
  auto received = at::zeros({3}, at::kLong);
  world->send_recv(at::full({3}, me, at::kLong), (me + 1) % n, received, (me + n - 1) % n, "ring test");
  EXPECT_TRUE(received.eq((me + n - 1) % n).all().item<bool>());
  const Mesh mesh(world, {2, 1});
  ASSERT_EQ(mesh.tp->world_size(), 2);
  ASSERT_EQ(mesh.dp->world_size(), n / 2);
  expect_vocab_parallel_cross_entropy(mesh.tp, mesh.at.dp);
  for (const auto strategy : {Sharding::FullShard, Sharding::NoShard}) expect_sharded_over_the_rest(mesh, strategy);
  for (const auto& flavor : anvil::testing::debug_flavors()) {
    expect_matches_whole(flavor, mesh.tp, mesh.at.dp);
    expect_matches_whole(flavor, mesh.tp, mesh.at.dp, /*sequence=*/true);
    expect_vocab_parallel_matches_whole(flavor, mesh.tp, mesh.at.dp);
  }
  // Context parallelism: cp 2 on 2 ranks, tp 2 x cp 2 on 4 (with and without sequence parallelism), keys and
  // values all-gathered or passed around the ring; cp 4 on 4 ranks in ring mode (three passes each way).
  const Mesh context(world, {n == 2 ? 1 : 2, 2});
  ASSERT_EQ(context.cp->world_size(), 2);
  for (const auto& flavor : anvil::testing::debug_flavors()) {
    for (const bool ring : {false, true}) expect_context_parallel_matches_whole(flavor, context, false, ring);
    if (n == 4) expect_context_parallel_matches_whole(flavor, context, /*sequence=*/true, /*ring=*/true);
  }
  if (n == 4) {
    const Mesh ring4(world, {1, 4});
    for (const auto& flavor : anvil::testing::debug_flavors())
      expect_context_parallel_matches_whole(flavor, ring4, false, /*ring=*/true);
  }
  if (n == 2) {
    // Refused by key: LoRA adapters, dropout.
    auto lora = build_flavor("llama-debug");
    models::add_lora(*lora, {4, 8, 0, {"q_proj"}, ""});
    EXPECT_EQ(error_of([&] { apply_tensor_parallel(*lora, mesh.tp); }),
              "dist.tensor_parallel: tensor parallelism with LoRA adapters is not supported yet");
    auto mqa = build_flavor("gemma3_text-debug");
    EXPECT_EQ(error_of([&] { apply_tensor_parallel(*mqa, mesh.tp); }),
              "dist.tensor_parallel: 2 ranks do not divide the 1 key/value heads of model.layers.0.self_attn.k_proj; "
              "choose a tensor-parallel size that divides them");
    EXPECT_EQ(error_of([&] { apply_tensor_parallel(*build_flavor("llama-debug"), mesh.tp, "", false, true); }),
              "dist.vocab_parallel: 2 ranks do not divide the vocabulary of 61 tokens; choose a tensor-parallel size "
              "that divides it or set dist.vocab_parallel: false");
    auto dropout = build_flavor("gpt2-debug", {"model.dropout=0.1"});
    EXPECT_NE(error_of([&] { apply_tensor_parallel(*dropout, mesh.tp); })
                  .find("dist.tensor_parallel: tensor parallelism with dropout (the model's attn_pdrop is 0.1) is not "
                        "supported yet"),
              std::string::npos);
  } else {
    // Four ranks of one tensor-parallel group: LLaMA's 2 key/value heads do not split.
    const Mesh four(world, {4, 1});
    auto llama = build_flavor("llama-debug");
    EXPECT_EQ(error_of([&] { apply_tensor_parallel(*llama, four.tp); }),
              "dist.tensor_parallel: 4 ranks do not divide the 2 key/value heads of model.layers.0.self_attn.k_proj; "
              "choose a tensor-parallel size that divides them");
  }
  world->barrier("end of the tensor-parallel test");
}

TEST(TensorParallelRanks, EveryFamilyGivesTheWholeModelsLogitsAndGradientsOnTwoAndTwoByTwoRanks) {
  if (std::getenv("ANVIL_TP_TEST")) return run_rank();
  const auto self = stdfs::read_symlink("/proc/self/exe").string();
  for (const int ranks : {2, 4}) {
    std::string log;
    const int rc = anvil::testing::run(
        "ANVIL_TP_TEST=1 " + anvil::testing::mpirun(ranks) + "-x ANVIL_TP_TEST " + self +
            " --gtest_filter=" + ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + " 2>&1",
        &log);
    EXPECT_EQ(rc, 0) << ranks << " ranks:\n" << log;
  }
}

// The trainer under dist.tensor_parallel (GPT-2, 4 blocks, 20 steps; dist_runs.h): tp 2 on 2 ranks and tp 2 x
// full_shard 2 on 4 train as one process does (loss, gradient norm, eval loss within 1e-5; the HF folder the same
// model); its checkpoints hold the whole model's units, so a resume on the same mesh repeats the run bit for bit
// and one on another mesh (one process, tp 2 alone) continues it within 1e-5; a plain checkpoint continues under
// tp 2; anvil export reads its checkpoints; activation checkpointing changes nothing. Launches the mesh cannot
// take are refused by key.
TEST(TensorParallelRuns, TrainLikeOneProcessAndResumeOnAnyMesh) {
  anvil::testing::TempDir dir;
  const auto cfg = dir / "run.yaml";
  anvil::testing::write_text(cfg, kRun);
  const auto plain_dir = dir / "plain", mesh_dir = dir / "tp2-fsdp2";
  train(cfg, plain_dir, 0);
  const auto plain = read_metrics(plain_dir / "metrics.jsonl");
  std::string log;
  train(cfg, dir / "tp2", 2, "dist.tensor_parallel=2", &log);
  EXPECT_NE(log.find("no_shard, tensor parallel 2 x data parallel 1"), std::string::npos) << log;
  expect_close_losses(plain, read_metrics(dir / "tp2" / "metrics.jsonl"), 1, 20, 1e-5, "tp 2");
  const std::string mesh = "dist.tensor_parallel=2 dist.sharding=full_shard";
  train(cfg, mesh_dir, 4, mesh, &log);
  EXPECT_NE(log.find("full_shard, tensor parallel 2 x data parallel 2"), std::string::npos) << log;
  const auto straight = read_metrics(mesh_dir / "metrics.jsonl");
  ASSERT_EQ(straight.size(), 20u);
  expect_close_losses(plain, straight, 1, 20, 1e-5, "tp 2 x full_shard 2");
  // trainer --plan-memory's state figures for that mesh are what its ranks hold (a rank's tensor-parallel share,
  // sharded over the 2 ranks that hold it).
  {
    std::string plan;
    ASSERT_EQ(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                                      " --config " + cfg.string() + " output_dir=" + (dir / "unused").string() + " " +
                                      mesh + " --plan-memory --world-size 4",
                                  &plan),
              0)
        << plan;
    expect_plan_holds(plan, straight.at(20), "tp 2 x full_shard 2");
  }
  // The HF folder is the whole model; the shards are every rank's, of whole units.
  EXPECT_LE(max_param_diff(plain_dir / "checkpoint-20" / "model.safetensors", mesh_dir / "checkpoint-20"), 1e-5);
  // anvil export reads its shards into the same whole model.
  std::string exported;
  EXPECT_EQ(anvil::testing::run(anvil::testing::cli_bin() + " export --checkpoint " +
                                    (mesh_dir / "checkpoint-20").string() + " --output " + (dir / "export").string(),
                                &exported),
            0)
      << exported;
  EXPECT_LE(max_param_diff(plain_dir / "checkpoint-20" / "model.safetensors", dir / "export"), 1e-5);
  // Activation checkpointing replays the groups' all-reduces in the backward: the same run.
  train(cfg, dir / "tp2-ac", 2, "dist.tensor_parallel=2 train.activation_checkpointing=true");
  expect_close_losses(read_metrics(dir / "tp2" / "metrics.jsonl"), read_metrics(dir / "tp2-ac" / "metrics.jsonl"), 1,
                      20, 1e-6, "tp 2 with activation checkpointing");
  // anvil generate on 2 ranks of a tensor-parallel launch: one process's tokens, greedy and sampled; rank 0 writes.
  {
    const auto ids = dir / "ids.json";
    anvil::testing::write_text(ids, "[[5, 17, 42], [7, 8, 9, 10, 11]]");
    const auto generate = [&](int ranks, const std::string& out, const std::string& extra) {
      std::string o;
      const auto cmd = (ranks ? mpirun(ranks) : std::string()) + anvil::testing::cli_bin() + " generate --model " +
                       (plain_dir / "checkpoint-20").string() + " --input " + ids.string() + " --output " +
                       (dir / out).string() + " --max-new-tokens 8 --eos-id -1 " + extra + " 2>&1";
      EXPECT_EQ(anvil::testing::run(cmd, &o), 0) << cmd << "\n" << o;
      return o;
    };
    for (const std::string sampling : {"", "--temperature 1.0 --seed 3"}) {
      generate(0, "one.json", sampling);
      generate(2, "tp2.json", "--tensor-parallel 2 " + sampling);
      const auto one = anvil::testing::read_text(dir / "one.json");
      EXPECT_EQ(anvil::testing::read_text(dir / "tp2.json"), one) << sampling;
      EXPECT_EQ(nlohmann::json::parse(one)[1].size(), 8u) << one;
    }
    std::string o;
    EXPECT_NE(anvil::testing::run(anvil::testing::cli_bin() + " generate --model " +
                                      (plain_dir / "checkpoint-20").string() + " --input " + ids.string() +
                                      " --output " + (dir / "x.json").string() + " --tensor-parallel 2 2>&1",
                                  &o),
              0);
    EXPECT_NE(o.find("--tensor-parallel: 2 splits each block across that many ranks, and this launch has 1"),
              std::string::npos)
        << o;
  }
  // Sequence parallelism (with activation checkpointing: its recomputation runs split too): one process's run.
  train(cfg, dir / "tp2-sp", 2,
        "dist.tensor_parallel=2 dist.sequence_parallel=true train.activation_checkpointing=true", &log);
  EXPECT_NE(log.find("tensor parallel 2 (sequence parallel) x data parallel 1"), std::string::npos) << log;
  expect_close_losses(plain, read_metrics(dir / "tp2-sp" / "metrics.jsonl"), 1, 20, 1e-5,
                      "tp 2, sequence parallel, activation checkpointing");
  // Vocabulary parallelism (the tied embedding's 326 rows cut in two; the loss on each rank's logit columns), with
  // sequence parallelism: one process's run; its checkpoint is the whole model's (continued by one process below).
  train(cfg, dir / "tp2-vp", 2, "dist.tensor_parallel=2 dist.vocab_parallel=true dist.sequence_parallel=true", &log);
  EXPECT_NE(log.find("tensor parallel 2 (sequence parallel) (vocabulary parallel) x data parallel 1"),
            std::string::npos)
      << log;
  expect_close_losses(plain, read_metrics(dir / "tp2-vp" / "metrics.jsonl"), 1, 20, 1e-5,
                      "tp 2, vocabulary and sequence parallel");
  // A rank holds half the embedding's 326 x 32 float32 rows less.
  const double vp_saves = read_metrics(dir / "tp2" / "metrics.jsonl").at(1)["memory/parameter_bytes"].get<double>() -
                          read_metrics(dir / "tp2-vp" / "metrics.jsonl").at(1)["memory/parameter_bytes"].get<double>();
  EXPECT_EQ(vp_saves, 163 * 32 * 4);
  const auto meta = nlohmann::json::parse(anvil::testing::read_text(mesh_dir / "checkpoint-20" / "sharding.json"));
  EXPECT_EQ(meta["tensor_parallel"], 2);
  EXPECT_EQ(meta["shards"].size(), 4u);
  const auto resume = [&](const stdfs::path& from, const std::string& name, int ranks, const std::string& extra) {
    const auto out = dir / name;
    stdfs::create_directories(out);
    stdfs::copy(from / "checkpoint-10", out / "checkpoint-10", stdfs::copy_options::recursive);
    train(cfg, out, ranks, extra);
    return read_metrics(out / "metrics.jsonl");
  };
  const auto again = resume(mesh_dir, "same-mesh", 4, mesh);
  ASSERT_EQ(again.size(), 10u);
  for (int64_t s = 11; s <= 20; ++s) {
    EXPECT_EQ(again.at(s)["loss"].get<double>(), straight.at(s)["loss"].get<double>()) << "step " << s;
    EXPECT_EQ(again.at(s)["grad_norm"].get<double>(), straight.at(s)["grad_norm"].get<double>()) << "step " << s;
  }
  EXPECT_EQ(again.at(20)["eval/loss"].get<double>(), straight.at(20)["eval/loss"].get<double>());
  expect_close_losses(straight, resume(mesh_dir, "to-plain", 0, ""), 11, 20, 1e-5, "tp 2 x full_shard 2 -> plain");
  expect_close_losses(straight, resume(mesh_dir, "to-tp2", 2, "dist.tensor_parallel=2"), 11, 20, 1e-5,
                      "tp 2 x full_shard 2 -> tp 2");
  // Hybrid sharding with tensor parallelism: each tensor-parallel share's 2 ranks form 2 replica groups (of one
  // rank: the test's world is 4), their gradients all-reduced across them; it continues the run within 1e-5.
  {
    const auto out = dir / "to-hsdp";
    stdfs::create_directories(out);
    stdfs::copy(mesh_dir / "checkpoint-10", out / "checkpoint-10", stdfs::copy_options::recursive);
    train(cfg, out, 4, mesh + " dist.replicate=2", &log);
    EXPECT_NE(log.find("full_shard, hybrid: 2 replicas of 1 ranks, tensor parallel 2 x data parallel 2"),
              std::string::npos)
        << log;
    expect_close_losses(straight, read_metrics(out / "metrics.jsonl"), 11, 20, 1e-5,
                        "tp 2 x full_shard 2 -> tp 2 x 2 replicas");
  }
  expect_close_losses(plain, resume(plain_dir, "plain-to-tp2", 2, "dist.tensor_parallel=2"), 11, 20, 1e-5,
                      "plain -> tp 2");
  expect_close_losses(plain, resume(dir / "tp2-vp", "vp-to-plain", 0, ""), 11, 20, 1e-5,
                      "tp 2, vocabulary parallel -> plain");
  // LLaMA's layout with Qwen3's per-head q/k norms, grouped-query heads and packed rows, tp 2 x full_shard 2.
  {
    std::string qwen3 = kRun;
    const auto at = qwen3.find("model: {");
    qwen3.replace(at, qwen3.find('\n', at) - at,
                  "model: {family: qwen3, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 2, "
                  "num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8, intermediate_size: 64}");
    const auto qcfg = dir / "qwen3.yaml";
    anvil::testing::write_text(qcfg, qwen3);
    const std::string packed = "data.packing=true train.max_steps=8 train.save_every=8 train.eval_every=8";
    train(qcfg, dir / "qwen3-plain", 0, packed);
    train(qcfg, dir / "qwen3-mesh", 4, packed + " " + mesh);
    expect_close_losses(read_metrics(dir / "qwen3-plain" / "metrics.jsonl"),
                        read_metrics(dir / "qwen3-mesh" / "metrics.jsonl"), 1, 8, 1e-5,
                        "qwen3, packed rows, tp 2 x full_shard 2");
    train(qcfg, dir / "qwen3-mesh-sp", 4, packed + " " + mesh + " dist.sequence_parallel=true");
    expect_close_losses(read_metrics(dir / "qwen3-plain" / "metrics.jsonl"),
                        read_metrics(dir / "qwen3-mesh-sp" / "metrics.jsonl"), 1, 8, 1e-5,
                        "qwen3, packed rows, tp 2 x full_shard 2, sequence parallel");
  }
  // Memory per rank, measured: with blocks that dominate the model (hidden 256: the cut layers hold 97% of the
  // parameters), tp 2 holds
  // about half of what 2 data-parallel ranks hold each (parameters, and the steps' CPU tensor peak).
  const std::string wide = "model.hidden_size=256 train.max_steps=4 train.save_every=0 eval.generate_samples=0";
  train(cfg, dir / "wide-dp2", 2, wide + " dist.sharding=no_shard");
  train(cfg, dir / "wide-tp2", 2, wide + " dist.tensor_parallel=2");
  const auto dp2 = read_metrics(dir / "wide-dp2" / "metrics.jsonl").at(4),
             tp2 = read_metrics(dir / "wide-tp2" / "metrics.jsonl").at(4);
  const double params = tp2["memory/parameter_bytes"].get<double>() / dp2["memory/parameter_bytes"].get<double>(),
               peak = tp2["memory/cpu_peak_bytes"].get<double>() / dp2["memory/cpu_peak_bytes"].get<double>();
  std::cout << "[dist] tp 2 / dp 2 per rank: parameter bytes " << params << ", step tensor peak " << peak << "\n";
  EXPECT_LT(params, 0.55);
  EXPECT_LT(peak, 0.6);
  // Loading under tp 2 x full_shard 2 never builds the whole model: the cut layers' parameters are drawn one at a
  // time as they are cut, the rest as each rank's ranges. Every rank's CPU tensor peak while loading, against a
  // rank that builds the whole model (no_shard).
  train(cfg, dir / "wide-mesh", 4, wide + " " + mesh + " train.micro_batch_size=1");
  const auto load_peak = [&](const char* run, int rank) {
    const auto j = nlohmann::json::parse(
        anvil::testing::read_text(dir / run / "host_memory" / ("rank-" + std::to_string(rank) + ".json")));
    return j["phases"]["load"]["tensor_peak_bytes"].get<double>();
  };
  double most = 0;
  for (int r = 0; r < 4; ++r) most = std::max(most, load_peak("wide-mesh", r));
  const double load = most / load_peak("wide-dp2", 0);
  std::cout << "[dist] tp 2 x full_shard 2 / no_shard, loading per rank: tensor peak " << load << " (" << most / 1e6
            << " MB / " << load_peak("wide-dp2", 0) / 1e6 << " MB)\n";
  EXPECT_LT(load, 0.4);
  // Sequence parallelism: the activations a step holds (its tensor peak above the state it keeps) shrink further,
  // the norms' inputs, the residuals and the column-parallel layers' saved inputs split over the group's positions
  // (measured 0.84: what stays whole is what tensor parallelism splits already, heads and MLP features).
  const std::string rows = wide +
                           " dist.tensor_parallel=2 data.packing=true data.max_length=128 "
                           "model.max_position_embeddings=128 train.micro_batch_size=8 train.global_batch_size=8";
  train(cfg, dir / "rows-tp2", 2, rows);
  train(cfg, dir / "rows-tp2-sp", 2, rows + " dist.sequence_parallel=true");
  const auto activations = [&](const char* run) {
    const auto m = read_metrics(dir / run / "metrics.jsonl").at(4);
    return m["memory/cpu_peak_bytes"].get<double>() - m["memory/cpu_allocated_bytes"].get<double>();
  };
  const double sp = activations("rows-tp2-sp") / activations("rows-tp2");
  std::cout << "[dist] tp 2 sequence parallel / tp 2, a step's activations per rank: " << sp << " ("
            << activations("rows-tp2-sp") / 1e6 << " MB / " << activations("rows-tp2") / 1e6 << " MB)\n";
  EXPECT_LT(sp, 0.9);
  // Refused by key.
  const auto refused = [&](int ranks, const std::string& extra) {
    return refused_run(cfg, dir / "refused", ranks, extra);
  };
  EXPECT_NE(refused(0, "dist.tensor_parallel=2")
                .find("dist.tensor_parallel: 2 splits each block across that many "
                      "ranks, and this run has 1"),
            std::string::npos);
  EXPECT_NE(refused(0, "dist.vocab_parallel=true")
                .find("dist.vocab_parallel: splits the vocabulary across a tensor-parallel group; set "
                      "dist.tensor_parallel to 2 or more (it is 1)"),
            std::string::npos);
  EXPECT_NE(refused(0, "dist.sequence_parallel=true")
                .find("dist.sequence_parallel: splits the positions across a tensor-parallel group; set "
                      "dist.tensor_parallel to 2 or more (it is 1)"),
            std::string::npos);
  EXPECT_NE(refused(3, "dist.tensor_parallel=2")
                .find("dist.tensor_parallel (2) x dist.context_parallel (1) must divide the world size, 3 ranks"),
            std::string::npos);
}

// The other objectives under dist.tensor_parallel (GPT-2, 2 blocks, 6 steps): the reward model's
// score head and DPO's and KTO's frozen references (cut across the group as the policy is, then sharded over the
// data-parallel ranks) log every statistic one process logs within 1e-5. DPO's precomputed reference splits its
// batches over the data-parallel ranks (a tensor-parallel group runs them together): its cache is one process's
// within 1e-5. GRPO (4 steps) samples the tokens one process samples, and on-policy distillation (the teacher
// sampling too) trains as one process does. What is not there yet is refused by key.
TEST(TensorParallelRuns, EveryOtherObjectiveTrainsLikeOneProcess) {
  anvil::testing::TempDir dir;
  // A run's config: the model, tokenizer, data/<data>_train.jsonl and _eval.jsonl (and `data_keys`), the
  // optimizer, then `rest`.
  const auto write_config = [&](const std::string& algorithm, const std::string& data, const std::string& data_keys,
                                const std::string& rest) {
    const auto path = dir / (algorithm + ".yaml");
    anvil::testing::write_text(path, "algorithm: " + algorithm + R"(
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/)" + data + "_train.jsonl}], eval: [{path: data/" +
                                         data + "_eval.jsonl}]" + data_keys + R"(}
optimizer: {lr: 3.0e-3}
)" + rest);
    return path;
  };
  const auto config = [&](const std::string& algorithm, const std::string& data) {
    return write_config(
        algorithm, data, "",
        R"(train: {max_steps: 6, micro_batch_size: 2, global_batch_size: 8, eval_every: 3, save_every: 0, log_every: 1000, threads: 1}
eval: {batch_size: 8, max_batches: 2, generate_samples: 0}
)");
  };
  // Every numeric statistic of every step (not the speed, time and memory ones), within 1e-5 of max(|value|, 1)
  // (GRPO's importance weights within 1e-4).
  const auto expect_compared = [](const stdfs::path& a_dir, const stdfs::path& b_dir, size_t steps,
                                  const std::string& what) {
    const auto a = read_metrics(a_dir / "metrics.jsonl"), b = read_metrics(b_dir / "metrics.jsonl");
    ASSERT_EQ(a.size(), steps) << what;
    ASSERT_EQ(b.size(), steps) << what;
    double worst = 0, share = 0;
    std::string closest;
    int compared = 0;
    for (const auto& [step, m] : a)
      for (const auto& [key, v] : m.items()) {
        if (!v.is_number() || key == "tokens_per_s" || key.rfind("memory/", 0) == 0 || key.rfind("time/", 0) == 0 ||
            key.find("per_s") != std::string::npos)
          continue;
        ASSERT_TRUE(b.at(step).contains(key)) << what << ": step " << step << " lacks " << key;
        const double x = v.get<double>(), y = b.at(step)[key].get<double>();
        // KL terms and margins are differences of log-probs near 0; an importance weight is the exp of one, so
        // the log-probs' round-off (1e-6 of |log p|, up to ~7 here) moves it by up to 1e-5 of itself.
        const bool weight = key.find("is_weight") != std::string::npos;
        const double bound = (weight ? 1e-4 : 1e-5) * std::max(1.0, std::abs(x));
        EXPECT_LE(std::abs(x - y), bound) << what << ", step " << step << ", " << key;
        if (x != 0) worst = std::max(worst, std::abs(x - y) / std::abs(x));
        if (std::abs(x - y) / bound > share) share = std::abs(x - y) / bound, closest = concat("step ", step, " ", key);
        ++compared;
      }
    EXPECT_GT(compared, static_cast<int>(steps) * 5) << what;
    std::cout << "[dist] " << what << ": " << compared << " values, largest relative difference " << worst
              << ", the closest at " << share << " of its bound (" << closest << ")\n";
  };
  const auto expect_same = [&](const stdfs::path& a_dir, const stdfs::path& b_dir, const std::string& what) {
    expect_compared(a_dir, b_dir, 6, what);
  };
  const std::string tp2 = "dist.tensor_parallel=2", mesh = "dist.tensor_parallel=2 dist.sharding=full_shard";
  std::string log;
  // The reward model: its score head stays whole on every rank of the group.
  const auto reward = config("reward", "pref");
  train(reward, dir / "reward-1", 0, "train.save_every=6");
  train(reward, dir / "reward-tp2", 2, tp2, &log);
  EXPECT_NE(log.find("tensor parallel 2 x data parallel 1"), std::string::npos) << log;
  expect_same(dir / "reward-1", dir / "reward-tp2", "reward, tp 2");
  // DPO: the reference is cut and sharded like the policy.
  const auto dpo = config("dpo", "pref");
  train(dpo, dir / "dpo-1", 0, "train.save_every=6");
  train(dpo, dir / "dpo-mesh", 4, mesh, &log);
  EXPECT_NE(log.find("parameter bytes on this rank: tensor parallel 2 x full_shard over 2 ranks"), std::string::npos)
      << log;
  expect_same(dir / "dpo-1", dir / "dpo-mesh", "dpo, tp 2 x full_shard 2");
  // Its precomputed reference: the batches split over the 2 data-parallel ranks.
  train(dpo, dir / "dpo-cached-1", 0, "dpo.precompute_reference=true");
  train(dpo, dir / "dpo-cached-mesh", 4, mesh + " dpo.precompute_reference=true", &log);
  EXPECT_NE(log.find("(split over 2 ranks)"), std::string::npos) << log;
  const auto want = io::load_safetensors(dir / "dpo-cached-1" / "reference_logps.safetensors"),
             got = io::load_safetensors(dir / "dpo-cached-mesh" / "reference_logps.safetensors");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_LE((got.at(name) - t).abs().max().item<double>(), 1e-5 * t.abs().max().item<double>()) << name;
  }
  expect_same(dir / "dpo-cached-1", dir / "dpo-cached-mesh", "dpo with a precomputed reference, tp 2 x full_shard 2");
  // KTO: unpaired completions, its KL rows and reference under tp 2.
  const auto kto = config("kto", "dpo");
  train(kto, dir / "kto-1", 0);
  train(kto, dir / "kto-tp2", 2, tp2);
  expect_same(dir / "kto-1", dir / "kto-tp2", "kto, tp 2");
  // GRPO, scored by the reward model above (cut across the group too): under tp 2 x full_shard 2 the ranks
  // sample the tokens one process samples, with the same seeds, and log its values within 1e-5. With
  // ppo.async.emulate the batch sampled for the next step is in each checkpoint: the same prompts and responses,
  // scores and behaviour log-probs within 1e-5.
  const auto grpo = write_config(
      "ppo", "sft", ", max_length: 24",
      R"(train: {max_steps: 4, micro_batch_size: 4, global_batch_size: 8, save_every: 2, eval_every: 4, log_every: 1000, threads: 1, seed: 7}
ppo: {advantage: grpo, prompts_per_rollout: 4, samples_per_prompt: 4, ppo_epochs: 1, max_new_tokens: 6, kl_coef: 0.04,
      reward: {model: )" +
          (dir / "reward-1" / "checkpoint-6").string() + R"(}, async: {emulate: true}}
eval: {batch_size: 8, generate_samples: 4, max_new_tokens: 6, table_rows: 0}
)");
  train(grpo, dir / "grpo-1", 0);
  train(grpo, dir / "grpo-mesh", 4, mesh, &log);
  expect_compared(dir / "grpo-1", dir / "grpo-mesh", 4, "grpo, tp 2 x full_shard 2");
  for (const int step : {2, 4}) {
    const auto in_flight = [&](const stdfs::path& run) {
      return nlohmann::json::parse(anvil::testing::read_text(run / ("checkpoint-" + std::to_string(step)) /
                                                             "trainer_state.json"))["objective"]["in_flight"]["rows"];
    };
    const auto x = in_flight(dir / "grpo-1"), y = in_flight(dir / "grpo-mesh");
    ASSERT_EQ(x.size(), 16u) << "step " << step;
    ASSERT_EQ(y.size(), x.size()) << "step " << step;
    double worst = 0;
    std::set<double> scores;  // the reward model tells the samples apart, so the groups' advantages are not 0
    size_t tokens = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      scores.insert(x[i]["score"].get<double>());
      tokens += x[i]["response"].size();
      EXPECT_EQ(x[i]["prompt"], y[i]["prompt"]) << "step " << step << ", row " << i;
      EXPECT_EQ(x[i]["response"], y[i]["response"]) << "step " << step << ", row " << i;
      const double a = x[i]["score"].get<double>(), b = y[i]["score"].get<double>();
      EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(a) + 1e-6) << "step " << step << ", row " << i;
      const auto p = x[i]["old_logp"].get<std::vector<double>>(), q = y[i]["old_logp"].get<std::vector<double>>();
      ASSERT_EQ(p.size(), q.size());
      for (size_t j = 0; j < p.size(); ++j)
        worst = std::max(worst, std::abs(p[j] - q[j]) / std::max(1.0, std::abs(p[j])));
    }
    EXPECT_LE(worst, 1e-5) << "behaviour log-probs, checkpoint-" << step;
    EXPECT_GT(scores.size(), 4u) << "step " << step;
    EXPECT_GT(tokens, 16u * 3) << "step " << step;
  }
  // On-policy distillation from the DPO run's policy, with the teacher sampling the off-policy steps' responses
  // (seq_kd): both models cut across the group, generating on it.
  const auto distill = write_config(
      "distill", "sft", ", max_length: 24",
      R"(train: {max_steps: 6, micro_batch_size: 2, global_batch_size: 8, save_every: 0, eval_every: 3, log_every: 1000, threads: 1}
distill: {teacher: )" +
          (dir / "dpo-1" / "checkpoint-6").string() + R"(, lmbda: 0.5, beta: 0.3, seq_kd: true, max_new_tokens: 6}
eval: {batch_size: 8, generate_samples: 4, max_new_tokens: 6, table_rows: 0}
)");
  train(distill, dir / "distill-1", 0);
  train(distill, dir / "distill-tp2", 2, tp2);
  expect_same(dir / "distill-1", dir / "distill-tp2", "distill, tp 2");
  // What is not there yet is refused by key.
  const auto refused = [&](const stdfs::path& cfg, const std::string& extra) {
    std::string out;
    EXPECT_NE(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                                      " --config " + cfg.string() + " output_dir=" + (dir / "refused").string() + " " +
                                      tp2 + " " + extra + " 2>&1",
                                  &out),
              0);
    return out;
  };
  EXPECT_NE(refused(dpo, "algorithm=ilql").find("dist.tensor_parallel: not read by algorithm ilql (read by "),
            std::string::npos);
  EXPECT_NE(refused(dpo, "dist.vocab_parallel=true").find("dist.vocab_parallel: not read by algorithm dpo (read by "),
            std::string::npos);
  EXPECT_NE(refused(grpo, "ppo.async.rollout_ranks=1")
                .find("ppo.async.rollout_ranks: sampling on rollout ranks of their own is not supported under tensor "
                      "parallelism (dist.tensor_parallel: 2) yet"),
            std::string::npos);
}

}  // namespace
}  // namespace anvil::distributed
