#pragma once
// Learning-rate schedules, as pure functions of the step (nothing to save).

#include <cstdint>

#include "anvil/config/config.h"

namespace anvil::optim {

/// The warmup of a run of `max_steps` steps: schedule.warmup_steps, or
/// ceil(warmup_ratio * max_steps) as transformers' get_warmup_steps
/// computes it, in doubles (0.07 of 100 steps is 8 there, and here).
int64_t warmup_steps(const config::ScheduleConfig& s, int64_t max_steps);

/// lr for the update at 0-based `step` of `max_steps`. Warmup (warmup_steps,
/// clamped to the run) is linear from 0 (HF's get_*_schedule_with_warmup:
/// step 0 gets lr 0 when warmup > 0); decay then goes from `peak` to
/// `min_lr_ratio * peak` at `max_steps`.
double lr_at(const config::ScheduleConfig& s, double peak, int64_t step, int64_t max_steps);

}  // namespace anvil::optim
