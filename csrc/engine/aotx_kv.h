/* aotx_kv.h -- the paged KV pool: page ACCOUNTING only.
 *
 * The pool owns page ids, refcounts, reservations and page tables; it holds no
 * K/V memory.  The storage (n_pages x page_bytes) belongs to the compute
 * backend (aotx.h, aotx_backend_ops.kv_alloc_pages), so a device backend can
 * keep it in device memory while the accounting stays here on the host.
 *
 * A page holds K and V (float32, or IEEE binary16 with kv_f16) of page_tokens
 * consecutive positions for one
 * *layer group*: layers are split into groups of equal size g (g divides both
 * the number of sliding-window layers and of global layers), each group all
 * sliding or all global.  Every page has the same size, so one free list
 * serves all groups.  A sequence has one page table per group; pages of
 * sliding groups that fall entirely out of the window are released as the
 * sequence grows, pages of global groups stay.  Pages are refcounted so a
 * fork shares the full pages of a prefix.  Page layout, for the group's
 * layers lg = 0..g-1:
 *   K: [g][page_tokens][n_kv_heads][k_dim]  then  V: [g][page_tokens][n_kv_heads][v_dim]
 * (page_bytes in aotx_kv_stats is the storage one page needs.)  All accounting
 * memory is allocated at aotx_kv_new; nothing allocates afterwards.
 */
#ifndef AOTX_KV_H
#define AOTX_KV_H

#include "aotx.h"

/* CDEF-BEGIN */
enum {
    AOTX_R_KV_PAGES_EXHAUSTED = 501,   /* no free (unreserved) page left: retry later */
    AOTX_R_KV_SEQS_EXHAUSTED = 502,    /* every sequence slot is in use */
    AOTX_R_KV_PREFIX_RELEASED = 503,   /* fork source no longer holds the needed window pages */
    AOTX_E_KV_SEQ = -501,              /* sequence id unknown or not in use */
    AOTX_E_KV_CONTEXT = -502,          /* the sequence would exceed max_tokens per sequence */
    AOTX_E_KV_PARAMS = -503            /* pool parameters malformed (named in the message) */
};

typedef struct aotx_kv_pool aotx_kv_pool;

typedef struct aotx_kv_params {
    int32_t n_pages;          /* pages allocated at creation */
    int32_t page_tokens;      /* positions per page (the model default: 8) */
    int32_t max_seqs;         /* sequence slots */
    int32_t max_tokens;       /* positions per sequence (context length) */
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t k_dim, v_dim;     /* per head */
    int32_t window;           /* sliding window in positions (0 = none) */
    const uint8_t *sliding;   /* [n_layers] 1 = sliding-window layer; NULL = none */
    int32_t kv_f16;           /* 1 = K/V elements stored as binary16 (2 bytes), 0 = float32 */
} aotx_kv_params;

typedef struct aotx_kv_stats {
    int32_t n_pages, free_pages, reserved_pages, used_pages, shared_pages;
    int32_t n_seqs, page_tokens, n_groups, layers_per_group;
    int64_t page_bytes;
    int64_t tokens_held;       /* sum of sequence lengths */
    int64_t slots_held;        /* page slots in use x page_tokens (counted once per page) */
    int64_t slots_live;        /* of those, positions a layer may still read */
    int32_t elem_bytes;        /* 4 (float32 K/V) or 2 (binary16, kv_f16) */
} aotx_kv_stats;

typedef struct aotx_kv_seq_info {
    int32_t length;            /* positions stored */
    int32_t pages;             /* page-table entries held (a shared page counts in each) */
    int32_t reserved;          /* pages reserved for this sequence */
    int32_t released;          /* sliding-group pages already released */
} aotx_kv_seq_info;

int aotx_kv_new(const aotx_kv_params *p, aotx_kv_pool **out);
void aotx_kv_free(aotx_kv_pool *kv);
void aotx_kv_stats_get(const aotx_kv_pool *kv, aotx_kv_stats *out);
/* Pages a sequence of `length` positions would need to grow by n positions. */
int32_t aotx_kv_pages_needed(const aotx_kv_pool *kv, int32_t length, int32_t n);

int aotx_kv_seq_new(aotx_kv_pool *kv, uint32_t *seq);
int aotx_kv_seq_free(aotx_kv_pool *kv, uint32_t seq);
int aotx_kv_seq_info_get(const aotx_kv_pool *kv, uint32_t seq, aotx_kv_seq_info *out);
/* Reserve pages so that the sequence can later grow by n positions without
 * refusal (conservative admission); reservations count as not free. */
int aotx_kv_seq_reserve(aotx_kv_pool *kv, uint32_t seq, int32_t n);
/* Make room for n more positions (uses the reservation first). */
int aotx_kv_seq_grow(aotx_kv_pool *kv, uint32_t seq, int32_t n);
/* Undo an uncommitted grow of n positions (frees the pages it added). */
int aotx_kv_seq_shrink(aotx_kv_pool *kv, uint32_t seq, int32_t n);
/* Release sliding-group pages no future position can see (call after a step). */
int aotx_kv_seq_trim(aotx_kv_pool *kv, uint32_t seq);
/* New sequence sharing src's first n_tokens positions, rounded down to whole
 * pages; *shared = positions shared (the caller recomputes the rest). */
int aotx_kv_seq_fork(aotx_kv_pool *kv, uint32_t src, int32_t n_tokens, uint32_t *dst,
                     int32_t *shared);
/* Where the K (or V when v = 1) row of (seq, layer, pos, head) lives in the
 * storage: *page (index into the backend's pages) and *offset (elements into
 * that page; the row is k_dim or v_dim elements of elem_bytes each).  AOTX_E_INVALID_ARGUMENT for
 * a position not held (out of range or in a released window page). */
int aotx_kv_locate(const aotx_kv_pool *kv, uint32_t seq, int32_t layer, int32_t pos, int32_t head,
                   int v, int32_t *page, int64_t *offset);

/* Binary16 K/V (kv_f16.c): float -> half rounds to nearest even (overflow -> inf),
 * half -> float is exact; the same bits on every path.  aotx_kv_f16_impl() names the
 * path the attention over half pages runs: "f16c" (AVX2 + FMA + F16C) or "ref"
 * (AOTX_KERNELS=ref, or no F16C); aotx_kv_f16_force("ref" | "f16c" | "auto") re-picks
 * it (tests and benchmarks, not while a step runs; AOTX_E_UNSUPPORTED without F16C). */
void aotx_kv_f16_store(uint16_t *dst, const float *src, int64_t n);
void aotx_kv_f16_load(float *dst, const uint16_t *src, int64_t n);
const char *aotx_kv_f16_impl(void);
int aotx_kv_f16_force(const char *impl);
/* CDEF-END */

/* For the decoder (C only). */
int32_t aotx_kv_page_tokens(const aotx_kv_pool *kv);
/* The page-table row of (seq, layer) (entries -1 when released) and the K/V
 * offsets inside a page, so a backend's attention can walk its storage without
 * a call per position: position s of head h is at page table[s / page_tokens],
 * element k_off + (s % page_tokens) * k_tok + h * k_dim (V: v_off, v_tok, v_dim),
 * elements of elem_bytes (4: float, 2: binary16). */
typedef struct aotx_kv_view {
    const int32_t *table;     /* [max_pages_per_seq] page index or -1 */
    int64_t page_floats;      /* elements per page of storage */
    int64_t k_off, v_off;     /* offset of this layer's K/V inside a page */
    int64_t k_tok, v_tok;     /* elements per position (n_kv_heads * dim) */
    int32_t page_tokens;
    int32_t elem_bytes;       /* 4 or 2 (kv_f16) */
} aotx_kv_view;
int aotx_kv_view_get(const aotx_kv_pool *kv, uint32_t seq, int32_t layer, aotx_kv_view *out);

#endif
