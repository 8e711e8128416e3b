#include "core/tensor_bytes.h"

#include <c10/core/StorageImpl.h>

namespace anvil {

int64_t storage_bytes(const std::vector<at::Tensor>& tensors, std::unordered_set<const void*>& seen) {
  int64_t n = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    const auto* st = t.storage().unsafeGetStorageImpl();
    if (seen.insert(st).second) n += static_cast<int64_t>(st->nbytes());
  }
  return n;
}

}  // namespace anvil
