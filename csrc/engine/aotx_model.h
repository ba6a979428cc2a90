/* aotx_model.h -- the decoder: Gemma 3, Gemma 2, Phi-3 and the llama family
 * (llama, mistral, qwen2, qwen3) from a GGUF file, weights used in place from the mapping, batched
 * steps over a paged KV pool on the shared thread pool.
 *
 * A step advances many sequences at once: each contributes a chunk of tokens
 * (a prefill chunk or one decode token); every weight is read once per step.
 * Logits are computed only for sequences that ask (their last token).
 */
#ifndef AOTX_MODEL_H
#define AOTX_MODEL_H

#include "aotx.h"
#include "aotx_kv.h"
#include "aotx_tokenizer.h"

/* CDEF-BEGIN */
enum {
    AOTX_ARCH_GEMMA3 = 0, AOTX_ARCH_LLAMA = 1, AOTX_ARCH_QWEN2 = 2, AOTX_ARCH_QWEN3 = 3,
    AOTX_ARCH_GEMMA2 = 4, AOTX_ARCH_PHI3 = 5,

    AOTX_E_MODEL_ARCH = -420,      /* general.architecture not supported */
    AOTX_E_MODEL_PARAM = -421,     /* a hyper-parameter is missing or invalid (named) */
    AOTX_E_MODEL_TENSOR = -422,    /* a tensor is missing, mis-shaped or of an unusable type */
    AOTX_E_MODEL_BATCH = -423,     /* a step's batch is malformed (named in the message) */
    AOTX_E_MODEL_VOCAB = -424      /* the GGUF vocabulary cannot build a tokenizer */
};

typedef struct aotx_model aotx_model;

typedef struct aotx_model_params {
    int32_t n_threads;         /* 0 = one per online core */
    int32_t kv_pages;          /* 0 = the bytes of two float32 sequences of max_tokens per
                                * layer group (>= 64 pages; x2 pages with kv_f16) */
    int32_t page_tokens;       /* default 8 */
    int32_t max_seqs;          /* KV sequence slots, default 16 */
    int32_t max_tokens;        /* positions per sequence, default min(context_length, 4096) */
    int32_t max_batch_tokens;  /* tokens per step, default 512 */
    uint64_t file_offset;      /* the GGUF's extent in the file: byte offset ... */
    uint64_t file_length;      /* ... and length (0 = to the end; 0, 0 = the whole file) */
    const char *backend;       /* compute backend by name; NULL or "" = the default ("cpu") */
    int32_t kv_f16;            /* 1 = K/V pages hold binary16 (half the memory), 0 = float32 */
} aotx_model_params;

typedef struct aotx_model_info {
    int32_t arch;
    int32_t n_vocab, d_model, n_layers, n_heads, n_kv_heads, head_dim, v_dim, d_ff;
    int32_t window, ctx_train, max_tokens, max_batch_tokens, max_seqs, n_threads;
    int32_t bos_id, eos_id, eot_id;   /* -1 when absent */
    int32_t has_tokenizer;
    float rope_base, rope_base_local, attn_scale, eps;
} aotx_model_info;

/* One step.  Sequence i feeds n_tok[i] tokens (tokens concatenated in order);
 * if want_logits is NULL every sequence wants logits, else those with
 * want_logits[i] != 0.  Logit rows are written compacted, in sequence order,
 * into logits[n_wanted][n_vocab]. */
typedef struct aotx_batch {
    int32_t n_seqs;
    const uint32_t *seq;          /* [n_seqs] KV sequence ids (each at most once) */
    const int32_t *n_tok;         /* [n_seqs] */
    const int32_t *tokens;        /* [sum n_tok] */
    const int32_t *want_logits;   /* [n_seqs] or NULL */
    float *logits;                /* [n_wanted][n_vocab] */
} aotx_batch;

void aotx_model_default_params(aotx_model_params *p);
/* On failure *out stays NULL and err holds a message naming the field. */
int aotx_model_load(const char *path, const aotx_model_params *p, aotx_model **out, char *err,
                    int64_t err_cap);
void aotx_model_free(aotx_model *m);
void aotx_model_info_get(const aotx_model *m, aotx_model_info *out);
/* Owned by the model (NULL when the GGUF has no vocabulary). */
aotx_tokenizer *aotx_model_tokenizer(aotx_model *m);
aotx_kv_pool *aotx_model_kv(aotx_model *m);
/* The compute backend the model runs on ("cpu"); aotx_backend_name(i) lists the
 * ones this build carries (NULL past the last). */
const char *aotx_model_backend(const aotx_model *m);
const char *aotx_backend_name(int32_t i);
/* Host address of the K (v = 0) or V row of (seq, layer, pos, head) in the
 * backend's storage, or NULL when not held or not host-visible (tests, tools); with
 * kv_f16 the row holds binary16 values (uint16_t), not floats. */
float *aotx_model_kv_row(aotx_model *m, uint32_t seq, int32_t layer, int32_t pos, int32_t head,
                         int v);
/* Runs a step; the GIL is released by cffi.  On a refusal (e.g.
 * kv_pages_exhausted) or error nothing changed.  err (may be NULL) names
 * the offending field of a malformed batch. */
int aotx_model_step(aotx_model *m, const aotx_batch *b, char *err, int64_t err_cap);
/* CDEF-END */

#endif
