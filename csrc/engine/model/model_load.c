/* model_load.c -- hyper-parameters, tensors and vocabulary from a GGUF file. */
#include "model_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int model_set_err(char *err, int64_t cap, int code, const char *fmt, ...) {
    if (err && cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, (size_t)cap, fmt, ap);
        va_end(ap);
    }
    return code;
}

static const char *arch_prefix(const aotx_model *m) {
    switch (m->info.arch) {
    case AOTX_ARCH_GEMMA3: return "gemma3";
    case AOTX_ARCH_GEMMA2: return "gemma2";
    case AOTX_ARCH_PHI3: return "phi3";
    case AOTX_ARCH_QWEN2: return "qwen2";
    case AOTX_ARCH_QWEN3: return "qwen3";
    default: return "llama";
    }
}

/* {arch}.suffix as an int; dflt < INT64_MIN+1 means required. */
static int hp_int(const aotx_model *m, const char *suffix, int64_t dflt, int required, int64_t *out,
                  char *err, int64_t cap) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch_prefix(m), suffix);
    int64_t i = aotx_gguf_find_key(m->g, key);
    if (i < 0) {
        if (required) return model_set_err(err, cap, AOTX_E_MODEL_PARAM, "%s is missing", key);
        *out = dflt;
        return 0;
    }
    if (aotx_gguf_get_int(m->g, i, out) || *out < 0 || *out > (1 << 30))
        return model_set_err(err, cap, AOTX_E_MODEL_PARAM, "%s is not a valid integer", key);
    return 0;
}

static int hp_float(const aotx_model *m, const char *suffix, double dflt, double *out, char *err,
                    int64_t cap) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch_prefix(m), suffix);
    int64_t i = aotx_gguf_find_key(m->g, key);
    if (i < 0) { *out = dflt; return 0; }
    if (aotx_gguf_get_float(m->g, i, out) || !isfinite(*out))
        return model_set_err(err, cap, AOTX_E_MODEL_PARAM, "%s is not a number", key);
    return 0;
}

static int read_arch(aotx_model *m, char *err, int64_t cap) {
    const char *s;
    uint64_t n;
    int64_t i = aotx_gguf_find_key(m->g, "general.architecture");
    if (i < 0 || aotx_gguf_get_str(m->g, i, &s, &n))
        return model_set_err(err, cap, AOTX_E_MODEL_ARCH, "general.architecture is missing");
    if (n == 6 && !memcmp(s, "gemma3", 6)) m->info.arch = AOTX_ARCH_GEMMA3;
    else if (n == 6 && !memcmp(s, "gemma2", 6)) m->info.arch = AOTX_ARCH_GEMMA2;
    else if ((n == 5 && !memcmp(s, "llama", 5)) || (n == 7 && !memcmp(s, "mistral", 7)))
        m->info.arch = AOTX_ARCH_LLAMA;
    else if (n == 5 && !memcmp(s, "qwen2", 5)) m->info.arch = AOTX_ARCH_QWEN2;
    else if (n == 5 && !memcmp(s, "qwen3", 5)) m->info.arch = AOTX_ARCH_QWEN3;
    else if (n == 4 && !memcmp(s, "phi3", 4)) m->info.arch = AOTX_ARCH_PHI3;
    else
        return model_set_err(err, cap, AOTX_E_MODEL_ARCH,
                             "general.architecture '%.*s' is not gemma3, gemma2, llama, "
                             "mistral, qwen2, qwen3 or phi3",
                             (int)(n > 64 ? 64 : n), s);
    return 0;
}

int model_read_hparams(aotx_model *m, char *err, int64_t cap) {
    int rc;
    int64_t d, L, ff, nh, nkv, kl, vl, win, ctx, nrot;
    double eps, base, base_local, scale, rscale, cap_attn, cap_final;
    aotx_model_info *in = &m->info;
    if ((rc = read_arch(m, err, cap))) return rc;
    int gem2 = in->arch == AOTX_ARCH_GEMMA2, gemma = gem2 || in->arch == AOTX_ARCH_GEMMA3;
    if ((rc = hp_int(m, "embedding_length", 0, 1, &d, err, cap))) return rc;
    if ((rc = hp_int(m, "block_count", 0, 1, &L, err, cap))) return rc;
    if ((rc = hp_int(m, "feed_forward_length", 0, 1, &ff, err, cap))) return rc;
    if ((rc = hp_int(m, "attention.head_count", 0, 1, &nh, err, cap))) return rc;
    if ((rc = hp_int(m, "attention.head_count_kv", nh, 0, &nkv, err, cap))) return rc;
    if (d <= 0 || L <= 0 || ff <= 0 || nh <= 0 || nkv <= 0 || nh % nkv)
        return model_set_err(err, cap, AOTX_E_MODEL_PARAM,
                             "%s: embedding_length/block_count/feed_forward_length/head counts "
                             "invalid (head_count %% head_count_kv must be 0)", arch_prefix(m));
    if ((rc = hp_int(m, "attention.key_length", d / nh, 0, &kl, err, cap))) return rc;
    if ((rc = hp_int(m, "attention.value_length", kl, 0, &vl, err, cap))) return rc;
    if ((rc = hp_int(m, "context_length", 2048, 0, &ctx, err, cap))) return rc;
    if ((rc = hp_int(m, "attention.sliding_window", 0, 0, &win, err, cap))) return rc;
    if ((rc = hp_int(m, "rope.dimension_count", kl, 0, &nrot, err, cap))) return rc;
    if (kl <= 0 || vl <= 0 || kl % 2 || nrot <= 0 || nrot > kl || nrot % 2)
        return model_set_err(err, cap, AOTX_E_MODEL_PARAM, "%s.attention.key_length %lld / "
                             "rope.dimension_count %lld invalid", arch_prefix(m), (long long)kl,
                             (long long)nrot);
    if ((rc = hp_float(m, "attention.layer_norm_rms_epsilon", 1e-6, &eps, err, cap))) return rc;
    if ((rc = hp_float(m, "rope.freq_base", m->info.arch == AOTX_ARCH_GEMMA3 ? 1e6 : 1e4, &base,
                       err, cap)))
        return rc;
    if ((rc = hp_float(m, "rope.freq_base_swa", 1e4, &base_local, err, cap))) return rc;
    /* Gemma 2 27B (its 46 blocks) scales queries by 1/sqrt(d_model / heads), not by
     * 1/sqrt(key_length) (its query_pre_attn_scalar, which the GGUF does not carry) */
    double q_pre = gem2 && L == 46 ? (double)d / (double)nh : (double)kl;
    if ((rc = hp_float(m, "attention.scale", 1.0 / sqrt(q_pre), &scale, err, cap))) return rc;
    /* Gemma 2's soft-caps (the architecture's 50 and 30 when the file names none) */
    if ((rc = hp_float(m, "attn_logit_softcapping", gem2 ? 50.0 : 0.0, &cap_attn, err, cap)))
        return rc;
    if ((rc = hp_float(m, "final_logit_softcapping", gem2 ? 30.0 : 0.0, &cap_final, err, cap)))
        return rc;
    if (cap_attn < 0 || cap_final < 0)
        return model_set_err(err, cap, AOTX_E_MODEL_PARAM, "%s.*_logit_softcapping must not be "
                             "negative", arch_prefix(m));
    if ((rc = hp_float(m, "rope.scaling.factor", 1.0, &rscale, err, cap))) return rc;
    if (rscale <= 0) rscale = 1.0;
    in->d_model = (int32_t)d; in->n_layers = (int32_t)L; in->d_ff = (int32_t)ff;
    in->n_heads = (int32_t)nh; in->n_kv_heads = (int32_t)nkv;
    in->head_dim = (int32_t)kl; in->v_dim = (int32_t)vl;
    in->ctx_train = (int32_t)ctx;
    in->window = gemma || in->arch == AOTX_ARCH_PHI3 ? (int32_t)win : 0;
    in->eps = (float)eps;
    in->rope_base = (float)base;
    in->rope_base_local = m->info.arch == AOTX_ARCH_GEMMA3 ? (float)base_local : (float)base;
    in->attn_scale = (float)scale;
    m->n_rot = (int32_t)nrot;
    m->rope_neox = m->info.arch != AOTX_ARCH_LLAMA;
    m->emb_scale = gemma ? sqrtf((float)d) : 1.0f;
    m->gelu = gemma;
    m->attn_softcap = gem2 ? (float)cap_attn : 0.0f;
    m->final_softcap = gem2 ? (float)cap_final : 0.0f;
    /* linear rope scaling applies to global layers (all layers outside gemma3) */
    m->rope_pos_scale[0] = (float)(1.0 / rscale);
    m->rope_pos_scale[1] = m->info.arch == AOTX_ARCH_GEMMA3 ? 1.0f : (float)(1.0 / rscale);
    m->rope_base[0] = base;
    m->rope_base[1] = in->rope_base_local;
    return 0;
}

static int get_matrix(aotx_model *m, const char *name, int64_t rows, int64_t cols, int optional,
                      mtensor *out, char *err, int64_t cap) {
    aotx_gguf_tensor_info ti;
    int64_t i = aotx_gguf_find_tensor(m->g, name);
    memset(out, 0, sizeof *out);
    if (i < 0) {
        if (optional) return 0;
        return model_set_err(err, cap, AOTX_E_MODEL_TENSOR, "tensor %s is missing", name);
    }
    aotx_gguf_tensor(m->g, i, &ti);
    if (ti.n_dims != 2 || ti.dims[0] != cols || (rows > 0 && ti.dims[1] != rows))
        return model_set_err(err, cap, AOTX_E_MODEL_TENSOR,
                             "tensor %s has shape [%lld, %lld]; expected [%lld, %lld]", name,
                             (long long)ti.dims[0], (long long)ti.dims[1], (long long)cols,
                             (long long)rows);
    if (aotx_type_block_elems(ti.type) <= 0 || aotx_act_bytes(ti.type, cols, 1) <= 0) {
        const char *tn = aotx_type_name(ti.type);
        return model_set_err(err, cap, AOTX_E_MODEL_TENSOR,
                             "tensor %s has type %s (%d), which the kernels do not support "
                             "(supported: %s)",
                             name, tn ? tn : "unnamed", ti.type, aotx_kernel_types());
    }
    *out = (mtensor){ti.data, ti.type, ti.dims[1], ti.dims[0], NULL};
    return 0;
}

/* A 1-D tensor of n elements, dequantized into an owned float copy. */
static int get_vector(aotx_model *m, const char *name, int64_t n, int optional, float **out,
                      char *err, int64_t cap) {
    aotx_gguf_tensor_info ti;
    int64_t i = aotx_gguf_find_tensor(m->g, name);
    *out = NULL;
    if (i < 0) {
        if (optional) return 0;
        return model_set_err(err, cap, AOTX_E_MODEL_TENSOR, "tensor %s is missing", name);
    }
    aotx_gguf_tensor(m->g, i, &ti);
    if (ti.n_dims != 1 || ti.dims[0] != n)
        return model_set_err(err, cap, AOTX_E_MODEL_TENSOR,
                             "tensor %s has %lld elements in %d dims; expected [%lld]", name,
                             (long long)ti.dims[0], ti.n_dims, (long long)n);
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return AOTX_E_NOMEM;
    if (aotx_dequant_row(ti.type, ti.data, v, n)) {
        free(v);
        return model_set_err(err, cap, AOTX_E_MODEL_TENSOR, "tensor %s has unusable type %d",
                             name, ti.type);
    }
    *out = v;
    return 0;
}

/* Rows [r0, r0 + rows) of a loaded matrix, as a matrix of its own (the rows of a
 * fused tensor: phi3's attn_qkv = q | k | v, its ffn_up = gate | up). */
static mtensor row_range(const mtensor *t, int64_t r0, int64_t rows) {
    return (mtensor){(const char *)t->w + r0 * aotx_type_row_bytes(t->type, t->cols), t->type,
                     rows, t->cols, NULL};
}

/* The rotation frequencies per rope class: base^(-2i/n_rot), divided by the LongRoPE
 * factors when the file has them (phi3: rope_factors_long.weight when the context served,
 * max_tokens, exceeds rope.scaling.original_context_length (default context_length), else
 * rope_factors_short.weight), cos/sin then scaled by rope.scaling.attn_factor (default
 * sqrt(1 + ln(s) / ln(original)), s = context_length / original, 1 when s <= 1). */
static int rope_freqs(aotx_model *m, char *err, int64_t cap) {
    const aotx_model_info *in = &m->info;
    int64_t half = m->n_rot / 2, orig;
    int rc;
    if ((rc = hp_int(m, "rope.scaling.original_context_length", in->ctx_train, 0, &orig, err,
                     cap)))
        return rc;
    int lng = orig > 0 && in->max_tokens > orig;
    float *fac = NULL, *other = NULL;
    if ((rc = get_vector(m, lng ? "rope_factors_long.weight" : "rope_factors_short.weight", half,
                         1, &fac, err, cap)))
        return rc;
    /* a file with only the other set is refused, never run without its factors */
    if (!fac && (rc = get_vector(m, lng ? "rope_factors_short.weight" : "rope_factors_long.weight",
                                 half, 1, &other, err, cap)))
        return rc;
    if (other) {
        free(other);
        return model_set_err(err, cap, AOTX_E_MODEL_TENSOR, "tensor %s is missing",
                             lng ? "rope_factors_long.weight" : "rope_factors_short.weight");
    }
    double s = orig > 0 ? (double)in->ctx_train / (double)orig : 1.0, mscale;
    double dflt = s > 1.0 && orig > 1 ? sqrt(1.0 + log(s) / log((double)orig)) : 1.0;
    if ((rc = hp_float(m, "rope.scaling.attn_factor", dflt, &mscale, err, cap))) goto out;
    m->rope_mscale = fac ? (float)mscale : 1.0f;
    for (int64_t i = 0; fac && i < half; i++)
        if (!(fac[i] > 0)) {
            rc = model_set_err(err, cap, AOTX_E_MODEL_TENSOR, "rope factor %lld is %g; must be "
                               "positive", (long long)i, (double)fac[i]);
            goto out;
        }
    m->inv_freq = malloc(sizeof(float) * (size_t)(2 * half));
    if (!m->inv_freq) { rc = AOTX_E_NOMEM; goto out; }
    for (int c = 0; c < 2; c++) {
        double b = m->rope_base[c];
        for (int64_t i = 0; i < half; i++)
            m->inv_freq[c * half + i] = (float)(pow(b, -2.0 * (double)i / (double)m->n_rot) /
                                                (fac ? (double)fac[i] : 1.0));
    }
out:
    free(fac);
    return rc;
}

static int load_layer(aotx_model *m, int32_t l, char *err, int64_t cap) {
    const aotx_model_info *in = &m->info;
    mlayer *ly = &m->layers[l];
    int64_t d = in->d_model, qd = (int64_t)in->n_heads * in->head_dim;
    int64_t kd = (int64_t)in->n_kv_heads * in->head_dim, vd = (int64_t)in->n_kv_heads * in->v_dim;
    int64_t od = (int64_t)in->n_heads * in->v_dim;
    int gem = in->arch == AOTX_ARCH_GEMMA3, gem2 = in->arch == AOTX_ARCH_GEMMA2;
    char nm[96];
    int rc;
#define MAT(field, suffix, rows, cols)                                            \
    snprintf(nm, sizeof nm, "blk.%d." suffix ".weight", l);                       \
    if ((rc = get_matrix(m, nm, rows, cols, 0, &ly->field, err, cap))) return rc;
#define VEC(field, suffix, n, opt)                                                \
    snprintf(nm, sizeof nm, "blk.%d." suffix, l);                                 \
    if ((rc = get_vector(m, nm, n, opt, &ly->field, err, cap))) return rc;
    mtensor fused;
    snprintf(nm, sizeof nm, "blk.%d.attn_qkv.weight", l);
    if ((rc = get_matrix(m, nm, qd + kd + vd, d, 1, &fused, err, cap))) return rc;
    if (fused.w) {
        ly->q = row_range(&fused, 0, qd);
        ly->k = row_range(&fused, qd, kd);
        ly->v = row_range(&fused, qd + kd, vd);
    } else {
        MAT(q, "attn_q", qd, d);
        MAT(k, "attn_k", kd, d);
        MAT(v, "attn_v", vd, d);
    }
    MAT(o, "attn_output", d, od);
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate.weight", l);   /* optional for phi3 only */
    if ((rc = get_matrix(m, nm, in->d_ff, d, in->arch == AOTX_ARCH_PHI3, &ly->gate, err, cap)))
        return rc;
    if (ly->gate.w) {
        MAT(up, "ffn_up", in->d_ff, d);
    } else {   /* phi3 without ffn_gate: ffn_up holds gate then up (2 * d_ff rows) */
        MAT(up, "ffn_up", 2 * (int64_t)in->d_ff, d);
        ly->gate = row_range(&ly->up, 0, in->d_ff);
        ly->up = row_range(&ly->up, in->d_ff, in->d_ff);
    }
    MAT(down, "ffn_down", d, in->d_ff);
    VEC(attn_norm, "attn_norm.weight", d, 0);
    VEC(ffn_norm, "ffn_norm.weight", d, 0);
    if (gem || gem2) {
        VEC(post_attn_norm, "post_attention_norm.weight", d, 0);
        VEC(post_ffn_norm, "post_ffw_norm.weight", d, 0);
    }
    if (gem || in->arch == AOTX_ARCH_QWEN3) {   /* per-head RMSNorm on q and k before RoPE */
        VEC(q_norm, "attn_q_norm.weight", in->head_dim, 0);
        VEC(k_norm, "attn_k_norm.weight", in->head_dim, 0);
    }
    VEC(bq, "attn_q.bias", qd, 1);
    VEC(bk, "attn_k.bias", kd, 1);
    VEC(bv, "attn_v.bias", vd, 1);
#undef MAT
#undef VEC
    /* gemma3: five sliding layers then a global one; gemma2: alternating, from layer 0 */
    ly->sliding = in->window > 0 && ((gem && (l + 1) % 6 != 0) || (gem2 && l % 2 == 0) ||
                                     in->arch == AOTX_ARCH_PHI3);   /* phi3: every layer */
    ly->rope_class = gem && (l + 1) % 6 != 0 ? 1 : 0;
    return 0;
}

int model_load_weights(aotx_model *m, char *err, int64_t cap) {
    int rc;
    aotx_model_info *in = &m->info;
    if ((rc = get_matrix(m, "token_embd.weight", 0, in->d_model, 0, &m->tok_embd, err, cap)))
        return rc;
    if (m->tok_embd.rows > INT32_MAX / 4)   /* n_vocab is 32-bit: refuse, never truncate */
        return model_set_err(err, cap, AOTX_E_MODEL_TENSOR,
                             "tensor token_embd.weight has %lld rows; at most %d are supported",
                             (long long)m->tok_embd.rows, INT32_MAX / 4);
    in->n_vocab = (int32_t)m->tok_embd.rows;
    if ((rc = get_matrix(m, "output.weight", in->n_vocab, in->d_model, 1, &m->output, err, cap)))
        return rc;
    if (!m->output.w) m->output = m->tok_embd;   /* tied */
    if ((rc = get_vector(m, "output_norm.weight", in->d_model, 0, &m->out_norm, err, cap)))
        return rc;
    if ((rc = rope_freqs(m, err, cap))) return rc;
    m->layers = calloc((size_t)in->n_layers, sizeof(mlayer));
    if (!m->layers) return AOTX_E_NOMEM;
    for (int32_t l = 0; l < in->n_layers; l++)
        if ((rc = load_layer(m, l, err, cap))) return rc;
    /* every matmul weight, the head first: what the backend prepares at init and reserves for */
    m->n_weights = 1 + 7 * in->n_layers;
    m->weights = malloc(sizeof(mtensor *) * (size_t)m->n_weights);
    if (!m->weights) return AOTX_E_NOMEM;
    m->weights[0] = &m->output;
    for (int32_t l = 0; l < in->n_layers; l++) {
        mlayer *ly = &m->layers[l];
        mtensor *ts[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
        memcpy(m->weights + 1 + 7 * l, ts, sizeof ts);
    }
    return 0;
}

void model_free_weights(aotx_model *m) {
    if (m->layers) {
        for (int32_t l = 0; l < m->info.n_layers; l++) {
            mlayer *ly = &m->layers[l];
            free(ly->attn_norm); free(ly->ffn_norm); free(ly->post_attn_norm);
            free(ly->post_ffn_norm); free(ly->q_norm); free(ly->k_norm);
            free(ly->bq); free(ly->bk); free(ly->bv);
        }
        free(m->layers);
    }
    free(m->out_norm);
    free(m->inv_freq);
    free(m->weights);
}

static int32_t tok_id(const aotx_gguf *g, const char *key) {
    int64_t v, i = aotx_gguf_find_key(g, key);
    if (i < 0 || aotx_gguf_get_int(g, i, &v) || v < 0 || v > INT32_MAX) return -1;
    return (int32_t)v;
}

static int32_t tok_flag(const aotx_gguf *g, const char *key, int32_t dflt) {
    int64_t v, i = aotx_gguf_find_key(g, key);
    if (i < 0 || aotx_gguf_get_int(g, i, &v)) return dflt;
    return v != 0;
}

static int32_t find_piece(const aotx_gguf *g, int64_t ti, uint64_t n, const char *piece) {
    size_t pl = strlen(piece);
    for (uint64_t j = 0; j < n; j++) {
        const char *s;
        uint64_t len;
        if (!aotx_gguf_arr_str(g, ti, j, &s, &len) && len == pl && !memcmp(s, piece, pl))
            return (int32_t)j;
    }
    return -1;
}

/* A byte-level BPE ("gpt2") tokenizer: tokenizer.ggml.pre and .merges passed through. */
static int model_load_bpe(aotx_model *m, const aotx_tokenizer_params *tp, int32_t n,
                          const char **ptrs, const int32_t *lens, const int32_t *types, char *err,
                          int64_t cap) {
    const aotx_gguf *g = m->g;
    const char *pre_name = NULL;
    uint64_t pn = 0;
    int64_t pi = aotx_gguf_find_key(g, "tokenizer.ggml.pre");
    if (pi >= 0 && aotx_gguf_get_str(g, pi, &pre_name, &pn))
        return model_set_err(err, cap, AOTX_E_MODEL_VOCAB, "tokenizer.ggml.pre is not a string");
    int32_t pre;
    if (aotx_tokenizer_pre_parse(pre_name, (int64_t)pn, &pre))
        return model_set_err(err, cap, AOTX_E_TOKENIZER_PRE,
                             "tokenizer.ggml.pre = \"%.*s\" is not supported "
                             "(default, gpt2, llama-bpe, llama3, qwen2, smollm)",
                             (int)(pn > 64 ? 64 : pn), pre_name);
    int32_t et;
    uint64_t nm = 0;
    int64_t mi = aotx_gguf_find_key(g, "tokenizer.ggml.merges");
    if (mi >= 0 && (aotx_gguf_arr_info(g, mi, &et, &nm) || et != AOTX_GGUF_STRING || nm > INT32_MAX))
        return model_set_err(err, cap, AOTX_E_MODEL_VOCAB, "tokenizer.ggml.merges is not a string array");
    const char **mp = malloc(sizeof(char *) * (nm ? nm : 1));
    int32_t *ml = malloc(sizeof(int32_t) * (nm ? nm : 1));
    int rc = (!mp || !ml) ? AOTX_E_NOMEM : 0;
    for (uint64_t j = 0; !rc && j < nm; j++) {
        uint64_t len;
        if (aotx_gguf_arr_str(g, mi, j, &mp[j], &len) || len > INT32_MAX / 2)
            rc = model_set_err(err, cap, AOTX_E_MODEL_VOCAB, "tokenizer.ggml.merges[%llu] unreadable",
                               (unsigned long long)j);
        else ml[j] = (int32_t)len;
    }
    if (!rc) {
        rc = aotx_tokenizer_new_bpe(tp, pre, n, ptrs, lens, types, (int32_t)nm, mp, ml, &m->tok);
        if (rc && rc != AOTX_E_NOMEM)
            rc = model_set_err(err, cap, AOTX_E_MODEL_VOCAB,
                               "the GGUF byte-level vocabulary does not build a tokenizer (%s)",
                               aotx_code_name(rc));
    }
    free(mp); free(ml);
    return rc;
}

int model_load_tokenizer(aotx_model *m, char *err, int64_t cap) {
    const aotx_gguf *g = m->g;
    int32_t et;
    uint64_t n;
    int64_t ti = aotx_gguf_find_key(g, "tokenizer.ggml.tokens");
    m->info.bos_id = tok_id(g, "tokenizer.ggml.bos_token_id");
    m->info.eos_id = tok_id(g, "tokenizer.ggml.eos_token_id");
    m->info.eot_id = -1;
    if (ti < 0) return 0;   /* no vocabulary: the model runs on token ids only */
    if (aotx_gguf_arr_info(g, ti, &et, &n) || et != AOTX_GGUF_STRING || n == 0 || n > INT32_MAX)
        return model_set_err(err, cap, AOTX_E_MODEL_VOCAB, "tokenizer.ggml.tokens is not a string array");
    int64_t si = aotx_gguf_find_key(g, "tokenizer.ggml.scores");
    int64_t yi = aotx_gguf_find_key(g, "tokenizer.ggml.token_type");
    const char **ptrs = malloc(sizeof(char *) * n);
    int32_t *lens = malloc(sizeof(int32_t) * n);
    float *scores = si >= 0 ? malloc(sizeof(float) * n) : NULL;
    int32_t *types = yi >= 0 ? malloc(sizeof(int32_t) * n) : NULL;
    int rc = 0;
    if (!ptrs || !lens || (si >= 0 && !scores) || (yi >= 0 && !types)) { rc = AOTX_E_NOMEM; goto out; }
    for (uint64_t j = 0; j < n; j++) {
        uint64_t len;
        aotx_gguf_arr_str(g, ti, j, &ptrs[j], &len);
        if (len > INT32_MAX) { rc = AOTX_E_MODEL_VOCAB; goto out; }
        lens[j] = (int32_t)len;
        double f = 0;
        int64_t t = 1;
        if (scores && aotx_gguf_arr_float(g, si, j, &f)) {
            rc = model_set_err(err, cap, AOTX_E_MODEL_VOCAB, "tokenizer.ggml.scores[%llu] unreadable",
                               (unsigned long long)j);
            goto out;
        }
        if (types && aotx_gguf_arr_int(g, yi, j, &t)) {
            rc = model_set_err(err, cap, AOTX_E_MODEL_VOCAB,
                               "tokenizer.ggml.token_type[%llu] unreadable", (unsigned long long)j);
            goto out;
        }
        if (scores) scores[j] = (float)f;
        if (types) types[j] = (int32_t)t;
    }
    const char *model_name = NULL;
    uint64_t mn = 0;
    int64_t mi = aotx_gguf_find_key(g, "tokenizer.ggml.model");
    if (mi >= 0) aotx_gguf_get_str(g, mi, &model_name, &mn);
    int32_t kind;
    if (aotx_tokenizer_model_parse(model_name, (int64_t)mn, &kind)) {
        rc = model_set_err(err, cap, AOTX_E_TOKENIZER_MODEL,
                           "tokenizer.ggml.model = \"%.*s\" is not supported (llama, gpt2)",
                           (int)(mn > 64 ? 64 : mn), model_name);
        goto out;
    }
    int spm = kind == AOTX_TOK_MODEL_SPM;
    aotx_tokenizer_params tp = {
        .bos_id = m->info.bos_id, .eos_id = m->info.eos_id,
        .unk_id = tok_id(g, "tokenizer.ggml.unknown_token_id"),
        .pad_id = tok_id(g, "tokenizer.ggml.padding_token_id"),
        .add_bos = tok_flag(g, "tokenizer.ggml.add_bos_token", 1),
        .add_space_prefix = tok_flag(g, "tokenizer.ggml.add_space_prefix", spm),
    };
    if (!spm) {
        rc = model_load_bpe(m, &tp, (int32_t)n, ptrs, lens, types, err, cap);
        if (rc) goto out;
    }
    if (spm) rc = aotx_tokenizer_new(&tp, (int32_t)n, ptrs, lens, scores, types, &m->tok);
    if (rc) {
        rc = model_set_err(err, cap, AOTX_E_MODEL_VOCAB,
                           "the GGUF vocabulary does not build a tokenizer (%s)",
                           aotx_code_name(rc));
        goto out;
    }
    m->info.has_tokenizer = 1;
    static const char *eot_names[] = {"<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>"};
    m->info.eot_id = -1;
    for (int k = 0; k < 4 && m->info.eot_id < 0; k++)
        m->info.eot_id = find_piece(g, ti, n, eot_names[k]);
out:
    free(ptrs); free(lens); free(scores); free(types);
    return rc;
}

static void *alloc_f(int64_t n) {
    return aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
}

int model_alloc_scratch(aotx_model *m) {
    const aotx_model_info *in = &m->info;
    int64_t T = in->max_batch_tokens, d = in->d_model;
    int64_t maxs = in->max_seqs > T ? in->max_seqs : T;
    m->x = alloc_f(T * d);
    m->xn = alloc_f(maxs * d);
    m->q = alloc_f(T * in->n_heads * in->head_dim);
    m->k = alloc_f(T * in->n_kv_heads * in->head_dim);
    m->v = alloc_f(T * in->n_kv_heads * in->v_dim);
    m->att = alloc_f(T * in->n_heads * in->v_dim);
    m->o = alloc_f(T * d);
    m->gate = alloc_f(T * in->d_ff);
    m->up = alloc_f(T * in->d_ff);
    m->rope_cs = alloc_f(T * 2 * m->n_rot);
    m->tok_pos = malloc(sizeof(int32_t) * (size_t)T);
    m->tok_seq = malloc(sizeof(uint32_t) * (size_t)T);
    m->logit_tok = malloc(sizeof(int32_t) * (size_t)in->max_seqs);
    m->old_len = malloc(sizeof(int32_t) * (size_t)in->max_seqs);
    m->seen = calloc((size_t)in->max_seqs, 1);
    if (!m->x || !m->xn || !m->q || !m->k || !m->v || !m->att || !m->o || !m->gate || !m->up ||
        !m->rope_cs || !m->tok_pos || !m->tok_seq || !m->logit_tok || !m->old_len || !m->seen)
        return AOTX_E_NOMEM;
    /* the backend sizes its scratch for every weight at the most tokens it will see */
    for (int32_t a = 0; a < m->n_weights; a++) {
        int rc = m->be_ops->reserve(m->be, m->weights[a]->type, m->weights[a]->cols, maxs);
        if (rc) return rc;
    }
    return 0;
}
