#pragma once
// Precompiled for every LibTorch-using target: parsing these once saves
// 15-30 s per translation unit. Sources still include the narrow headers
// they use, so they also build without the PCH.
#include <ATen/ATen.h>
#include <torch/nn.h>
#include <torch/optim.h>
#include <torch/serialize.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>
