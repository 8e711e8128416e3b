"""Reference outputs from Hugging Face transformers itself, for the C++ parity
tests (tests/models/hf_parity_test.cpp).

For each random-init config below, writes WORKDIR/<name>/ as saved by
save_pretrained, plus:
  reference.safetensors  ids (B, T), logits (B, T, V), loss (), and
                         grad.<checkpoint name> for every parameter, where
                         loss = transformers' causal-LM loss with labels = ids
                         (mixtures of experts with output_router_logits: plus
                         router_aux_loss_coef * aux_loss, and aux_loss ();
                         aux_loss_masked with the attention_mask aux_mask)
  generate.json          {"prompts", "max_new_tokens", "outputs"}: greedy
                         generate(do_sample=False), one prompt at a time
and WORKDIR/index.json listing {name, family}.

usage: make_hf_references.py WORKDIR [FAMILY]
       (FAMILY: gpt2, llama, qwen2, qwen3, mistral, phi3, gemma2, gemma3_text, mixtral, qwen3_moe, neox
        or opt; default all)
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config,
                          GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM,
                          OPTConfig, OPTForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

# Wider init than 0.02 so that greedy argmaxes are not near-ties.
STD = 0.1


def configs():
    yield "gpt2-tiny", "gpt2", GPT2LMHeadModel(GPT2Config(
        vocab_size=97, n_positions=64, n_embd=48, n_layer=3, n_head=4, initializer_range=STD))
    yield "gpt2-inner", "gpt2", GPT2LMHeadModel(GPT2Config(
        vocab_size=61, n_positions=32, n_embd=32, n_layer=2, n_head=2, n_inner=80, layer_norm_epsilon=1e-6,
        initializer_range=STD))
    yield "llama-gqa", "llama", LlamaForCausalLM(LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=STD))
    yield "llama-tied-bias", "llama", LlamaForCausalLM(LlamaConfig(
        vocab_size=89, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, attention_bias=True, mlp_bias=True, tie_word_embeddings=True, rms_norm_eps=1e-5,
        max_position_embeddings=64, initializer_range=STD))
    yield "llama3-rope-scaling", "llama", LlamaForCausalLM(LlamaConfig(
        vocab_size=113, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=256, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16},
        initializer_range=STD))
    # Qwen2 / Qwen2.5: biases on q, k and v, none on o_proj; untied (7B) and tied (0.5B) heads.
    yield "qwen2-gqa", "qwen2", Qwen2ForCausalLM(Qwen2Config(
        vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64, rope_theta=1000000.0, rms_norm_eps=1e-6,
        initializer_range=STD))
    yield "qwen2-tied", "qwen2", Qwen2ForCausalLM(Qwen2Config(
        vocab_size=83, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=64, initializer_range=STD))
    # Qwen3: per-head q_norm / k_norm, head_dim given (wider than hidden / heads), with and without biases.
    yield "qwen3-head-dim", "qwen3", Qwen3ForCausalLM(Qwen3Config(
        vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rope_theta=1000000.0,
        tie_word_embeddings=True, initializer_range=STD))
    yield "qwen3-bias", "qwen3", Qwen3ForCausalLM(Qwen3Config(
        vocab_size=79, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, attention_bias=True, max_position_embeddings=64,
        initializer_range=STD))
    # Qwen2 with use_sliding_window: full attention below max_window_layers, a window of 6 above.
    yield "qwen2-window", "qwen2", Qwen2ForCausalLM(Qwen2Config(
        vocab_size=89, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, use_sliding_window=True, sliding_window=6, max_window_layers=1,
        max_position_embeddings=64, initializer_range=STD))
    # Mistral: sliding windows narrower than the 17-token inputs and the 21-token generations.
    yield "mistral-window", "mistral", MistralForCausalLM(MistralConfig(
        vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, sliding_window=5, max_position_embeddings=64, rope_theta=10000.0,
        initializer_range=STD))
    yield "mistral-head-dim", "mistral", MistralForCausalLM(MistralConfig(
        vocab_size=83, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, sliding_window=8, max_position_embeddings=64, rope_theta=1000000.0,
        initializer_range=STD))
    yield "mistral-no-window", "mistral", MistralForCausalLM(MistralConfig(
        vocab_size=79, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=None, tie_word_embeddings=True, max_position_embeddings=64,
        initializer_range=STD))
    # Phi-3: fused qkv_proj / gate_up_proj; a window (Phi-3-mini-4k); LongRoPE with the 17-token inputs past
    # original_max_position_embeddings (long factors, attention factor sqrt(2)); partial rotary (Phi-4-mini).
    yield "phi3-window", "phi3", Phi3ForCausalLM(Phi3Config(
        vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=6, max_position_embeddings=64, original_max_position_embeddings=64,
        initializer_range=STD, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    g = torch.Generator().manual_seed(5)
    yield "phi3-longrope", "phi3", Phi3ForCausalLM(Phi3Config(
        vocab_size=91, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, original_max_position_embeddings=8,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": (1 + torch.rand(8, generator=g)).tolist(),
                         "long_factor": (1 + 4 * torch.rand(8, generator=g)).tolist()},
        initializer_range=STD, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    yield "phi3-partial", "phi3", Phi3ForCausalLM(Phi3Config(
        vocab_size=73, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, partial_rotary_factor=0.5, tie_word_embeddings=True, max_position_embeddings=64,
        original_max_position_embeddings=64, initializer_range=STD, pad_token_id=0, bos_token_id=1,
        eos_token_id=2))
    # Gemma 2: (1 + w) RMSNorms before and after attention and MLP, sqrt(hidden)-scaled embeddings, scores
    # scaled by query_pre_attn_scalar^-1/2, tanh soft-caps tight enough to bite, sliding and global layers
    # alternating with a window narrower than the inputs; pad_token_id's embedding row gets no gradient.
    yield "gemma2-softcap", "gemma2", Gemma2ForCausalLM(Gemma2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=5,
        attn_logit_softcapping=1.0, final_logit_softcapping=5.0, max_position_embeddings=64,
        initializer_range=STD, pad_token_id=0))
    yield "gemma2-untied", "gemma2", Gemma2ForCausalLM(Gemma2Config(
        vocab_size=83, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=24, query_pre_attn_scalar=12, sliding_window=8,
        attn_logit_softcapping=None, final_logit_softcapping=None, tie_word_embeddings=False,
        max_position_embeddings=64, rope_theta=1000.0, initializer_range=STD, pad_token_id=1))
    yield "gemma2-default-caps", "gemma2", Gemma2ForCausalLM(Gemma2Config(
        vocab_size=71, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=4, attention_bias=True, max_position_embeddings=64,
        initializer_range=STD, pad_token_id=0))
    # Gemma 3: q/k norms, a separate local RoPE base for the sliding layers, linear scaling of the global
    # RoPE (Gemma 3 4B and up), 2 sliding layers to a global one.
    yield "gemma3-pattern", "gemma3_text", Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=5,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], max_position_embeddings=64,
        initializer_range=STD, pad_token_id=0))
    yield "gemma3-linear-rope", "gemma3_text", Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=89, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=20, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        max_position_embeddings=64, initializer_range=STD, pad_token_id=0))
    yield "gemma3-softcap-untied", "gemma3_text", Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=79, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, sliding_window=4, attn_logit_softcapping=2.0,
        final_logit_softcapping=6.0, tie_word_embeddings=False, attention_bias=True,
        layer_types=["full_attention", "sliding_attention"], max_position_embeddings=64,
        initializer_range=STD, pad_token_id=2))
    yield "pythia-parallel", "neox", GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=103, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        rotary_pct=0.25, use_parallel_residual=True, max_position_embeddings=64, initializer_range=STD))
    # Mixtral: Mistral attention, top-k routing over SwiGLU experts with the top-k weights renormalised; the
    # load-balancing loss in the loss (output_router_logits) with a weight large enough to show in gradients.
    yield "mixtral-top2-aux", "mixtral", MixtralForCausalLM(MixtralConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
        router_aux_loss_coef=0.05, max_position_embeddings=64, initializer_range=STD))
    yield "mixtral-window-top1-tied", "mixtral", MixtralForCausalLM(MixtralConfig(
        vocab_size=89, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, num_local_experts=3, num_experts_per_tok=1, sliding_window=4,
        tie_word_embeddings=True, output_router_logits=True, router_aux_loss_coef=0.1,
        max_position_embeddings=64, initializer_range=STD))
    yield "mixtral-no-aux", "mixtral", MixtralForCausalLM(MixtralConfig(
        vocab_size=71, hidden_size=32, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, num_local_experts=5, num_experts_per_tok=3, max_position_embeddings=64,
        initializer_range=STD))
    # Qwen3-MoE: Qwen3 attention; norm_topk_prob on and off, dense layers (mlp_only_layers,
    # decoder_sparse_step) beside sparse ones.
    yield "qwen3-moe-norm-aux", "qwen3_moe", Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=97, hidden_size=64, intermediate_size=112, moe_intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, output_router_logits=True, router_aux_loss_coef=0.05, max_position_embeddings=64,
        initializer_range=STD))
    yield "qwen3-moe-dense-layer", "qwen3_moe", Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=83, hidden_size=48, intermediate_size=96, moe_intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, head_dim=16, num_experts=6, num_experts_per_tok=2,
        norm_topk_prob=False, mlp_only_layers=[1], attention_bias=True, output_router_logits=True,
        router_aux_loss_coef=0.1, max_position_embeddings=64, initializer_range=STD))
    yield "qwen3-moe-sparse-step-tied", "qwen3_moe", Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=79, hidden_size=32, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=3,
        norm_topk_prob=True, decoder_sparse_step=2, tie_word_embeddings=True, max_position_embeddings=64,
        initializer_range=STD))
    yield "neox-sequential", "neox", GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=71, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=3,
        rotary_pct=0.5, rotary_emb_base=1000, use_parallel_residual=False, hidden_act="gelu_new",
        tie_word_embeddings=True, max_position_embeddings=64, initializer_range=STD))
    # OPT: pre-LN relu (opt-125m), post-LN with project_in / project_out
    # (opt-350m), Galactica-like gelu without biases or LayerNorm affines, and
    # pre-LN without the final LayerNorm.
    yield "opt-pre-ln", "opt", OPTForCausalLM(OPTConfig(
        vocab_size=83, hidden_size=48, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=48, dropout=0.0, init_std=STD, pad_token_id=1))
    yield "opt-350m-like", "opt", OPTForCausalLM(OPTConfig(
        vocab_size=79, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=32, do_layer_norm_before=False, dropout=0.0,
        init_std=STD, pad_token_id=1))
    yield "galactica-like", "opt", OPTForCausalLM(OPTConfig(
        vocab_size=91, hidden_size=48, ffn_dim=192, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=48, activation_function="gelu", enable_bias=False,
        layer_norm_elementwise_affine=False, dropout=0.0, init_std=STD, pad_token_id=1))
    yield "opt-no-final-ln", "opt", OPTForCausalLM(OPTConfig(
        vocab_size=67, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=64, word_embed_proj_dim=32, _remove_final_layer_norm=True, dropout=0.0,
        init_std=STD, pad_token_id=1))


def saved_gradients(model, model_dir):
    """Each parameter's gradient under the name(s) save_pretrained wrote: transformers 5 renames some on save,
    and saves a mixture of experts' fused (E, 2I, C) gate_up_proj / (E, C, I) down_proj per expert, as the
    Hub's checkpoints hold them (Mixtral: block_sparse_moe.experts.<e>.w1 / w3 / w2; Qwen3-MoE:
    mlp.experts.<e>.gate_proj / up_proj / down_proj)."""
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    mixtral = model.config.model_type == "mixtral"
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {}
    for n, p in model.named_parameters():
        g = p.grad.detach()
        moe_prefix = n.rsplit("experts.", 1)[0].replace(".mlp.", ".block_sparse_moe." if mixtral else ".mlp.")
        if n.endswith("experts.gate_up_proj"):
            half = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[f"{moe_prefix}experts.{e}.{gate}.weight"] = g[e, :half]
                out[f"{moe_prefix}experts.{e}.{up}.weight"] = g[e, half:]
        elif n.endswith("experts.down_proj"):
            for e in range(g.shape[0]):
                out[f"{moe_prefix}experts.{e}.{down}.weight"] = g[e]
        elif mixtral and n.endswith("mlp.gate.weight"):
            out[n.replace(".mlp.", ".block_sparse_moe.")] = g
        elif n == "lm_head.weight" and "embed_out.weight" in saved:
            out["embed_out.weight"] = g
        else:
            out[n] = g
    missing = [k for k in out if k not in saved]
    if missing:
        raise SystemExit(f"cannot find {missing} among the saved tensors {sorted(saved)}")
    return out


def main():
    work = sys.argv[1]
    only = sys.argv[2] if len(sys.argv) > 2 else None
    index = []
    for i, (name, family, model) in enumerate(configs()):
        if only and family != only:
            continue
        torch.manual_seed(i)
        d = os.path.join(work, name)
        model.eval()
        # Non-trivial norm weights and biases, not just the init's 1 and 0.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("bias") or "norm" in n or ".ln_" in n:
                    p.add_(0.2 * torch.randn_like(p))
                if n.endswith("mlp.gate.weight"):  # routers: clear choices, not the init's near-ties
                    p.normal_(0.0, 1.0)
        model.save_pretrained(d)
        vocab = model.config.vocab_size
        ids = torch.randint(0, vocab, (3, 17))
        out = model(ids, labels=ids)
        out.loss.backward()
        tensors = {"ids": ids, "logits": out.logits.detach().contiguous(), "loss": out.loss.detach()}
        if getattr(out, "aux_loss", None) is not None:
            tensors["aux_loss"] = out.aux_loss.detach().float()
            # Right-padded rows: load_balancing_loss_func leaves the masked tokens out.
            mask = torch.ones_like(ids)
            mask[0, -6:] = 0
            mask[2, -3:] = 0
            with torch.no_grad():
                tensors["aux_mask"] = mask
                tensors["aux_loss_masked"] = model(ids, attention_mask=mask).aux_loss.detach().float()
        for n, g in saved_gradients(model, d).items():
            tensors["grad." + n] = g.contiguous()
        save_file(tensors, os.path.join(d, "reference.safetensors"))

        prompts = [torch.randint(0, vocab, (n,)).tolist() for n in (5, 9, 3, 1)]
        outputs = []
        with torch.no_grad():
            for p in prompts:
                g = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                   do_sample=False, max_new_tokens=12, min_new_tokens=12, eos_token_id=None,
                                   pad_token_id=0)
                outputs.append(g[0, len(p):].tolist())
        # LongRoPE picks its factors from the furthest position of the whole batch, so a left-padded batch
        # of these prompts is computed differently from each prompt alone: only the one-at-a-time
        # generation is comparable.
        rope = getattr(model.config, "rope_parameters", None) or {}
        batch_dependent = rope.get("rope_type") == "longrope"
        with open(os.path.join(d, "generate.json"), "w") as f:
            json.dump({"prompts": prompts, "max_new_tokens": 12, "outputs": outputs,
                       "batch_dependent": batch_dependent}, f)
        index.append({"name": name, "family": family})
        print(f"{name}: loss {out.loss.item():.4f}")
    with open(os.path.join(work, "index.json"), "w") as f:
        json.dump(index, f)


if __name__ == "__main__":
    main()
