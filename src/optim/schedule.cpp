#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace anvil::optim {

int64_t warmup_steps(const config::ScheduleConfig& s, int64_t max_steps) {
  if (s.warmup_steps > 0 || s.warmup_ratio <= 0) return s.warmup_steps;
  return static_cast<int64_t>(std::ceil(static_cast<double>(max_steps) * s.warmup_ratio));
}

double lr_at(const config::ScheduleConfig& s, double peak, int64_t step, int64_t max_steps) {
  // A warmup longer than the run (a short smoke run of a shipped config) is clamped to the run.
  const int64_t warmup = std::min(warmup_steps(s, max_steps), max_steps);
  if (step < warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
  const double floor = s.min_lr_ratio * peak;
  const double span = static_cast<double>(std::max<int64_t>(1, max_steps - warmup));
  const double progress = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  if (s.decay == config::Decay::kCosine) return floor + (peak - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
  if (s.decay == config::Decay::kLinear) return floor + (peak - floor) * (1.0 - progress);
  return peak;  // constant
}

}  // namespace anvil::optim
