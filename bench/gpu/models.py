"""The transformers twin of an Anvil model config (configs/models/*.yaml), and
the FLOP count MFU uses. Shared by the peers and the table of bench/gpu/run.sh."""
import yaml

# bf16 dense tensor-core peak of an H100/H200 SXM (989.4 TFLOP/s); TF32 is half.
PEAK_FLOPS = {"bf16": 989e12, "tf32": 494.5e12}


def read_model(path, vocab=None):
    """The model section of an Anvil config file (vocab_size 0 = `vocab`)."""
    m = yaml.safe_load(open(path))["model"]
    if not m.get("vocab_size"):
        m["vocab_size"] = vocab
    if not m["vocab_size"]:
        raise SystemExit(f"{path}: model.vocab_size is not set; pass --vocab")
    return m


def hf_config(m):
    import transformers
    if m["family"] == "gpt2":
        return transformers.GPT2Config(
            vocab_size=m["vocab_size"], n_positions=m["max_position_embeddings"], n_embd=m["hidden_size"],
            n_layer=m["num_hidden_layers"], n_head=m["num_attention_heads"], layer_norm_epsilon=m.get("layer_norm_eps", 1e-5),
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=min(50256, m["vocab_size"] - 1), eos_token_id=min(50256, m["vocab_size"] - 1))
    if m["family"] == "llama":
        return transformers.LlamaConfig(
            vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["intermediate_size"],
            num_hidden_layers=m["num_hidden_layers"], num_attention_heads=m["num_attention_heads"],
            num_key_value_heads=m.get("num_key_value_heads", m["num_attention_heads"]),
            max_position_embeddings=m["max_position_embeddings"], rms_norm_eps=m.get("layer_norm_eps", 1e-6),
            rope_theta=m.get("rope_theta", 10000.0), tie_word_embeddings=m.get("tie_word_embeddings", False))
    if m["family"] == "qwen3_moe":
        # As Anvil builds it from these keys: every layer sparse, top-k probabilities renormalised, the
        # load-balancing loss in the loss with weight 0.001.
        return transformers.Qwen3MoeConfig(
            vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["intermediate_size"],
            moe_intermediate_size=m["moe_intermediate_size"], num_hidden_layers=m["num_hidden_layers"],
            num_attention_heads=m["num_attention_heads"], num_key_value_heads=m.get("num_key_value_heads", m["num_attention_heads"]),
            head_dim=m.get("head_dim") or m["hidden_size"] // m["num_attention_heads"], num_experts=m["num_experts"],
            num_experts_per_tok=m.get("num_experts_per_tok", 2), norm_topk_prob=True, output_router_logits=True,
            router_aux_loss_coef=0.001, max_position_embeddings=m["max_position_embeddings"],
            rms_norm_eps=m.get("layer_norm_eps", 1e-6), rope_theta=m.get("rope_theta", 10000.0),
            tie_word_embeddings=False)
    raise SystemExit(f"bench/gpu: family {m['family']} has no transformers twin here (gpt2, llama, qwen3_moe)")


def moe_shape(m):
    """(head_dim, experts, experts per token, expert width) of a qwen3_moe config."""
    return (m.get("head_dim") or m["hidden_size"] // m["num_attention_heads"], m["num_experts"],
            m.get("num_experts_per_tok", 2), m["moe_intermediate_size"])


def parameter_count(m):
    """Parameters of the model, counted from its shape (no transformers import:
    the bookkeeping stays fast); hf_train.py checks it against the model it builds."""
    V, d, L = m["vocab_size"], m["hidden_size"], m["num_hidden_layers"]
    if m["family"] == "gpt2":
        return V * d + m["max_position_embeddings"] * d + L * (12 * d * d + 13 * d) + 2 * d
    h, kv, inter = m["num_attention_heads"], m.get("num_key_value_heads", m["num_attention_heads"]), m["intermediate_size"]
    if m["family"] == "qwen3_moe":
        hd, e, _, mi = moe_shape(m)
        block = d * h * hd + 2 * d * kv * hd + h * hd * d + 2 * hd + 2 * d + e * d + e * 3 * d * mi
        return 2 * V * d + L * block + d  # untied head
    hd = d // h
    block = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * inter + 2 * d
    head = 0 if m.get("tie_word_embeddings", False) else V * d
    return V * d + L * block + d + head


def flops_per_token(m, seq):
    """(6N + 12 L d T, parameter count): PaLM's appendix-B training FLOPs per
    token with N counted as the GPU issue's table counts it, every parameter
    but GPT-2's learned position table (a tied GPT-2 head counts once; LLaMA's
    untied input embedding is counted too, as that table did); a mixture of
    experts counts the experts a token is routed to."""
    total = parameter_count(m)
    n = total - (m["max_position_embeddings"] * m["hidden_size"] if m["family"] == "gpt2" else 0)
    if m["family"] == "qwen3_moe":  # the parameters a token goes through: k of the experts
        _, e, k, mi = moe_shape(m)
        n -= m["num_hidden_layers"] * (e - k) * 3 * m["hidden_size"] * mi
    return 6 * n + 12 * m["num_hidden_layers"] * m["hidden_size"] * seq, total
