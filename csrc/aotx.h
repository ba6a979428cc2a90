/* aotx.h -- the public header of the aotx native library.
 *
 * Conventions (DESIGN.md, "The native boundary"):
 *   - every public symbol has the aotx_ prefix; handles are opaque;
 *   - every call that can fail returns an int: 0 ok, >0 a recoverable refusal
 *     (the caller may retry later or pick another path), <0 an error; a failed
 *     call leaves the state it was given unchanged;
 *   - codes are grouped by area in hundreds: 1..99 common, 1xx device state,
 *     2xx journal, 3xx runtime file, 4xx model/gguf, 5xx KV pool,
 *     6xx tokenizer, 7xx embeddings, 8xx kernels, 9xx CUDA.  aotx_code_name() gives
 *     the snake_case name Python and HTTP use, aotx_strerror() a sentence;
 *   - buffers are owned by the caller; a function that fills a buffer returns
 *     the number of bytes written, or minus the size needed when the buffer
 *     is too small (and writes nothing);
 *   - no exit(), no allocation on the decode path.
 *
 * Each area declares its API in csrc/<area>/aotx_<name>.h; this file holds what is
 * common.  The text between CDEF-BEGIN and CDEF-END is what cffi sees.
 */
#ifndef AOTX_H
#define AOTX_H

#include <stddef.h>
#include <stdint.h>

#ifndef AOTX_MAX_PARTICIPANTS
#define AOTX_MAX_PARTICIPANTS 1024
#endif
#ifndef AOTX_MAX_SPACES
#define AOTX_MAX_SPACES 1024
#endif
#ifndef AOTX_MAX_CONVERSATIONS
#define AOTX_MAX_CONVERSATIONS 4096
#endif
#ifndef AOTX_MAX_MEMBERS
#define AOTX_MAX_MEMBERS 4096
#endif
#ifndef AOTX_MAX_RECEIPTS
#define AOTX_MAX_RECEIPTS 1024
#endif
#ifndef AOTX_MAX_MEMORY
#define AOTX_MAX_MEMORY 4096
#endif
#ifndef AOTX_MAX_COMMAND_BYTES
#define AOTX_MAX_COMMAND_BYTES 8192
#endif
#ifndef AOTX_MAX_RESULT_BYTES
#define AOTX_MAX_RESULT_BYTES 65536
#endif

/* CDEF-BEGIN */
enum {
    AOTX_OK = 0,
    /* common refusals (>0) */
    AOTX_R_BUSY = 1,
    /* common errors (<0) */
    AOTX_E_NOMEM = -1,
    AOTX_E_INVALID_ARGUMENT = -2,
    AOTX_E_IO = -3,
    AOTX_E_INTERNAL = -4,
    AOTX_E_UNSUPPORTED = -5,
    AOTX_E_BUFFER_TOO_SMALL = -6
};

typedef struct aotx_capacities {
    uint32_t participants;
    uint32_t spaces;
    uint32_t conversations;
    uint32_t members;
    uint32_t receipts;
    uint32_t command_bytes;   /* canonical command bytes per receipt */
    uint32_t result_bytes;    /* result bytes per receipt */
    uint32_t memory;          /* memory rows (a retained input takes two: text + embedding) */
} aotx_capacities;

/* The library version, "MAJOR.MINOR.PATCH". */
const char *aotx_version(void);
/* The capacities this library was built with (build.py, AOTX_MAX_*). */
void aotx_capacities_get(aotx_capacities *out);
/* snake_case name of a code ("ok", "receipt_table_full", ...); never NULL. */
const char *aotx_code_name(int code);
/* One sentence describing a code; never NULL. */
const char *aotx_strerror(int code);
/* CPU features the kernels may use, detected at run time: bit 0 AVX2+FMA,
 * bit 1 AVX-512F/BW/VL, bit 2 AVX-512 VNNI, bit 3 AVX-VNNI, bit 4 F16C, bit 5 AVX-512F.
 * The one probe: every kernel family picks its level from these bits. */
uint32_t aotx_cpu_features(void);
/* CDEF-END */

/* Per-area code tables: each area's .c defines these for its hundred; common.c
 * declares them weak so a partial development build (build.py --only) links. */
typedef struct aotx_code_entry {
    int code;
    const char *name;
    const char *message;
} aotx_code_entry;

#ifdef __cplusplus   /* the CUDA sources (csrc/cuda, .cu) include the headers as C++ */
#define AOTX_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define AOTX_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* ==== engine: the compute backend seam (C only, not part of the cffi surface) ====
 *
 * The decoder (model*.c) reaches kernels and KV storage only through one table
 * of operations, aotx_backend_ops, picked by name at aotx_model_load
 * (aotx_model_params.backend; "cpu", csrc/engine/backend/backend_cpu.c, is the only one
 * today).  Page ACCOUNTING (which page belongs to which sequence, refcounts,
 * reservations, the budget, prefix sharing, sliding-window release) stays on
 * the host in kv.c (aotx_kv_pool); page STORAGE (the memory holding K and V)
 * belongs to the backend (aotx_kv_store), addressed by page index and by the
 * offsets aotx_kv_view_get() gives.  Element-wise work (norms, RoPE, GLU,
 * embedding lookup) still runs in the decoder on host memory; it joins the
 * table when a backend whose memory is not the host's needs it (docs/engine.md).
 *
 * Shapes: [a][b] is row-major, b contiguous; strides (ld*) are in elements.
 * Every op returns when its results are in place (no asynchronous queue yet).
 * No op allocates except init (scratch, prepared weights), reserve and kv_alloc_pages.
 */
struct aotx_pool;
struct aotx_kv_pool;
typedef struct aotx_backend aotx_backend;     /* one backend instance (opaque to the decoder) */
typedef struct aotx_kv_store aotx_kv_store;   /* KV page storage owned by a backend */

typedef struct aotx_weight {     /* a weight matrix as the GGUF stores it */
    const void *w;               /* [rows][row_bytes] in `type` blocks (the file mapping) */
    int32_t type;                /* AOTX_T_* */
    int64_t rows, cols;
    const void *packed;          /* NULL, or its aotx_pack copy (made and owned by the backend) */
} aotx_weight;

typedef struct aotx_backend_params {
    struct aotx_pool *pool;      /* host thread pool the backend may run sections on (borrowed) */
    int32_t max_batch_tokens;    /* tokens per matmul / attention / kv_write call, at most */
    int32_t max_ctx;             /* positions one attention query may span, at most */
    /* The weights matmul will see, for init to prepare its own form of (the CPU backend:
     * re-blocked copies, `packed`, kept until free; which ones is the backend's own
     * configuration).  The list is read during init only; NULL / 0: nothing to prepare. */
    aotx_weight *head;           /* the output projection */
    aotx_weight *const *body;    /* [n_body] the layers' projections, in layer order */
    int32_t n_body;
    /* > 0: dense_attention will run with heads this wide over sequences of up to max_ctx
     * tokens (init sizes its scratch); 0: the backend is never asked for dense_attention. */
    int32_t dense_head_dim;
} aotx_backend_params;

typedef struct aotx_mm_out {     /* one product y = W x of a matmul call */
    const aotx_weight *w;
    float *y;                    /* [n_tok][ldy]; columns [0, w->rows) written */
    int64_t ldy;
} aotx_mm_out;

typedef struct aotx_kv_rows {    /* K/V rows of a batch to store (one layer) */
    int32_t T, layer;
    const uint32_t *seq;         /* [T] KV sequence of each token */
    const int32_t *pos;          /* [T] position of each token (already grown in the pool) */
    const float *k;              /* [T][ldk], first n_kv_heads * k_dim used */
    const float *v;              /* [T][ldv], first n_kv_heads * v_dim used */
    int64_t ldk, ldv;
} aotx_kv_rows;

typedef struct aotx_attn_batch { /* causal attention of T query tokens over their pages (one layer) */
    int32_t T, layer;
    const uint32_t *seq;         /* [T] KV sequence of each token; a sequence's tokens are
                                    consecutive and in position order */
    const int32_t *pos;          /* [T] position of each token; it sees keys lo..pos */
    int32_t n_heads, n_kv_heads, head_dim, v_dim;   /* head h reads kv head h / (n_heads / n_kv_heads) */
    int32_t window;              /* > 0: lo = pos - window + 1 (sliding layer); 0: lo = 0 */
    float scale;                 /* score = scale * dot(q, k) */
    float softcap;               /* > 0: score = softcap * tanh(score / softcap); 0: none */
    const float *q;              /* [T][n_heads][head_dim] */
    float *out;                  /* [T][n_heads][v_dim] = softmax(scores) . V */
} aotx_attn_batch;

typedef struct aotx_dense_attn { /* attention of every token over its own sequence's tokens, in
                                    both directions, no KV pages (encoders: BERT) */
    int32_t n_seq;
    const int32_t *seq_off;      /* [n_seq + 1] sequence s is tokens seq_off[s] .. seq_off[s+1]-1,
                                    at most max_ctx of them */
    int32_t n_heads, head_dim;   /* head h is columns h*head_dim .. (h+1)*head_dim-1 of each row;
                                    head_dim is the params' dense_head_dim */
    float scale;                 /* p = softmax(scale * q . k) */
    const float *q, *k, *v;      /* [T][ld] */
    float *out;                  /* [T][ld] = p . V, per head */
    int64_t ld;
} aotx_dense_attn;

typedef struct aotx_backend_ops {
    const char *name;            /* "cpu" */
    int (*init)(const aotx_backend_params *p, aotx_backend **out);
    void (*free)(aotx_backend *be);
    /* Size scratch so that matmul over weights of (type, cols) on up to n_tok
     * tokens needs no allocation; call at load for every weight. */
    int (*reserve)(aotx_backend *be, int32_t type, int64_t cols, int64_t n_tok);

    /* KV storage: n_pages pages of page_bytes each, indexed 0..n_pages-1 by the
     * accounting pool (which owns the page ids); freed with kv_free_pages. */
    int (*kv_alloc_pages)(aotx_backend *be, int32_t n_pages, int64_t page_bytes,
                          aotx_kv_store **out);
    void (*kv_free_pages)(aotx_backend *be, aotx_kv_store *st);
    /* Host address of a page (float[page_bytes / 4]), or NULL when the storage is
     * not host-visible; for tests and tools, never on the step path. */
    float *(*kv_page_ptr)(aotx_kv_store *st, int32_t page);

    /* Y_i[t][r] = W_i[r, :] . X[t, :] for n (1..3) weights sharing the input
     * X[n_tok][ldx] (cols = out[0].w->cols for all). */
    void (*matmul)(aotx_backend *be, const float *x, int64_t ldx, int64_t n_tok, int n,
                   const aotx_mm_out *out);
    /* Store a batch's K/V rows in the pages kv assigns to (seq, layer, pos). */
    void (*kv_write)(aotx_backend *be, const struct aotx_kv_pool *kv, aotx_kv_store *st,
                     const aotx_kv_rows *rows);
    /* Attention for a batch, keys/values read through kv's page tables. */
    void (*attention)(aotx_backend *be, const struct aotx_kv_pool *kv, const aotx_kv_store *st,
                      const aotx_attn_batch *b);
    /* Dense attention of packed sequences (aotx_dense_attn), without KV pages. */
    void (*dense_attention)(aotx_backend *be, const aotx_dense_attn *b);
} aotx_backend_ops;

/* The backends this library carries (backend_cpu.c, ...). */
extern const aotx_backend_ops aotx_backend_cpu;

#endif /* AOTX_H */
