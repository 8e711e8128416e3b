#include "train/objectives/forward_split.h"

#include <ATen/ATen.h>

namespace anvil::train {

ForwardSplit::ForwardSplit(std::shared_ptr<distributed::Communicator> comm, int64_t batches, at::Device device)
    : comm_(std::move(comm)), batches_(batches), device_(device) {
  if (comm_) rank_ = comm_->rank(), world_ = comm_->world_size();
  split_ = world_ > 1 && batches_ >= world_;
}

void ForwardSplit::combine(const std::vector<at::Tensor>& tensors, const std::string& what) const {
  if (!split_ || tensors.empty()) return;
  // One collective for all of them, on the run's device (NCCL reduces device memory).
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.reshape(-1));
  auto all = at::cat(flat).to(device_);
  comm_->all_reduce_sum(all, what);
  const auto host = all.cpu();
  int64_t at = 0;
  for (const auto& t : tensors) {
    t.copy_(host.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

}  // namespace anvil::train
