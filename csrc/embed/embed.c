/* embed.c -- the BERT sentence encoder: handle, validation, batch packing,
 * pooling.  The per-layer compute sections live in embed_layer.c.
 *
 * A batch arrives padded ([n_seq][stride] ids + lengths).  aotx_embed_run()
 * packs the valid tokens of all sequences back to back (tok/pos/seq_off), so
 * every token-wise step (embeddings, linears, LayerNorm, GELU) runs on valid
 * tokens only and attention of sequence s reads keys [seq_off[s],
 * seq_off[s+1]) only: that is the padding mask, applied by construction.
 */
#include "embed_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const aotx_code_entry aotx_embed_codes[] = {
    {AOTX_E_EMBED_CONFIG_INVALID, "embed_config_invalid",
     "an embedding model hyperparameter is out of range"},
    {AOTX_E_EMBED_WEIGHT_MISSING, "embed_weight_missing",
     "an embedding model weight pointer is missing"},
    {AOTX_E_EMBED_TOKEN_INVALID, "embed_token_invalid",
     "a token id is outside the embedding model vocabulary"},
    {AOTX_E_EMBED_LENGTH_INVALID, "embed_length_invalid",
     "a sequence length is zero or longer than the batch stride or the model allows"},
    {AOTX_R_EMBED_BATCH_FULL, "embed_batch_full",
     "the batch holds more tokens than the encoder was sized for; split it"},
    {0, NULL, NULL},
};

#define DIM_LIMIT 65536
#define TOKENS_LIMIT (1 << 20)

static float *falloc(size_t n) {
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

static int config_check(const aotx_bert_config *c, int32_t max_tokens, int32_t max_seq) {
    if (c->vocab_size < 1 || c->hidden < 1 || c->n_layers < 1 || c->n_heads < 1 ||
        c->intermediate < 1 || c->max_positions < 1 || c->type_vocab_size < 1)
        return AOTX_E_EMBED_CONFIG_INVALID;
    if (c->hidden > DIM_LIMIT || c->intermediate > DIM_LIMIT || c->n_layers > 1024 ||
        c->max_positions > DIM_LIMIT || c->vocab_size > (1 << 24))
        return AOTX_E_EMBED_CONFIG_INVALID;
    if (c->hidden % c->n_heads != 0) return AOTX_E_EMBED_CONFIG_INVALID;
    if (!(c->layer_norm_eps > 0.0f) || !isfinite(c->layer_norm_eps))
        return AOTX_E_EMBED_CONFIG_INVALID;
    if (max_seq < 1 || max_seq > c->max_positions) return AOTX_E_EMBED_CONFIG_INVALID;
    if (max_tokens < max_seq || max_tokens > TOKENS_LIMIT) return AOTX_E_EMBED_CONFIG_INVALID;
    return AOTX_OK;
}

static int weights_check(const aotx_bert_weights *w, int32_t n_layers) {
    if (!w->word_emb || !w->pos_emb || !w->type_emb || !w->emb_ln_w || !w->emb_ln_b ||
        !w->layers)
        return AOTX_E_EMBED_WEIGHT_MISSING;
    for (int32_t i = 0; i < n_layers; i++) {
        const aotx_bert_layer *l = &w->layers[i];
        const float *p[] = {l->q_w, l->q_b, l->k_w, l->k_b, l->v_w, l->v_b,
                            l->ao_w, l->ao_b, l->ln1_w, l->ln1_b, l->i_w, l->i_b,
                            l->o_w, l->o_b, l->ln2_w, l->ln2_b};
        for (size_t j = 0; j < sizeof p / sizeof p[0]; j++)
            if (!p[j]) return AOTX_E_EMBED_WEIGHT_MISSING;
    }
    return AOTX_OK;
}

/* The pool (one worker: the caller alone) and the backend the linears' products run on
 * (aotx.h, engine section; the CPU one), its scratch sized for the two input widths. */
static int pool_open(aotx_embed *e, int32_t n_threads) {
    e->n_threads = 1;
    int rc = aotx_pool_new(n_threads, &e->pool);
    if (rc != AOTX_OK) return rc;
    e->n_threads = aotx_pool_size(e->pool);
    if (e->n_threads < 1) e->n_threads = 1;
    aotx_backend_params bp = {.pool = e->pool, .max_batch_tokens = e->max_tokens,
                              .max_ctx = e->max_seq, .dense_head_dim = e->head_dim};
    rc = aotx_backend_cpu.init(&bp, &e->be);
    if (rc != AOTX_OK) return rc;
    e->be_ops = &aotx_backend_cpu;
    rc = e->be_ops->reserve(e->be, AOTX_T_F32, e->cfg.hidden, e->max_tokens);
    if (rc == AOTX_OK) rc = e->be_ops->reserve(e->be, AOTX_T_F32, e->cfg.intermediate, e->max_tokens);
    return rc;
}

static int scratch_alloc(aotx_embed *e) {
    size_t t = (size_t)e->max_tokens, h = (size_t)e->cfg.hidden;
    e->tok = calloc(t, sizeof(int32_t));
    e->pos = calloc(t, sizeof(int32_t));
    e->seq_off = calloc(t + 1, sizeof(int32_t));
    e->x = falloc(t * h);
    e->q = falloc(t * h);
    e->k = falloc(t * h);
    e->v = falloc(t * h);
    e->ctx = falloc(t * h);
    e->tmp = falloc(t * h);
    e->inter = falloc(t * (size_t)e->cfg.intermediate);
    if (!e->tok || !e->pos || !e->seq_off || !e->x || !e->q || !e->k || !e->v || !e->ctx ||
        !e->tmp || !e->inter)
        return AOTX_E_NOMEM;
    return AOTX_OK;
}

int aotx_embed_new(const aotx_bert_config *cfg, const aotx_bert_weights *w, int32_t max_tokens,
                   int32_t max_seq, int32_t n_threads, aotx_embed **out) {
    if (!cfg || !w || !out || n_threads < 0) return AOTX_E_INVALID_ARGUMENT;
    int rc = config_check(cfg, max_tokens, max_seq);
    if (rc != AOTX_OK) return rc;
    rc = weights_check(w, cfg->n_layers);
    if (rc != AOTX_OK) return rc;
    aotx_embed *e = calloc(1, sizeof *e);
    if (!e) return AOTX_E_NOMEM;
    e->cfg = *cfg;
    e->w = *w;
    e->max_tokens = max_tokens;
    e->max_seq = max_seq;
    e->head_dim = cfg->hidden / cfg->n_heads;
    e->layers = calloc((size_t)cfg->n_layers, sizeof *e->layers);
    if (!e->layers) {
        aotx_embed_free(e);
        return AOTX_E_NOMEM;
    }
    memcpy(e->layers, w->layers, (size_t)cfg->n_layers * sizeof *e->layers);
    e->w.layers = e->layers;
    rc = pool_open(e, n_threads);
    if (rc == AOTX_OK) rc = scratch_alloc(e);
    if (rc != AOTX_OK) {
        aotx_embed_free(e);
        return rc;
    }
    *out = e;
    return AOTX_OK;
}

void aotx_embed_free(aotx_embed *e) {
    if (!e) return;
    if (e->be_ops) e->be_ops->free(e->be);
    aotx_pool_free(e->pool);
    free(e->layers);
    free(e->tok);
    free(e->pos);
    free(e->seq_off);
    free(e->x);
    free(e->q);
    free(e->k);
    free(e->v);
    free(e->ctx);
    free(e->tmp);
    free(e->inter);
    free(e);
}

int32_t aotx_embed_dim(const aotx_embed *e) { return e ? e->cfg.hidden : 0; }

int32_t aotx_embed_threads(const aotx_embed *e) { return e ? e->n_threads : 0; }

void aotx_embed_internal_parallel(aotx_embed *e, aotx_pool_fn fn, void *ctx) {
    if (e->pool)
        aotx_pool_run(e->pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

/* Checks every length and id; returns the number of valid tokens in *n_tok. */
static int batch_check(const aotx_embed *e, const int32_t *ids, int64_t stride,
                       const int32_t *lens, int32_t n_seq, int64_t *n_tok) {
    int64_t total = 0;
    for (int32_t s = 0; s < n_seq; s++) {
        if (lens[s] < 1 || lens[s] > stride || lens[s] > e->max_seq)
            return AOTX_E_EMBED_LENGTH_INVALID;
        total += lens[s];
    }
    if (total > e->max_tokens) return AOTX_R_EMBED_BATCH_FULL;
    for (int32_t s = 0; s < n_seq; s++) {
        const int32_t *row = ids + (int64_t)s * stride;
        for (int32_t i = 0; i < lens[s]; i++)
            if (row[i] < 0 || row[i] >= e->cfg.vocab_size) return AOTX_E_EMBED_TOKEN_INVALID;
    }
    *n_tok = total;
    return AOTX_OK;
}

static void batch_pack(aotx_embed *e, const int32_t *ids, int64_t stride, const int32_t *lens,
                       int32_t n_seq) {
    int32_t t = 0;
    for (int32_t s = 0; s < n_seq; s++) {
        e->seq_off[s] = t;
        const int32_t *row = ids + (int64_t)s * stride;
        for (int32_t i = 0; i < lens[s]; i++, t++) {
            e->tok[t] = row[i];
            e->pos[t] = i;
        }
    }
    e->seq_off[n_seq] = t;
}

/* Mean over the valid tokens of each sequence, then optionally x / max(|x|, 1e-12). */
static void pool_mean(const aotx_embed *e, int32_t n_seq, uint32_t flags, float *out) {
    const int32_t h = e->cfg.hidden;
    for (int32_t s = 0; s < n_seq; s++) {
        int32_t a = e->seq_off[s], b = e->seq_off[s + 1];
        float *o = out + (int64_t)s * h;
        for (int32_t j = 0; j < h; j++) {
            double acc = 0.0;
            for (int32_t t = a; t < b; t++) acc += e->x[(int64_t)t * h + j];
            o[j] = (float)(acc / (double)(b - a));
        }
        if (flags & AOTX_EMBED_NORMALIZE) {
            double ss = 0.0;
            for (int32_t j = 0; j < h; j++) ss += (double)o[j] * o[j];
            double norm = sqrt(ss);
            float inv = (float)(1.0 / (norm > 1e-12 ? norm : 1e-12));
            for (int32_t j = 0; j < h; j++) o[j] *= inv;
        }
    }
}

int aotx_embed_run(aotx_embed *e, const int32_t *ids, int64_t stride, const int32_t *lens,
                   int32_t n_seq, uint32_t flags, float *out) {
    if (!e || !ids || !lens || !out || n_seq < 1 || stride < 1 ||
        (flags & ~(uint32_t)AOTX_EMBED_NORMALIZE))
        return AOTX_E_INVALID_ARGUMENT;
    int64_t n_tok = 0;
    int rc = batch_check(e, ids, stride, lens, n_seq, &n_tok);
    if (rc != AOTX_OK) return rc;
    batch_pack(e, ids, stride, lens, n_seq);
    aotx_embed_internal_forward(e, (int32_t)n_tok, n_seq);
    pool_mean(e, n_seq, flags, out);
    return AOTX_OK;
}
