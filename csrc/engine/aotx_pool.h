/* aotx_pool.h -- the C thread pool every compute path shares (decoder steps,
 * embeddings).  The caller is worker 0; aotx_pool_run() returns when every
 * worker finished fn.  Built for many short parallel sections per second
 * (a decode step runs ~100): workers spin briefly before sleeping.
 * Not part of the cffi surface (callbacks stay in C) except new/free/size.
 */
#ifndef AOTX_POOL_H
#define AOTX_POOL_H

#include "aotx.h"

/* CDEF-BEGIN */
typedef struct aotx_pool aotx_pool;
/* n_threads: total workers including the caller (at most 32); 0 = one per online core. */
int aotx_pool_new(int32_t n_threads, aotx_pool **out);
void aotx_pool_free(aotx_pool *p);
int32_t aotx_pool_size(const aotx_pool *p);
/* Test hook: runs n_sections parallel sections; each worker adds its index+1
 * into a per-section slot.  Returns 0 when every section saw every worker
 * exactly once, else a negative code; *elapsed_ns is the wall time. */
int aotx_pool_selftest(aotx_pool *p, int64_t n_sections, int64_t *elapsed_ns);
/* CDEF-END */

typedef void (*aotx_pool_fn)(void *ctx, int32_t ith, int32_t nth);
/* Run fn(ctx, ith, nth) once for every ith in [0, nth) and return when all
 * are done; ith = 0 runs on the caller, the others on their workers unless a
 * worker is late, in which case the caller runs its share (so fn must not
 * depend on the thread it runs on).  Not reentrant. */
void aotx_pool_run(aotx_pool *p, aotx_pool_fn fn, void *ctx);

#endif
