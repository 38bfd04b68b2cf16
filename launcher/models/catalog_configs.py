"""The published config.json of each catalog model (data only; see catalog.py for the API).

Each dict is the model's config.json on the Hugging Face hub as published, minus
bookkeeping keys (_name_or_path, auto_map, transformers_version, dropout-only fields of some
remote-code configs). Every entry builds with transformers (tests/test_models.py) and its
parameter count matches the real module tree exactly.
"""

# fmt: off
_LLAMA2 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 4096, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16",
    "use_cache": True, "vocab_size": 32000,
}
_LLAMA3 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "initializer_range": 0.02,
    "max_position_embeddings": 131072, "mlp_bias": False, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
_LLAMA32 = {
    **_LLAMA3, "tie_word_embeddings": True,
    "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
_QWEN25 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "initializer_range": 0.02,
    "max_position_embeddings": 131072, "rope_theta": 1000000.0, "sliding_window": 131072,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_mrope": False,
    "use_sliding_window": False, "vocab_size": 152064,
}
_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "initializer_range": 0.02, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
_BLOOM = {
    "architectures": ["BloomForCausalLM"], "model_type": "bloom", "apply_residual_connection_post_layernorm": False,
    "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_dropout": 0.0, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "masked_softmax_fusion": True, "pad_token_id": 3, "slow_but_exact": False, "use_cache": True,
    "vocab_size": 250880,
}
_FALCON = {
    "architectures": ["FalconForCausalLM"], "model_type": "falcon", "alibi": False,
    "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0, "bias": False,
    "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "parallel_attn": True, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 65024,
}
_OPT = {
    "architectures": ["OPTForCausalLM"], "model_type": "opt", "activation_dropout": 0.0,
    "activation_function": "relu", "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": True,
    "dropout": 0.1, "eos_token_id": 2, "init_std": 0.02, "layerdrop": 0.0, "max_position_embeddings": 2048,
    "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16", "use_cache": True, "vocab_size": 50272,
}
_GPT2 = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "n_ctx": 1024, "n_positions": 1024,
    "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True, "vocab_size": 50257,
}
_GEMMA = {
    "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu", "initializer_range": 0.02,
    "max_position_embeddings": 8192, "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000.0, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 256000,
}
_GEMMA2 = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "initializer_range": 0.02, "max_position_embeddings": 8192,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "torch_dtype": "float32", "use_cache": True, "vocab_size": 256000,
}

CONFIGS: dict[str, dict] = {
    # ---- BLOOM (bigscience) ----
    "bloom-560m": {**_BLOOM, "hidden_size": 1024, "n_head": 16, "n_inner": None, "n_layer": 24, "offset_alibi": 100,
                   "pretraining_tp": 1, "skip_bias_add": True, "skip_bias_add_qkv": False, "unk_token_id": 0},
    "bloom-7b1": {**_BLOOM, "hidden_size": 4096, "n_head": 32, "n_inner": None, "n_layer": 30, "offset_alibi": 100,
                  "pretraining_tp": 1, "skip_bias_add": True, "skip_bias_add_qkv": False, "unk_token_id": 0},
    "bloom-176b": {**_BLOOM, "n_embed": 14336, "n_layer": 70, "num_attention_heads": 112, "pretraining_tp": 4},
    # ---- LLaMA (1) 65B: Meta's weights as converted in huggyllama/llama-65b ----
    "llama-1-65b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 8192, "initializer_range": 0.02, "intermediate_size": 22016,
        "max_position_embeddings": 2048, "max_sequence_length": 2048, "num_attention_heads": 64,
        "num_hidden_layers": 80, "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
        "torch_dtype": "float16", "use_cache": True, "vocab_size": 32000,
    },
    # ---- Llama 2 / 3 / 3.1 / 3.2 (meta-llama) ----
    "llama-2-7b": {**_LLAMA2, "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                   "num_hidden_layers": 32, "num_key_value_heads": 32},
    "llama-2-13b": {**_LLAMA2, "hidden_size": 5120, "intermediate_size": 13824, "num_attention_heads": 40,
                    "num_hidden_layers": 40, "num_key_value_heads": 40},
    "llama-2-70b": {**_LLAMA2, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                    "num_hidden_layers": 80, "num_key_value_heads": 8},
    "llama-3-8b": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 8192,
                   "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                   "rope_scaling": None},
    "llama-3-70b": {**_LLAMA3, "hidden_size": 8192, "intermediate_size": 28672, "max_position_embeddings": 8192,
                    "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
                    "rope_scaling": None},
    "llama-3.1-8b": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                     "num_hidden_layers": 32, "num_key_value_heads": 8},
    "llama-3.1-70b": {**_LLAMA3, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                      "num_hidden_layers": 80, "num_key_value_heads": 8},
    "llama-3.1-405b": {**_LLAMA3, "hidden_size": 16384, "intermediate_size": 53248, "num_attention_heads": 128,
                       "num_hidden_layers": 126, "num_key_value_heads": 8},
    "llama-3.2-1b": {**_LLAMA32, "head_dim": 64, "hidden_size": 2048, "intermediate_size": 8192,
                     "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8},
    "llama-3.2-3b": {**_LLAMA32, "head_dim": 128, "hidden_size": 3072, "intermediate_size": 8192,
                     "num_attention_heads": 24, "num_hidden_layers": 28, "num_key_value_heads": 8},
    # ---- Mistral / Mixtral (mistralai) ----
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32000,
    },
    "mistral-7b-v0.2": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 32000,
    },
    "mistral-7b-v0.3": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 32768,
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
        "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32000,
    },
    "mixtral-8x22b": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 6144, "initializer_range": 0.02,
        "intermediate_size": 16384, "max_position_embeddings": 65536, "num_attention_heads": 48,
        "num_experts_per_tok": 2, "num_hidden_layers": 56, "num_key_value_heads": 8, "num_local_experts": 8,
        "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32000,
    },
    # ---- Code Llama (codellama) ----
    "codellama-34b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 8192, "initializer_range": 0.02, "intermediate_size": 22016,
        "max_position_embeddings": 16384, "num_attention_heads": 64, "num_hidden_layers": 48,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 1000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 32000,
    },
    # ---- Yi (01-ai): the Llama module tree ----
    "yi-34b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
        "intermediate_size": 20480, "max_position_embeddings": 4096, "num_attention_heads": 56,
        "num_hidden_layers": 60, "num_key_value_heads": 8, "pad_token_id": 0, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 5000000.0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 64000,
    },
    # ---- Qwen (1.0, remote code), Qwen2.5, Qwen3 (Qwen) ----
    "qwen-7b": {
        "architectures": ["QWenLMHeadModel"], "model_type": "qwen", "attn_dropout_prob": 0.0, "bf16": False,
        "emb_dropout_prob": 0.0, "fp16": False, "fp32": False, "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 22016, "kv_channels": 128, "layer_norm_epsilon": 1e-06,
        "max_position_embeddings": 8192, "no_bias": True, "num_attention_heads": 32, "num_hidden_layers": 32,
        "onnx_safe": None, "rotary_emb_base": 10000, "rotary_pct": 1.0, "scale_attn_weights": True,
        "seq_length": 8192, "tie_word_embeddings": False, "tokenizer_class": "QWenTokenizer", "use_cache": True,
        "use_dynamic_ntk": True, "use_flash_attn": "auto", "use_logn_attn": True, "vocab_size": 151936,
    },
    "qwen2.5-0.5b": {**_QWEN25, "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768,
                     "max_window_layers": 24, "num_attention_heads": 14, "num_hidden_layers": 24,
                     "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "sliding_window": 32768,
                     "tie_word_embeddings": True, "vocab_size": 151936},
    "qwen2.5-1.5b": {**_QWEN25, "hidden_size": 1536, "intermediate_size": 8960, "max_window_layers": 28,
                     "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
                     "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "vocab_size": 151936},
    "qwen2.5-3b": {**_QWEN25, "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 32768,
                   "max_window_layers": 36, "num_attention_heads": 16, "num_hidden_layers": 36,
                   "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "sliding_window": 32768,
                   "tie_word_embeddings": True, "vocab_size": 151936},
    "qwen2.5-7b": {**_QWEN25, "hidden_size": 3584, "intermediate_size": 18944, "max_window_layers": 28,
                   "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
                   "rms_norm_eps": 1e-06},
    "qwen2.5-14b": {**_QWEN25, "hidden_size": 5120, "intermediate_size": 13824, "max_window_layers": 48,
                    "num_attention_heads": 40, "num_hidden_layers": 48, "num_key_value_heads": 8,
                    "rms_norm_eps": 1e-05},
    "qwen2.5-32b": {**_QWEN25, "hidden_size": 5120, "intermediate_size": 27648, "max_window_layers": 64,
                    "num_attention_heads": 40, "num_hidden_layers": 64, "num_key_value_heads": 8,
                    "rms_norm_eps": 1e-05},
    "qwen2.5-72b": {**_QWEN25, "hidden_size": 8192, "intermediate_size": 29568, "max_window_layers": 80,
                    "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
                    "rms_norm_eps": 1e-05},
    "qwen3-0.6b": {**_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "max_window_layers": 28,
                   "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
                   "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "max_window_layers": 36,
                 "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
                 "tie_word_embeddings": False},
    # ---- Gemma (google) ----
    "gemma-2b": {**_GEMMA, "hidden_size": 2048, "intermediate_size": 16384, "num_attention_heads": 8,
                 "num_hidden_layers": 18, "num_key_value_heads": 1},
    "gemma-7b": {**_GEMMA, "hidden_size": 3072, "intermediate_size": 24576, "num_attention_heads": 16,
                 "num_hidden_layers": 28, "num_key_value_heads": 16},
    # ---- Gemma 2 (google): four RMSNorms per block, soft-capped attention and logits ----
    "gemma-2-2b": {**_GEMMA2, "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
                   "num_hidden_layers": 26, "num_key_value_heads": 4},
    "gemma-2-9b": {**_GEMMA2, "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
                   "num_hidden_layers": 42, "num_key_value_heads": 8},
    "gemma-2-27b": {**_GEMMA2, "head_dim": 128, "hidden_size": 4608, "intermediate_size": 36864,
                    "num_attention_heads": 32, "num_hidden_layers": 46, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 144},
    # ---- Falcon (tiiuae) ----
    "falcon-7b": {**_FALCON, "hidden_size": 4544, "multi_query": True, "new_decoder_architecture": False,
                  "num_attention_heads": 71, "num_hidden_layers": 32},
    "falcon-40b": {**_FALCON, "hidden_size": 8192, "new_decoder_architecture": True, "num_attention_heads": 128,
                   "num_hidden_layers": 60, "num_kv_heads": 8},
    "falcon-180b": {**_FALCON, "hidden_size": 14848, "max_position_embeddings": 2048, "multi_query": True,
                    "new_decoder_architecture": True, "num_attention_heads": 232, "num_hidden_layers": 80,
                    "num_kv_heads": 8},
    # ---- GPT-NeoX (EleutherAI) ----
    "gpt-neox-20b": {
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "bos_token_id": 0, "eos_token_id": 0,
        "hidden_act": "gelu_fast", "hidden_size": 6144, "initializer_range": 0.02, "intermediate_size": 24576,
        "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "num_attention_heads": 64,
        "num_hidden_layers": 44, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
        "torch_dtype": "float16", "use_cache": True, "use_parallel_residual": True, "vocab_size": 50432,
    },
    # ---- OPT (facebook) ----
    "opt-350m": {**_OPT, "do_layer_norm_before": False, "ffn_dim": 4096, "hidden_size": 1024,
                 "num_attention_heads": 16, "num_hidden_layers": 24, "word_embed_proj_dim": 512},
    "opt-1.3b": {**_OPT, "ffn_dim": 8192, "hidden_size": 2048, "num_attention_heads": 32, "num_hidden_layers": 24,
                 "word_embed_proj_dim": 2048},
    "opt-66b": {**_OPT, "ffn_dim": 36864, "hidden_size": 9216, "num_attention_heads": 72, "num_hidden_layers": 64,
                "word_embed_proj_dim": 9216},
    # ---- Phi (microsoft) ----
    "phi-1.5": {
        "architectures": ["PhiForCausalLM"], "model_type": "phi", "attention_dropout": 0.0, "bos_token_id": None,
        "embd_pdrop": 0.0, "eos_token_id": None, "hidden_act": "gelu_new", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048, "num_attention_heads": 32, "num_hidden_layers": 24,
        "num_key_value_heads": None, "partial_rotary_factor": 0.5, "qk_layernorm": False, "resid_pdrop": 0.0,
        "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16",
        "use_cache": True, "vocab_size": 51200,
    },
    "phi-2": {
        "architectures": ["PhiForCausalLM"], "model_type": "phi", "attention_dropout": 0.0, "bos_token_id": 50256,
        "embd_pdrop": 0.0, "eos_token_id": 50256, "hidden_act": "gelu_new", "hidden_size": 2560,
        "initializer_range": 0.02, "intermediate_size": 10240, "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 32, "partial_rotary_factor": 0.4, "qk_layernorm": False, "resid_pdrop": 0.1,
        "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16",
        "use_cache": True, "vocab_size": 51200,
    },
    # ---- StableLM (stabilityai) ----
    "stablelm-3b": {
        "architectures": ["StableLmForCausalLM"], "model_type": "stablelm", "bos_token_id": 0, "eos_token_id": 0,
        "hidden_act": "silu", "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 6912,
        "layer_norm_eps": 1e-05, "max_position_embeddings": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.25, "rope_theta": 10000,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_qkv_bias": False,
        "vocab_size": 50304,
    },
    # ---- GPT-2 (openai-community) ----
    "gpt2": {**_GPT2, "n_embd": 768, "n_head": 12, "n_layer": 12},
    "gpt2-medium": {**_GPT2, "n_embd": 1024, "n_head": 16, "n_layer": 24, "n_special": 0, "predict_special_tokens": True},
    "gpt2-large": {**_GPT2, "n_embd": 1280, "n_head": 20, "n_layer": 36},
    "gpt2-xl": {**_GPT2, "n_embd": 1600, "n_head": 25, "n_layer": 48, "output_past": True},
    # ---- tiny models for CPU tests (not on the hub) ----
    "tiny-llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 512, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
        "vocab_size": 512,
    },
    "tiny-bloom": {
        "architectures": ["BloomForCausalLM"], "model_type": "bloom", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_size": 64, "layer_norm_epsilon": 1e-05, "n_head": 4, "n_layer": 2, "pad_token_id": 3,
        "torch_dtype": "float32", "vocab_size": 512,
    },
}
# fmt: on
