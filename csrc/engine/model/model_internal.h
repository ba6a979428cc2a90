/* model_internal.h -- the decoder's private structures (model*.c only). */
#ifndef AOTX_MODEL_INTERNAL_H
#define AOTX_MODEL_INTERNAL_H

#include "aotx_gguf.h"
#include "aotx_kernels.h"
#include "aotx_kv.h"
#include "aotx_model.h"
#include "aotx_pool.h"
#include "aotx_tokenizer.h"

#include <stdatomic.h>

typedef aotx_weight mtensor;   /* [rows][row_bytes] in the mapping (aotx.h) */

typedef struct mlayer {
    mtensor q, k, v, o, gate, up, down;       /* q/k/v and gate/up may be row ranges of one
                                                 fused tensor (phi3's attn_qkv, ffn_up) */
    float *attn_norm, *ffn_norm;              /* [d_model] owned */
    float *post_attn_norm, *post_ffn_norm;    /* [d_model] owned, gemma2/gemma3 only */
    float *q_norm, *k_norm;                   /* [head_dim] owned, gemma3 and qwen3 */
    float *bq, *bk, *bv;                      /* [rows] owned biases, qwen2 only */
    int sliding;
    int rope_class;                           /* 0 global base, 1 local (sliding) base */
} mlayer;

struct aotx_model {
    aotx_gguf *g;
    aotx_model_info info;
    aotx_pool *pool;
    const aotx_backend_ops *be_ops;   /* kernels and KV storage (aotx.h, engine section) */
    aotx_backend *be;
    aotx_kv_pool *kv;         /* page accounting (host) */
    aotx_kv_store *kv_store;  /* page storage (the backend's) */
    aotx_tokenizer *tok;
    mtensor tok_embd, output;
    float *out_norm;          /* [d_model] owned */
    mlayer *layers;           /* [n_layers] */
    mtensor **weights;        /* [n_weights] owned list: output, then each layer's q k v o gate
                                 up down (the backend's init prepares them, reserve sizes) */
    int32_t n_weights;
    float emb_scale;          /* sqrt(d_model) for gemma2/gemma3, else 1 */
    int gelu;                 /* the FFN gate: 1 gelu_tanh (gemma2/gemma3), 0 silu */
    float attn_softcap;       /* > 0: scores soft-capped (gemma2) */
    float final_softcap;      /* > 0: logits soft-capped (gemma2) */
    int rope_neox;            /* 1: rotate halves; 0: rotate adjacent pairs */
    int32_t n_rot;            /* rotated dims per head (even, <= head_dim) */
    float rope_pos_scale[2];  /* position multiplier per rope class (linear scaling) */
    double rope_base[2];      /* the base per rope class, as read (inv_freq's input) */
    float rope_mscale;        /* cos and sin multiplied by it (phi3 LongRoPE's attn_factor) */
    float *inv_freq;          /* [2][n_rot/2], divided by the LongRoPE factors if any */

    /* step scratch, sized at load; T = max_batch_tokens */
    float *x, *xn;            /* [T][d_model] */
    float *q;                 /* [T][n_heads*head_dim] */
    float *k;                 /* [T][n_kv_heads*head_dim] */
    float *v;                 /* [T][n_kv_heads*v_dim] */
    float *att;               /* [T][n_heads*v_dim] */
    float *o;                 /* [T][d_model] */
    float *gate, *up;         /* [T][d_ff] */
    float *rope_cs;           /* [T][2][n_rot/2][2] cos, sin */
    int32_t *tok_pos;         /* [T] */
    uint32_t *tok_seq;        /* [T] KV sequence id */
    int32_t *logit_tok;       /* [max_seqs] token row of each logit row */
    int32_t *old_len;         /* [max_seqs] */
    uint8_t *seen;            /* [max_seqs] duplicate check */
};

int model_load_weights(aotx_model *m, char *err, int64_t cap);
int model_load_tokenizer(aotx_model *m, char *err, int64_t cap);
int model_read_hparams(aotx_model *m, char *err, int64_t cap);
int model_alloc_scratch(aotx_model *m);
void model_free_weights(aotx_model *m);
int model_set_err(char *err, int64_t cap, int code, const char *fmt, ...);
/* Runs the layers and head for T prepared tokens (tok_seq/tok_pos filled, x embedded). */
void model_forward(aotx_model *m, int32_t T, int32_t n_logits, float *logits);

#endif
