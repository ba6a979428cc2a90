/* aotx_cuda.h -- the CUDA area: what every build carries (plain C, csrc/cuda/cuda_host.c).
 *
 * The CUDA kernels (the .cu files of csrc/cuda) are compiled by nvcc only when build.py finds one
 * (PATH or CUDA_HOME; AOTX_CUDA=0 turns it off, AOTX_CUDA=1 makes a missing nvcc an
 * error); their calls are declared in aotx_cuda_gpu.h, which cffi sees only in a build
 * that has them.  This header is the host side that needs no GPU and is tested on every
 * machine: the build report, the CUDA error mapping, the page-table mirror a decode
 * batch copies to the device, the CUDA-graph batch-size buckets, the buffer plan for a
 * model and a KV pool in a device's free memory, and the activation layout the device
 * quantizers write.  docs/engine.md, "CUDA".
 */
#ifndef AOTX_CUDA_H
#define AOTX_CUDA_H

#include "aotx.h"
#include "aotx_kv.h"

/* CDEF-BEGIN */
enum {
    AOTX_E_CUDA = -901,              /* a CUDA runtime call failed (the call and CUDA's name
                                        for the error in aotx_cuda_last_error) */
    AOTX_E_CUDA_OOM = -902,          /* device memory exhausted */
    AOTX_E_CUDA_NO_DEVICE = -903,    /* no CUDA device (or the device asked for does not exist) */
    AOTX_E_CUDA_NOT_BUILT = -904,    /* this library was built without CUDA */
    AOTX_E_CUDA_DRIVER = -905,       /* no usable driver (missing, or older than the runtime) */
    AOTX_E_CUDA_ARCH = -906,         /* no kernel image for the device (built for other archs) */
    AOTX_E_CUDA_LAUNCH = -907,       /* a launch was refused (configuration, resources) */
    AOTX_E_CUDA_FAULT = -908,        /* a kernel faulted; the device context is lost */
    AOTX_E_CUDA_TOO_LARGE = -909     /* the model and one full sequence's KV do not fit */
};

typedef struct aotx_cuda_build {
    int32_t compiled;          /* 1: the CUDA kernels are in this library */
    int32_t runtime_version;   /* CUDART_VERSION compiled against (13000 = 13.0); 0 without */
    char archs[64];            /* the SM targets compiled, "90" or "80,90"; "" without */
} aotx_cuda_build;

/* 1 when this library was built with the CUDA kernels (aotx_cuda_gpu.h), else 0. */
int aotx_cuda_available(void);
void aotx_cuda_build_info(aotx_cuda_build *out);

/* Our code for a CUDA runtime error number (cudaError_t as int): 0 for cudaSuccess,
 * else one of AOTX_E_CUDA*.  Plain C on the enum's published values, so it is the same
 * mapping with or without a GPU; the .cu files assert that the values match. */
int aotx_cuda_error_code(int cuda_error);
/* The last CUDA failure of this thread, "cudaMalloc(4096 bytes): cudaErrorMemoryAllocation
 * (out of memory)"; "" when none.  Never NULL. */
const char *aotx_cuda_last_error(void);

/* ---- the page-table mirror: what a decode batch copies to the device per layer group ----
 * For n sequences, each with `len` positions held (its query is position len - 1), one
 * int32 array (one copy) of
 *   [n][4] entries {len, lo, page0, off}: the query sees positions lo .. len - 1
 *          (lo = max(0, len - window) on a sliding layer, else 0); page0 = lo / page_tokens;
 *          its page ids start at off (from the array's start)
 *   then   the page ids: entry i's ids are table[page0 .. ceil(len / page_tokens)) of its
 *          (sequence, group) page table, in order.
 * Position s (lo <= s < len) of entry i lives in page ids[off + s / page_tokens - page0],
 * slot s % page_tokens; its K row of kv head h at element k_off + slot * k_tok + h * k_dim
 * of the page (V: v_off, v_tok, v_dim), elements of elem_bytes.  Every layer of the group
 * shares the ids; only the offsets differ, so one mirror serves the group's layers. */
typedef struct aotx_cuda_kv_layout {
    int64_t page_elems;        /* elements per page */
    int64_t k_off, v_off;      /* this layer's K / V offsets inside a page */
    int64_t k_tok, v_tok;      /* elements per position (n_kv_heads * dim) */
    int32_t page_tokens, elem_bytes;
    int32_t window;            /* the window the mirror was built with (0: none) */
} aotx_cuda_kv_layout;

/* Write the mirror of sequences seqs[n] for `layer` (window: the layer's sliding window,
 * 0 for a global layer, as aotx_attn_batch.window) into out[cap]; *count gets the int32
 * count it takes.  AOTX_E_BUFFER_TOO_SMALL when cap is less (nothing written; out may be
 * NULL to ask), AOTX_E_KV_SEQ, AOTX_E_INVALID_ARGUMENT (an empty sequence, a bad layer or
 * window, a page inside the window already released).  `layout` (may be NULL) gets the
 * layer's offsets. */
int aotx_cuda_pt_build(const aotx_kv_pool *kv, int32_t layer, int32_t window, int32_t n,
                       const uint32_t *seqs, int32_t *out, int64_t cap, int64_t *count,
                       aotx_cuda_kv_layout *layout);

/* ---- CUDA-graph buckets: a decode step of n sequences replays the graph captured for
 * the smallest bucket >= n (the rest of the bucket is padding rows).  The buckets for
 * max_seqs: 1, 2, 4, 8, then every 8 up to 64, then every 32, and max_seqs itself last;
 * at most AOTX_CUDA_MAX_BUCKETS. */
enum { AOTX_CUDA_MAX_BUCKETS = 64 };
/* Writes the buckets ascending into out[cap]; returns their count (or a negative code:
 * max_seqs < 1, or cap too small). */
int32_t aotx_cuda_graph_buckets(int32_t max_seqs, int32_t *out, int32_t cap);
/* Index of the bucket for n sequences (the smallest >= n), or -1 when n exceeds the
 * largest (the step runs uncaptured); AOTX_E_INVALID_ARGUMENT for n < 1. */
int32_t aotx_cuda_graph_bucket(const int32_t *buckets, int32_t n_buckets, int32_t n);

/* ---- the buffer plan for a model on a device ---- */
typedef struct aotx_cuda_dims {
    int32_t d_model, n_heads, n_kv_heads, head_dim, v_dim, d_ff, n_vocab;
    int32_t max_batch_tokens;  /* tokens per step */
    int32_t max_seqs;          /* sequences per step (logit rows, page-table mirror entries) */
    int32_t max_pages_per_seq; /* page-table entries of one sequence in one group */
    int32_t n_groups;          /* KV layer groups (one mirror each) */
} aotx_cuda_dims;

/* Scratch for one step, each buffer 256-byte aligned (the sum of the parts below). */
typedef struct aotx_cuda_scratch {
    int64_t x, xn;             /* residual stream and normed input [T][d_model] float */
    int64_t q, k, v, attn;     /* [T][n_heads*hd], [T][n_kv*hd], [T][n_kv*vd], [T][n_heads*vd] */
    int64_t gate, up;          /* [T][d_ff] float each */
    int64_t act;               /* quantized activations of the widest input (Q8_0 layout
                                  or Q8_K32, the larger) */
    int64_t logits;            /* [max_seqs][n_vocab] float */
    int64_t mirror;            /* n_groups page-table mirrors of max_seqs sequences */
    int64_t tokens;            /* token ids, positions, sequence ids: [T] int32 each */
    int64_t total;
} aotx_cuda_scratch;

int aotx_cuda_scratch_plan(const aotx_cuda_dims *d, aotx_cuda_scratch *out);

typedef struct aotx_cuda_plan_in {
    int64_t free_bytes;        /* device memory free now (cudaMemGetInfo) */
    double fraction;           /* engine.gpu_memory_fraction: share of free_bytes to use, (0, 1] */
    int64_t weight_bytes;      /* the weights as uploaded */
    int64_t scratch_bytes;     /* aotx_cuda_scratch_plan's total */
    int64_t reserve_bytes;     /* kept back for the runtime, graphs and workspaces */
    int64_t page_bytes;        /* one KV page (aotx_kv_stats.page_bytes) */
    int32_t min_pages;         /* pages one full-length sequence needs (all groups) */
    int32_t max_pages;         /* cap on the pool (0 = none) */
} aotx_cuda_plan_in;

typedef struct aotx_cuda_plan {
    int64_t budget;            /* floor(free_bytes * fraction) */
    int64_t needed;            /* weights + scratch + reserve + min_pages pages */
    int64_t kv_bytes;          /* n_pages * page_bytes */
    int32_t n_pages;           /* KV pool pages */
} aotx_cuda_plan;

/* Size the KV pool: the pages that fit in the budget after the weights, the scratch and
 * the reserve (capped by max_pages).  AOTX_E_CUDA_TOO_LARGE (out filled: budget and
 * needed name the bytes) when not even min_pages fit; AOTX_E_INVALID_ARGUMENT for a
 * fraction outside (0, 1] or a negative size. */
int aotx_cuda_plan_pool(const aotx_cuda_plan_in *in, aotx_cuda_plan *out);

/* ---- device activation layouts (what aotx_cuda_quantize writes) ----
 * Q8_0 family (Q8_0 weights): int8 q[n_tok][cols], then at the next 256-byte boundary
 * float d[n_tok][cols / 32]; x ~= d * q per 32 values, quantized exactly as the CPU's
 * aotx_act_prepare (d = max|x| / 127, q = round-half-even(x / d)), so the quants and
 * scales are the CPU's bit for bit in another arrangement.  k-quants (Q4_K): the CPU's
 * aotx_block_q8_k32 [n_tok][cols / 256], the same bytes.  Bytes for n_tok rows, or a
 * negative code. */
int64_t aotx_cuda_act_bytes(int32_t type, int64_t cols, int64_t n_tok);
/* CDEF-END */

/* Internal to csrc/cuda (C and CUDA both): record a failed CUDA call for
 * aotx_cuda_last_error and return its code. */
#ifdef __cplusplus
extern "C" {
#endif
int aotx_cuda_fail(const char *call, int cuda_error, const char *cuda_name,
                   const char *cuda_text);
#ifdef __cplusplus
}
#endif

#endif
