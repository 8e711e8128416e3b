#pragma once
// Skipping the families' random initialisation for a model whose weights are
// about to be loaded, as transformers' from_pretrained does (no_init_weights):
// drawing a normal for every parameter of a 7 B model costs more than the
// allocation it overwrites. LibTorch's own modules (Linear, Embedding) still
// initialise in their constructors, but a parameter a family allocates itself
// (GPT-2's Conv1D weight) is left as allocated, so whoever skips must fill
// every parameter: checkpoint::load_model_dir does, and load_weights fails on
// a missing one.

namespace anvil::models {

/// While one is alive on this thread, a family's constructor leaves out its
/// reset_parameters() (the normal(0, initializer_range) draws, the ones and
/// zeros of norms and biases). Nests; restores the previous state.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool previous_;
};

/// True inside a SkipInitGuard on this thread.
bool init_skipped();

}  // namespace anvil::models
