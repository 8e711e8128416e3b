#pragma once
// Learning-rate schedules, as pure functions of the step (nothing to save).

#include <cstdint>

#include "anvil/config/config.h"

namespace anvil::optim {

/// lr for the update at 0-based `step` of `max_steps`. Warmup is linear from
/// 0 (HF's get_*_schedule_with_warmup: step 0 gets lr 0 when warmup > 0);
/// decay then goes from `peak` to `min_lr_ratio * peak` at `max_steps`.
double lr_at(const config::ScheduleConfig& s, double peak, int64_t step, int64_t max_steps);

}  // namespace anvil::optim
