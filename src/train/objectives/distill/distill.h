#pragma once
// Internal (not installed): on-policy distillation (Agarwal et al. 2024,
// "On-Policy Distillation of Language Models: Learning from Self-Generated
// Mistakes", GKD; TRL's GKDTrainer), the `distill` algorithm. Registered
// through the calls a linking program uses (config::register_section,
// train::register_objective).
//
// Each step's responses are the student's own samples (with probability
// distill.lmbda) or the dataset's; a frozen teacher of the same vocabulary
// scores every response token, and the loss is the generalised
// Jensen-Shannon divergence between the two token distributions.

#include <ATen/ATen.h>

namespace anvil::train {

/// TRL's generalized_jsd_loss per position: student and teacher logits (N, V)
/// at the same N positions, both divided by `temperature` before the softmax.
/// beta 0: KL(teacher || student) (forward KL); 1: KL(student || teacher)
/// (reverse KL); else beta KL(teacher || m) + (1 - beta) KL(student || m) with
/// m = beta teacher + (1 - beta) student. Returns (N) float32.
at::Tensor generalized_jsd(const at::Tensor& student_logits, const at::Tensor& teacher_logits, double beta,
                           double temperature);

}  // namespace anvil::train
