#pragma once
// Memory accounting: the bytes tensors hold, each storage counted once.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <unordered_set>
#include <vector>

namespace anvil {

/// Bytes of the distinct tensor storages among `tensors` that are not in
/// `seen` yet (undefined tensors skipped); records them in `seen`.
int64_t storage_bytes(const std::vector<at::Tensor>& tensors, std::unordered_set<const void*>& seen);

}  // namespace anvil
