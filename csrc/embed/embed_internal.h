/* embed_internal.h -- shared between embed.c and embed_layer.c; not public. */
#ifndef AOTX_EMBED_INTERNAL_H
#define AOTX_EMBED_INTERNAL_H

#include "aotx_embed.h"
#include "aotx_kernels.h"
#include "aotx_pool.h"
#include "aotx_sgemm.h"

struct aotx_embed {
    aotx_bert_config cfg;
    aotx_bert_weights w;       /* w.layers points at layers below */
    aotx_bert_layer *layers;   /* [n_layers] */
    aotx_pool *pool;
    const aotx_backend_ops *be_ops;  /* the linears' products and the attention (aotx.h) */
    aotx_backend *be;
    int32_t n_threads;         /* workers including the caller */
    int32_t max_tokens;        /* packed-token capacity of the scratch below */
    int32_t max_seq;           /* longest sequence */
    int32_t head_dim;          /* hidden / n_heads */
    int32_t *tok;              /* [max_tokens] packed token ids */
    int32_t *pos;              /* [max_tokens] position of each packed token */
    int32_t *seq_off;          /* [max_tokens + 1] first packed token of each sequence */
    float *x;                  /* [max_tokens][hidden] hidden state */
    float *q;                  /* [max_tokens][hidden] */
    float *k;                  /* [max_tokens][hidden] */
    float *v;                  /* [max_tokens][hidden] */
    float *ctx;                /* [max_tokens][hidden] attention output (heads concatenated) */
    float *tmp;                /* [max_tokens][hidden] dense output before the residual */
    float *inter;              /* [max_tokens][intermediate] GELU activations */
};

/* Runs fn on every worker of the pool. */
void aotx_embed_internal_parallel(aotx_embed *e, aotx_pool_fn fn, void *ctx);
/* Embeddings + every layer on the packed batch (tok/pos/seq_off filled): result in e->x. */
void aotx_embed_internal_forward(aotx_embed *e, int32_t n_tok, int32_t n_seq);

#endif
