/* aotx_embed.h -- the sentence-embedding encoder (BERT, F32 weights).
 *
 * The caller (aotx_trio/embed.py) parses the safetensors file, maps it, and
 * hands the encoder one pointer per tensor; the weights stay owned by the
 * caller and must outlive the handle.  The encoder runs the BERT forward pass
 * (embeddings, LayerNorm, n_layers x [self-attention, dense + residual +
 * LayerNorm, GELU(erf) feed-forward + residual + LayerNorm]), mean-pools each
 * sequence over its attention mask and, with AOTX_EMBED_NORMALIZE, divides by
 * the L2 norm.  Batches arrive padded ([n_seq][stride] ids + lengths); the
 * encoder packs the valid tokens, so padding never enters any computation.
 * All scratch is allocated by aotx_embed_new(); aotx_embed_run() allocates
 * nothing.  One handle runs one batch at a time (the caller serialises).
 */
#ifndef AOTX_EMBED_H
#define AOTX_EMBED_H

#include "aotx.h"

/* CDEF-BEGIN */
enum {
    AOTX_E_EMBED_CONFIG_INVALID = -701,  /* a hyperparameter is out of range */
    AOTX_E_EMBED_WEIGHT_MISSING = -702,  /* a weight pointer is NULL */
    AOTX_E_EMBED_TOKEN_INVALID = -703,   /* a token id is outside [0, vocab_size) */
    AOTX_E_EMBED_LENGTH_INVALID = -704,  /* a sequence length is 0, > stride or > max_seq */
    AOTX_R_EMBED_BATCH_FULL = 705        /* the batch holds more tokens than max_tokens */
};

enum {
    AOTX_EMBED_NORMALIZE = 1             /* aotx_embed_run flag: L2-normalise each row */
};

typedef struct aotx_bert_config {
    int32_t vocab_size;        /* rows of the word embedding table */
    int32_t hidden;            /* d_model (384 for all-MiniLM-L6-v2) */
    int32_t n_layers;
    int32_t n_heads;           /* hidden % n_heads == 0 */
    int32_t intermediate;      /* feed-forward width */
    int32_t max_positions;     /* rows of the position embedding table */
    int32_t type_vocab_size;   /* rows of the token-type table; row 0 is used */
    float layer_norm_eps;
} aotx_bert_config;

/* Linear weights are [out][in] row-major (the PyTorch nn.Linear layout). */
typedef struct aotx_bert_layer {
    const float *q_w;     /* [hidden][hidden] */
    const float *q_b;     /* [hidden] */
    const float *k_w;     /* [hidden][hidden] */
    const float *k_b;     /* [hidden] */
    const float *v_w;     /* [hidden][hidden] */
    const float *v_b;     /* [hidden] */
    const float *ao_w;    /* [hidden][hidden]  attention output dense */
    const float *ao_b;    /* [hidden] */
    const float *ln1_w;   /* [hidden]  attention output LayerNorm */
    const float *ln1_b;   /* [hidden] */
    const float *i_w;     /* [intermediate][hidden] */
    const float *i_b;     /* [intermediate] */
    const float *o_w;     /* [hidden][intermediate] */
    const float *o_b;     /* [hidden] */
    const float *ln2_w;   /* [hidden]  output LayerNorm */
    const float *ln2_b;   /* [hidden] */
} aotx_bert_layer;

typedef struct aotx_bert_weights {
    const float *word_emb;         /* [vocab_size][hidden] */
    const float *pos_emb;          /* [max_positions][hidden] */
    const float *type_emb;         /* [type_vocab_size][hidden] */
    const float *emb_ln_w;         /* [hidden] */
    const float *emb_ln_b;         /* [hidden] */
    const aotx_bert_layer *layers; /* [n_layers]; copied by aotx_embed_new */
} aotx_bert_weights;

typedef struct aotx_embed aotx_embed;

/* max_tokens: most valid (unpadded) tokens one aotx_embed_run() may carry;
 * max_seq: longest sequence (<= max_positions); n_threads: total workers
 * including the caller, 0 = one per online core (1 when the library has no
 * thread pool).  On failure *out is left untouched. */
int aotx_embed_new(const aotx_bert_config *cfg, const aotx_bert_weights *w, int32_t max_tokens,
                   int32_t max_seq, int32_t n_threads, aotx_embed **out);
void aotx_embed_free(aotx_embed *e);
int32_t aotx_embed_dim(const aotx_embed *e);
int32_t aotx_embed_threads(const aotx_embed *e);

/* ids: [n_seq][stride] token ids, sequence s valid on ids[s*stride + 0 .. lens[s]);
 * the rest is padding and never read.  out: [n_seq][hidden].  flags:
 * AOTX_EMBED_NORMALIZE or 0 (mean pooled only).  Validates everything before
 * writing out; a refused call writes nothing. */
int aotx_embed_run(aotx_embed *e, const int32_t *ids, int64_t stride, const int32_t *lens,
                   int32_t n_seq, uint32_t flags, float *out);
/* CDEF-END */

#endif
