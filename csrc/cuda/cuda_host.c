/* cuda_host.c -- the CUDA area's host side, plain C in every build (aotx_cuda.h): the
 * build report, the CUDA error mapping and the last-error text, the page-table mirror,
 * the CUDA-graph buckets, the buffer plan and the device activation layout. */
#include "aotx_cuda.h"
#include "aotx_kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const aotx_code_entry aotx_cuda_codes[] = {
    {AOTX_E_CUDA, "cuda_error", "a CUDA runtime call failed"},
    {AOTX_E_CUDA_OOM, "cuda_out_of_memory", "device memory is exhausted"},
    {AOTX_E_CUDA_NO_DEVICE, "cuda_no_device", "no CUDA device (or not the one asked for)"},
    {AOTX_E_CUDA_NOT_BUILT, "cuda_not_built", "this library was built without CUDA"},
    {AOTX_E_CUDA_DRIVER, "cuda_driver_unusable",
     "no usable CUDA driver (missing, or older than the runtime)"},
    {AOTX_E_CUDA_ARCH, "cuda_arch_unsupported",
     "the library has no kernel image for this device (built for other architectures)"},
    {AOTX_E_CUDA_LAUNCH, "cuda_launch_refused", "a kernel launch was refused"},
    {AOTX_E_CUDA_FAULT, "cuda_device_fault", "a kernel faulted; the device context is lost"},
    {AOTX_E_CUDA_TOO_LARGE, "cuda_model_too_large",
     "the model and one full-length sequence's KV do not fit in the device memory budget"},
    {0, NULL, NULL},
};

/* ------------------------------------------------------------ build report */

#ifndef AOTX_CUDA_ARCHS
#define AOTX_CUDA_ARCHS ""
#endif
#ifndef AOTX_CUDART_VERSION
#define AOTX_CUDART_VERSION 0
#endif

int aotx_cuda_available(void) {
#ifdef AOTX_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

void aotx_cuda_build_info(aotx_cuda_build *out) {
    memset(out, 0, sizeof *out);
    out->compiled = aotx_cuda_available();
    out->runtime_version = AOTX_CUDART_VERSION;
    snprintf(out->archs, sizeof out->archs, "%s", AOTX_CUDA_ARCHS);
}

/* ------------------------------------------------------------ errors */

/* cudaError_t values (driver_types.h; the .cu files static_assert each one). */
enum {
    CU_SUCCESS = 0, CU_INVALID_VALUE = 1, CU_MEMORY_ALLOCATION = 2, CU_INIT = 3,
    CU_INVALID_CONFIGURATION = 9, CU_STUB_LIBRARY = 34, CU_INSUFFICIENT_DRIVER = 35,
    CU_NEWER_DRIVER = 36, CU_INVALID_DEVICE_FUNCTION = 98, CU_NO_DEVICE = 100,
    CU_INVALID_DEVICE = 101, CU_INVALID_KERNEL_IMAGE = 200, CU_NO_KERNEL_IMAGE = 209,
    CU_INVALID_PTX = 218, CU_UNSUPPORTED_PTX = 222, CU_ILLEGAL_ADDRESS = 700,
    CU_LAUNCH_OUT_OF_RESOURCES = 701, CU_LAUNCH_TIMEOUT = 702, CU_ASSERT = 710,
    CU_HARDWARE_STACK = 714, CU_ILLEGAL_INSTRUCTION = 715, CU_MISALIGNED = 716,
    CU_INVALID_ADDRESS_SPACE = 717, CU_INVALID_PC = 718, CU_LAUNCH_FAILURE = 719,
    CU_SYSTEM_DRIVER_MISMATCH = 803, CU_COMPAT_NOT_SUPPORTED = 804,
};

int aotx_cuda_error_code(int e) {
    switch (e) {
    case CU_SUCCESS: return AOTX_OK;
    case CU_MEMORY_ALLOCATION: return AOTX_E_CUDA_OOM;
    case CU_NO_DEVICE: case CU_INVALID_DEVICE: return AOTX_E_CUDA_NO_DEVICE;
    case CU_INIT: case CU_STUB_LIBRARY: case CU_INSUFFICIENT_DRIVER: case CU_NEWER_DRIVER:
    case CU_SYSTEM_DRIVER_MISMATCH: case CU_COMPAT_NOT_SUPPORTED:
        return AOTX_E_CUDA_DRIVER;
    case CU_INVALID_DEVICE_FUNCTION: case CU_INVALID_KERNEL_IMAGE: case CU_NO_KERNEL_IMAGE:
    case CU_INVALID_PTX: case CU_UNSUPPORTED_PTX:
        return AOTX_E_CUDA_ARCH;
    case CU_INVALID_CONFIGURATION: case CU_LAUNCH_OUT_OF_RESOURCES: return AOTX_E_CUDA_LAUNCH;
    case CU_ILLEGAL_ADDRESS: case CU_LAUNCH_TIMEOUT: case CU_ASSERT: case CU_HARDWARE_STACK:
    case CU_ILLEGAL_INSTRUCTION: case CU_MISALIGNED: case CU_INVALID_ADDRESS_SPACE:
    case CU_INVALID_PC: case CU_LAUNCH_FAILURE:
        return AOTX_E_CUDA_FAULT;
    default: return AOTX_E_CUDA;
    }
}

static _Thread_local char last_error[192];

const char *aotx_cuda_last_error(void) { return last_error; }

int aotx_cuda_fail(const char *call, int cuda_error, const char *cuda_name,
                   const char *cuda_text) {
    snprintf(last_error, sizeof last_error, "%s: %s (%s)", call, cuda_name ? cuda_name : "?",
             cuda_text ? cuda_text : "?");
    int rc = aotx_cuda_error_code(cuda_error);
    return rc ? rc : AOTX_E_CUDA;
}

/* ------------------------------------------------------------ page-table mirror */

enum { PT_ENTRY = 4 };   /* {len, lo, page0, off} */

int aotx_cuda_pt_build(const aotx_kv_pool *kv, int32_t layer, int32_t window, int32_t n,
                       const uint32_t *seqs, int32_t *out, int64_t cap, int64_t *count,
                       aotx_cuda_kv_layout *layout) {
    if (!kv || n < 0 || window < 0 || !count || (n > 0 && !seqs))
        return AOTX_E_INVALID_ARGUMENT;
    aotx_kv_view w;
    int64_t need = (int64_t)n * PT_ENTRY;
    for (int32_t i = 0; i < n; i++) {
        aotx_kv_seq_info si;
        int rc = aotx_kv_seq_info_get(kv, seqs[i], &si);
        if (rc) return rc;
        if (si.length < 1) return AOTX_E_INVALID_ARGUMENT;
        rc = aotx_kv_view_get(kv, seqs[i], layer, &w);
        if (rc) return rc;
        int32_t lo = window > 0 && si.length > window ? si.length - window : 0;
        int32_t page0 = lo / w.page_tokens;
        int32_t pages = (si.length + w.page_tokens - 1) / w.page_tokens;
        for (int32_t p = page0; p < pages; p++)
            if (w.table[p] < 0) return AOTX_E_INVALID_ARGUMENT;
        need += pages - page0;
    }
    *count = need;
    if (layout && n > 0) {
        layout->page_elems = w.page_floats;
        layout->k_off = w.k_off;
        layout->v_off = w.v_off;
        layout->k_tok = w.k_tok;
        layout->v_tok = w.v_tok;
        layout->page_tokens = w.page_tokens;
        layout->elem_bytes = w.elem_bytes;
        layout->window = window;
    }
    if (cap < need || (need > 0 && !out)) return AOTX_E_BUFFER_TOO_SMALL;
    int64_t off = (int64_t)n * PT_ENTRY;
    for (int32_t i = 0; i < n; i++) {
        aotx_kv_seq_info si;
        aotx_kv_seq_info_get(kv, seqs[i], &si);
        aotx_kv_view_get(kv, seqs[i], layer, &w);
        int32_t lo = window > 0 && si.length > window ? si.length - window : 0;
        int32_t page0 = lo / w.page_tokens;
        int32_t pages = (si.length + w.page_tokens - 1) / w.page_tokens;
        int32_t *e = out + (int64_t)i * PT_ENTRY;
        e[0] = si.length;
        e[1] = lo;
        e[2] = page0;
        e[3] = (int32_t)off;
        for (int32_t p = page0; p < pages; p++) out[off++] = w.table[p];
    }
    return AOTX_OK;
}

/* ------------------------------------------------------------ graph buckets */

int32_t aotx_cuda_graph_buckets(int32_t max_seqs, int32_t *out, int32_t cap) {
    if (max_seqs < 1 || !out || cap < 1) return AOTX_E_INVALID_ARGUMENT;
    int32_t n = 0, b = 1;
    while (b < max_seqs) {
        if (n == cap) return AOTX_E_BUFFER_TOO_SMALL;
        out[n++] = b;
        b = b < 8 ? b * 2 : b < 64 ? b + 8 : b + 32;
    }
    if (n == cap) return AOTX_E_BUFFER_TOO_SMALL;
    out[n++] = max_seqs;
    return n;
}

int32_t aotx_cuda_graph_bucket(const int32_t *buckets, int32_t n_buckets, int32_t n) {
    if (n < 1 || n_buckets < 0 || (n_buckets > 0 && !buckets)) return AOTX_E_INVALID_ARGUMENT;
    int32_t lo = 0, hi = n_buckets;    /* first bucket >= n: buckets ascend */
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (buckets[mid] < n) lo = mid + 1;
        else hi = mid;
    }
    return lo < n_buckets ? lo : -1;
}

/* ------------------------------------------------------------ buffer plan */

#define ALIGN 256

static int64_t aligned(int64_t bytes) { return (bytes + ALIGN - 1) / ALIGN * ALIGN; }

int64_t aotx_cuda_act_bytes(int32_t type, int64_t cols, int64_t n_tok) {
    if (cols < 0 || n_tok < 0) return AOTX_E_INVALID_ARGUMENT;
    switch (type) {
    case AOTX_T_Q8_0:
        if (cols % AOTX_QK) return AOTX_E_KERNEL_SHAPE;
        return aligned(n_tok * cols) + n_tok * (cols / AOTX_QK) * (int64_t)sizeof(float);
    case AOTX_T_Q4_K:
        if (cols % AOTX_QK_K) return AOTX_E_KERNEL_SHAPE;
        return n_tok * (cols / AOTX_QK_K) * (int64_t)sizeof(aotx_block_q8_k32);
    default: return AOTX_E_KERNEL_TYPE;
    }
}

int aotx_cuda_scratch_plan(const aotx_cuda_dims *d, aotx_cuda_scratch *out) {
    if (!d || !out) return AOTX_E_INVALID_ARGUMENT;
    if (d->d_model < 1 || d->n_heads < 1 || d->n_kv_heads < 1 || d->head_dim < 1 ||
        d->v_dim < 1 || d->d_ff < 1 || d->n_vocab < 1 || d->max_batch_tokens < 1 ||
        d->max_seqs < 1 || d->max_pages_per_seq < 1 || d->n_groups < 1 ||
        d->n_heads % d->n_kv_heads)
        return AOTX_E_INVALID_ARGUMENT;
    const int64_t T = d->max_batch_tokens, F = sizeof(float);
    memset(out, 0, sizeof *out);
    out->x = aligned(T * d->d_model * F);
    out->xn = out->x;
    out->q = aligned(T * d->n_heads * d->head_dim * F);
    out->k = aligned(T * d->n_kv_heads * d->head_dim * F);
    out->v = aligned(T * d->n_kv_heads * d->v_dim * F);
    out->attn = aligned(T * d->n_heads * d->v_dim * F);
    out->gate = aligned(T * d->d_ff * F);
    out->up = out->gate;
    /* the widest matmul input: d_model, the attention output or d_ff; both layouts sized
     * on 256 (every k-quant input is a multiple of 256, every Q8_0 one of 32) */
    int64_t wide = d->d_model;
    if ((int64_t)d->n_heads * d->v_dim > wide) wide = (int64_t)d->n_heads * d->v_dim;
    if (d->d_ff > wide) wide = d->d_ff;
    wide = (wide + AOTX_QK_K - 1) / AOTX_QK_K * AOTX_QK_K;
    int64_t a8 = aotx_cuda_act_bytes(AOTX_T_Q8_0, wide, T);
    int64_t ak = aotx_cuda_act_bytes(AOTX_T_Q4_K, wide, T);
    out->act = aligned(a8 > ak ? a8 : ak);
    out->logits = aligned((int64_t)d->max_seqs * d->n_vocab * F);
    out->mirror = (int64_t)d->n_groups *
                  aligned((int64_t)d->max_seqs * (PT_ENTRY + d->max_pages_per_seq) * 4);
    out->tokens = 3 * aligned(T * 4);
    out->total = out->x + out->xn + out->q + out->k + out->v + out->attn + out->gate + out->up +
                 out->act + out->logits + out->mirror + out->tokens;
    return AOTX_OK;
}

int aotx_cuda_plan_pool(const aotx_cuda_plan_in *in, aotx_cuda_plan *out) {
    if (!in || !out) return AOTX_E_INVALID_ARGUMENT;
    if (!(in->fraction > 0.0 && in->fraction <= 1.0) || in->free_bytes < 0 ||
        in->weight_bytes < 0 || in->scratch_bytes < 0 || in->reserve_bytes < 0 ||
        in->page_bytes < 1 || in->min_pages < 1 || in->max_pages < 0)
        return AOTX_E_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    out->budget = (int64_t)floor((double)in->free_bytes * in->fraction);
    int64_t fixed = in->weight_bytes + in->scratch_bytes + in->reserve_bytes;
    out->needed = fixed + (int64_t)in->min_pages * in->page_bytes;
    if (out->needed > out->budget) return AOTX_E_CUDA_TOO_LARGE;
    int64_t pages = (out->budget - fixed) / in->page_bytes;
    if (in->max_pages > 0 && pages > in->max_pages) pages = in->max_pages;
    if (pages > INT32_MAX) pages = INT32_MAX;
    out->n_pages = (int32_t)pages;
    out->kv_bytes = pages * in->page_bytes;
    return AOTX_OK;
}
