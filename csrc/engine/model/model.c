/* model.c -- the decoder's public face: load, free, info, step. */
#include "model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const aotx_code_entry aotx_model_codes[] = {
    {AOTX_E_GGUF_OPEN, "gguf_open_error", "the GGUF file cannot be opened or mapped"},
    {AOTX_E_GGUF_MAGIC, "gguf_header_corrupt", "the file is not GGUF (bad magic)"},
    {AOTX_E_GGUF_VERSION, "gguf_version_unsupported", "the GGUF version is not 2 or 3"},
    {AOTX_E_GGUF_TRUNCATED, "gguf_data_corrupt", "a GGUF field runs past the end of the file"},
    {AOTX_E_GGUF_VALUE_TYPE, "gguf_value_type_corrupt", "unknown GGUF metadata value type"},
    {AOTX_E_GGUF_TENSOR, "gguf_tensor_corrupt", "a GGUF tensor entry is malformed"},
    {AOTX_E_GGUF_ALIGNMENT, "gguf_alignment_corrupt", "general.alignment is not a power of two"},
    {AOTX_E_GGUF_KEY, "gguf_key_invalid", "a GGUF metadata key is missing or of the wrong type"},
    {AOTX_E_GGUF_LIMIT, "gguf_limit_corrupt", "a GGUF count exceeds the reader's limits"},
    {AOTX_E_MODEL_ARCH, "model_arch_unsupported", "the model architecture is not supported"},
    {AOTX_E_MODEL_PARAM, "model_param_invalid", "a model hyper-parameter is missing or invalid"},
    {AOTX_E_MODEL_TENSOR, "model_tensor_invalid", "a model tensor is missing or mis-shaped"},
    {AOTX_E_MODEL_BATCH, "model_batch_invalid", "the step's batch is malformed"},
    {AOTX_E_MODEL_VOCAB, "model_vocab_invalid", "the GGUF vocabulary cannot build a tokenizer"},
    {0, NULL, NULL},
};

void aotx_model_default_params(aotx_model_params *p) {
    *p = (aotx_model_params){.n_threads = 0, .kv_pages = 0, .page_tokens = 8, .max_seqs = 16,
                             .max_tokens = 0, .max_batch_tokens = 512, .backend = NULL,
                             .file_offset = 0, .file_length = 0, .kv_f16 = 0};
}

/* The backends this build carries, the default first. */
static const aotx_backend_ops *const backends[] = {&aotx_backend_cpu};
#define N_BACKENDS ((int32_t)(sizeof backends / sizeof backends[0]))

const char *aotx_backend_name(int32_t i) {
    return i >= 0 && i < N_BACKENDS ? backends[i]->name : NULL;
}

static const aotx_backend_ops *find_backend(const char *name) {
    if (!name || !name[0]) return backends[0];
    for (int32_t i = 0; i < N_BACKENDS; i++)
        if (strcmp(backends[i]->name, name) == 0) return backends[i];
    return NULL;
}

static int open_backend(aotx_model *m, const aotx_model_params *p, char *err, int64_t cap) {
    m->be_ops = find_backend(p->backend);
    if (!m->be_ops)
        return model_set_err(err, cap, AOTX_E_UNSUPPORTED, "backend '%.64s' is not built in "
                             "(this build has: cpu)", p->backend);
    aotx_backend_params bp = {.pool = m->pool, .max_batch_tokens = m->info.max_batch_tokens,
                              .max_ctx = m->info.max_tokens, .head = m->weights[0],
                              .body = m->weights + 1, .n_body = m->n_weights - 1};
    int rc = m->be_ops->init(&bp, &m->be);
    if (rc) return model_set_err(err, cap, rc, "backend '%s' cannot start", m->be_ops->name);
    return 0;
}

static int make_kv(aotx_model *m, const aotx_model_params *p) {
    const aotx_model_info *in = &m->info;
    uint8_t *sl = calloc((size_t)in->n_layers, 1);
    if (!sl) return AOTX_E_NOMEM;
    for (int32_t l = 0; l < in->n_layers; l++) sl[l] = (uint8_t)m->layers[l].sliding;
    aotx_kv_params kp = {
        .n_pages = p->kv_pages, .page_tokens = p->page_tokens, .max_seqs = in->max_seqs,
        .max_tokens = in->max_tokens, .n_layers = in->n_layers, .n_kv_heads = in->n_kv_heads,
        .k_dim = in->head_dim, .v_dim = in->v_dim, .window = in->window, .sliding = sl,
        .kv_f16 = p->kv_f16};
    if (kp.n_pages <= 0) {
        /* default: the bytes of two float32 sequences of max_tokens in every layer group
         * (touched lazily): binary16 pages are half the size, so twice as many */
        int32_t per_seq = (in->max_tokens + kp.page_tokens - 1) / kp.page_tokens;
        int32_t n_sl = 0, a, b;
        for (int32_t l = 0; l < in->n_layers; l++) n_sl += sl[l];
        a = n_sl;
        b = in->n_layers - n_sl;
        while (b) { int32_t t = a % b; a = b; b = t; }   /* a = gcd = layers per group */
        int32_t groups = (n_sl && n_sl < in->n_layers) ? in->n_layers / a : 1;
        kp.n_pages = per_seq * groups * 2;
        if (kp.n_pages < 64) kp.n_pages = 64;
        if (p->kv_f16) kp.n_pages *= 2;
    }
    int rc = aotx_kv_new(&kp, &m->kv);
    free(sl);
    if (rc) return rc;
    aotx_kv_stats st;
    aotx_kv_stats_get(m->kv, &st);   /* the accounting knows the page size; the backend stores */
    return m->be_ops->kv_alloc_pages(m->be, st.n_pages, st.page_bytes, &m->kv_store);
}

static int setup(aotx_model *m, const char *path, const aotx_model_params *p, char *err,
                 int64_t cap) {
    int rc = aotx_gguf_open_range(path, p->file_offset, p->file_length, &m->g, err, cap);
    if (rc) return rc;
    if ((rc = model_read_hparams(m, err, cap))) return rc;
    aotx_model_info *in = &m->info;
    in->max_seqs = p->max_seqs;
    in->max_batch_tokens = p->max_batch_tokens;
    in->max_tokens = p->max_tokens > 0 ? p->max_tokens
                                       : (in->ctx_train < 4096 ? in->ctx_train : 4096);
    if ((rc = model_load_weights(m, err, cap))) return rc;
    if ((rc = model_load_tokenizer(m, err, cap))) return rc;
    if ((rc = aotx_pool_new(p->n_threads, &m->pool))) return rc;
    in->n_threads = aotx_pool_size(m->pool);
    if ((rc = open_backend(m, p, err, cap))) return rc;
    if ((rc = make_kv(m, p)))
        return model_set_err(err, cap, rc, "KV pool of %d pages cannot be created", p->kv_pages);
    return model_alloc_scratch(m);
}

int aotx_model_load(const char *path, const aotx_model_params *p, aotx_model **out, char *err,
                    int64_t err_cap) {
    aotx_model_params dp;
    if (!out || !path) return AOTX_E_INVALID_ARGUMENT;
    *out = NULL;
    if (err && err_cap > 0) err[0] = 0;
    if (!p) { aotx_model_default_params(&dp); p = &dp; }
    if (p->n_threads < 0 || p->page_tokens <= 0 || p->max_seqs <= 0 || p->max_tokens < 0 ||
        p->max_batch_tokens <= 0 || p->kv_pages < 0 || (p->kv_f16 != 0 && p->kv_f16 != 1))
        return model_set_err(err, err_cap, AOTX_E_INVALID_ARGUMENT,
                             "model params: n_threads, page_tokens, max_seqs, max_tokens, "
                             "max_batch_tokens, kv_pages must be positive (0 = default), "
                             "kv_f16 0 or 1");
    aotx_model *m = calloc(1, sizeof *m);
    if (!m) return AOTX_E_NOMEM;
    int rc = setup(m, path, p, err, err_cap);
    if (rc) { aotx_model_free(m); return rc; }
    *out = m;
    return 0;
}

void aotx_model_free(aotx_model *m) {
    if (!m) return;
    if (m->be_ops) {
        m->be_ops->kv_free_pages(m->be, m->kv_store);
        m->be_ops->free(m->be);
    }
    aotx_pool_free(m->pool);
    aotx_kv_free(m->kv);
    aotx_tokenizer_free(m->tok);
    model_free_weights(m);
    free(m->x); free(m->xn); free(m->q); free(m->k); free(m->v); free(m->att); free(m->o);
    free(m->gate); free(m->up); free(m->rope_cs);
    free(m->tok_pos); free(m->tok_seq); free(m->logit_tok); free(m->old_len); free(m->seen);
    aotx_gguf_close(m->g);
    free(m);
}

void aotx_model_info_get(const aotx_model *m, aotx_model_info *out) { *out = m->info; }
aotx_tokenizer *aotx_model_tokenizer(aotx_model *m) { return m->tok; }
aotx_kv_pool *aotx_model_kv(aotx_model *m) { return m->kv; }
const char *aotx_model_backend(const aotx_model *m) { return m->be_ops->name; }

float *aotx_model_kv_row(aotx_model *m, uint32_t seq, int32_t layer, int32_t pos, int32_t head,
                         int v) {
    int32_t page;
    int64_t off;
    if (!m || aotx_kv_locate(m->kv, seq, layer, pos, head, v, &page, &off)) return NULL;
    aotx_kv_stats st;
    aotx_kv_stats_get(m->kv, &st);   /* elements of elem_bytes (a tool's call, not a step's) */
    char *base = (char *)m->be_ops->kv_page_ptr(m->kv_store, page);
    return base ? (float *)(base + off * st.elem_bytes) : NULL;
}

static int check_batch(aotx_model *m, const aotx_batch *b, int32_t *T_out, int32_t *nl_out,
                       char *err, int64_t cap) {
    const aotx_model_info *in = &m->info;
    if (!b || b->n_seqs <= 0 || b->n_seqs > in->max_seqs || !b->seq || !b->n_tok || !b->tokens)
        return model_set_err(err, cap, AOTX_E_MODEL_BATCH, "n_seqs must be 1..%d with seq, "
                             "n_tok and tokens set", in->max_seqs);
    int64_t T = 0;
    int32_t nl = 0;
    int rc = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        aotx_kv_seq_info si;
        if (b->n_tok[i] <= 0) { rc = model_set_err(err, cap, AOTX_E_MODEL_BATCH, "n_tok[%d] <= 0", i); break; }
        if (aotx_kv_seq_info_get(m->kv, b->seq[i], &si)) {
            rc = model_set_err(err, cap, AOTX_E_KV_SEQ, "seq[%d] = %u is not a live sequence", i,
                               b->seq[i]);
            break;
        }
        if (m->seen[b->seq[i]]) {
            rc = model_set_err(err, cap, AOTX_E_MODEL_BATCH, "seq[%d] = %u appears twice", i,
                               b->seq[i]);
            break;
        }
        m->seen[b->seq[i]] = 1;
        T += b->n_tok[i];
        if (!b->want_logits || b->want_logits[i]) nl++;
    }
    for (int32_t i = 0; i < b->n_seqs; i++)
        if (b->seq[i] < (uint32_t)in->max_seqs) m->seen[b->seq[i]] = 0;
    if (rc) return rc;
    if (T > in->max_batch_tokens)
        return model_set_err(err, cap, AOTX_E_MODEL_BATCH, "%lld tokens exceed max_batch_tokens %d",
                             (long long)T, in->max_batch_tokens);
    if (nl > 0 && !b->logits)
        return model_set_err(err, cap, AOTX_E_MODEL_BATCH, "logits buffer is NULL");
    for (int64_t t = 0; t < T; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= in->n_vocab)
            return model_set_err(err, cap, AOTX_E_MODEL_BATCH, "tokens[%lld] = %d outside 0..%d",
                                 (long long)t, b->tokens[t], in->n_vocab - 1);
    *T_out = (int32_t)T;
    *nl_out = nl;
    return 0;
}

/* Grows every sequence's KV; on a refusal undoes the ones already grown. */
static int grow_all(aotx_model *m, const aotx_batch *b, char *err, int64_t cap) {
    for (int32_t i = 0; i < b->n_seqs; i++) {
        aotx_kv_seq_info si;
        aotx_kv_seq_info_get(m->kv, b->seq[i], &si);
        m->old_len[i] = si.length;
        int rc = aotx_kv_seq_grow(m->kv, b->seq[i], b->n_tok[i]);
        if (rc) {
            for (int32_t j = 0; j < i; j++) aotx_kv_seq_shrink(m->kv, b->seq[j], b->n_tok[j]);
            return model_set_err(err, cap, rc, "seq[%d] = %u cannot grow by %d positions (%s)", i,
                                 b->seq[i], b->n_tok[i], aotx_code_name(rc));
        }
    }
    return 0;
}

static void embed_tokens(aotx_model *m, const aotx_batch *b, int32_t T) {
    const aotx_model_info *in = &m->info;
    int64_t row_bytes = aotx_type_row_bytes(m->tok_embd.type, in->d_model);
    int32_t t = 0, r = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        for (int32_t j = 0; j < b->n_tok[i]; j++, t++) {
            float *x = m->x + (int64_t)t * in->d_model;
            const uint8_t *w = (const uint8_t *)m->tok_embd.w + (int64_t)b->tokens[t] * row_bytes;
            aotx_dequant_row(m->tok_embd.type, w, x, in->d_model);
            if (m->emb_scale != 1.0f)
                for (int32_t c = 0; c < in->d_model; c++) x[c] *= m->emb_scale;
            m->tok_seq[t] = b->seq[i];
            m->tok_pos[t] = m->old_len[i] + j;
        }
        if (!b->want_logits || b->want_logits[i]) m->logit_tok[r++] = t - 1;
    }
    (void)T;
}

int aotx_model_step(aotx_model *m, const aotx_batch *b, char *err, int64_t err_cap) {
    int32_t T = 0, nl = 0;
    if (!m) return AOTX_E_INVALID_ARGUMENT;
    if (err && err_cap > 0) err[0] = 0;
    int rc = check_batch(m, b, &T, &nl, err, err_cap);
    if (rc) return rc;
    if ((rc = grow_all(m, b, err, err_cap))) return rc;
    embed_tokens(m, b, T);
    model_forward(m, T, nl, b->logits);
    for (int32_t i = 0; i < b->n_seqs; i++) aotx_kv_seq_trim(m->kv, b->seq[i]);
    return 0;
}
