// Model configuration: everything the forward pass needs to know about a model's shape.
// Stored verbatim (little-endian, fixed layout) in the model.bin header.
#ifndef CONFIG_H
#define CONFIG_H

#include <stdint.h>

enum Arch { ARCH_LLAMA = 1, ARCH_QWEN3 = 2 };

enum RopeScaling {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LLAMA3 = 1,       // Llama 3.1 frequency scaling from factor / low / high / original ctx
    ROPE_SCALING_FREQ_FACTORS = 2, // per-frequency divisors stored as tensor "rope_freqs" (GGUF)
};

// Q8_0, Q4_K, Q4_0, Q6_K, Q4_1, Q5_0, Q5_1 and Q5_K are GGML's blocks (model/quant.h); a format-2
// file may hold any matrix in one of them, whatever weight_dtype says (the dtype of the matrices
// that are not quantized).
enum DType {
    DTYPE_F32 = 0, DTYPE_BF16 = 1, DTYPE_Q8_0 = 2, DTYPE_Q4_K = 3, DTYPE_Q4_0 = 4, DTYPE_Q6_K = 5,
    DTYPE_Q4_1 = 6, DTYPE_Q5_0 = 7, DTYPE_Q5_1 = 8, DTYPE_Q5_K = 9
};
#define DTYPE_COUNT 10

typedef struct {
    uint32_t arch;            // Arch
    uint32_t n_layers;
    uint32_t dim;             // hidden size
    uint32_t n_heads;         // query heads
    uint32_t n_kv_heads;      // key/value heads (grouped-query attention)
    uint32_t head_dim;        // may differ from dim / n_heads (Qwen3-0.6B: 16 x 128 on 1024)
    uint32_t hidden_dim;      // FFN intermediate size
    uint32_t vocab_size;      // rows of the embedding; may exceed the tokenizer's token count
    uint32_t max_seq_len;     // the model's trained context
    float norm_eps;           // RMSNorm epsilon
    float rope_theta;
    uint32_t rope_scaling;    // RopeScaling
    float rope_factor;        // llama3: factor
    float rope_low_freq;      // llama3: low_freq_factor
    float rope_high_freq;     // llama3: high_freq_factor
    uint32_t rope_orig_ctx;   // llama3: original_max_position_embeddings
    uint32_t qk_norm;         // 1: per-head RMSNorm of q and k before RoPE (Qwen3)
    uint32_t tied_embeddings; // 1: the LM head is the token embedding
    uint32_t weight_dtype;    // F32 or BF16: the matrices not quantized (norm vectors are always f32)
    // Sampling defaults from generation_config.json (has_gen_defaults = 0 when absent).
    uint32_t has_gen_defaults;
    uint32_t gen_do_sample;
    float gen_temperature;
    float gen_top_p;
    float gen_min_p;
    int32_t gen_top_k;
    uint32_t reserved[8];
} Config;

#endif
