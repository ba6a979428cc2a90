/* threadpool.c -- the shared C thread pool (aotx_pool.h).
 *
 * The caller is worker 0.  aotx_pool_run publishes (fn, ctx) together with
 * a new generation in one atomic word, state = gen << 32 | claimed-share
 * bits.  Worker i runs share i only after claiming bit i of the current
 * generation; the caller, once its own share is done, waits a few
 * microseconds and then claims and runs every share nobody claimed yet, so
 * a worker that is descheduled (a busy machine) or asleep delays a section
 * by microseconds, not by a scheduler time slice.  Shares must therefore not
 * depend on which thread runs them (fn(ctx, ith, nth) is called exactly once
 * per ith, on some thread).
 *
 * Workers spin on the state word for a while (a decode step runs ~100
 * sections back to back) and sleep on a condition variable when nothing
 * came; the sleeper count and the state are seq_cst atomics, so a publisher
 * that sees no sleeper can skip the broadcast (a worker re-checks the state
 * under the mutex after announcing itself).
 */
#include "aotx_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ITERS 20000    /* worker: ~1 ms of spinning before sleeping */
#define STEAL_AFTER 100     /* caller: ~5 us before running unclaimed shares itself */
#define MAX_THREADS 32      /* one claim bit per worker in the state word */

typedef struct worker {
    struct aotx_pool *pool;
    int32_t ith;
} worker;

struct aotx_pool {
    int32_t n;                      /* workers including the caller */
    pthread_t *threads;             /* [n - 1] */
    worker *workers;                /* [n - 1] */
    aotx_pool_fn fn;
    void *ctx;
    uint32_t gen;                   /* caller-side copy of the current generation */
    _Atomic uint64_t state;         /* gen << 32 | claimed bits */
    _Atomic int32_t done;           /* shares finished in this generation */
    _Atomic int32_t sleepers;
    _Atomic int32_t stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static int claim(struct aotx_pool *p, uint32_t gen, int32_t ith) {
    uint64_t s = atomic_load(&p->state), bit = (uint64_t)1 << ith;
    for (;;) {
        if ((uint32_t)(s >> 32) != gen || (s & bit)) return 0;
        if (atomic_compare_exchange_weak(&p->state, &s, s | bit)) return 1;
    }
}

static uint32_t current_gen(struct aotx_pool *p) { return (uint32_t)(atomic_load(&p->state) >> 32); }

static void *worker_main(void *arg) {
    worker *w = arg;
    struct aotx_pool *p = w->pool;
    uint32_t seen = 0;   /* gen starts at 0; runs begin after every worker exists */
    for (;;) {
        int spins = 0;
        while (current_gen(p) == seen && !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERS) { CPU_RELAX(); continue; }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (current_gen(p) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = current_gen(p);
        if (claim(p, seen, w->ith)) {
            p->fn(p->ctx, w->ith, p->n);
            atomic_fetch_add(&p->done, 1);
        }
    }
}

int aotx_pool_new(int32_t n_threads, aotx_pool **out) {
    if (!out || n_threads < 0 || n_threads > MAX_THREADS) return AOTX_E_INVALID_ARGUMENT;
    *out = NULL;
    if (n_threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c < 1 ? 1 : (c > MAX_THREADS ? MAX_THREADS : (int32_t)c);
    }
    struct aotx_pool *p = calloc(1, sizeof *p);
    if (!p) return AOTX_E_NOMEM;
    p->n = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    p->workers = calloc((size_t)n_threads, sizeof(worker));
    if (!p->threads || !p->workers) {
        free(p->threads); free(p->workers); free(p);
        return AOTX_E_NOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int32_t i = 1; i < n_threads; i++) {
        p->workers[i - 1] = (worker){p, i};
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, &p->workers[i - 1])) {
            p->n = i;   /* the ones started so far */
            aotx_pool_free(p);
            return AOTX_E_NOMEM;
        }
    }
    *out = p;
    return 0;
}

void aotx_pool_free(aotx_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p->workers);
    free(p);
}

int32_t aotx_pool_size(const aotx_pool *p) { return p ? p->n : 1; }

void aotx_pool_run(aotx_pool *p, aotx_pool_fn fn, void *ctx) {
    if (!p || p->n == 1) { fn(ctx, 0, 1); return; }
    uint32_t g = ++p->gen;
    if (g == 0) g = p->gen = 1;   /* 0 is the workers' initial "seen" */
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->done, 0);
    atomic_store(&p->state, ((uint64_t)g << 32) | 1u);   /* publish; share 0 is ours */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    int32_t mine = 1;
    int spins = 0;
    while (atomic_load(&p->done) + mine < p->n) {
        if (++spins == STEAL_AFTER) {
            for (int32_t i = 1; i < p->n; i++)
                if (claim(p, g, i)) { fn(ctx, i, p->n); mine++; }
            continue;
        }
        if (spins < 20 * STEAL_AFTER) CPU_RELAX();
        else sched_yield();
    }
}

typedef struct selftest_ctx {
    _Atomic int64_t sum;
    _Atomic int32_t calls;
} selftest_ctx;

static void selftest_fn(void *ctx, int32_t ith, int32_t nth) {
    selftest_ctx *c = ctx;
    (void)nth;
    atomic_fetch_add(&c->sum, ith + 1);
    atomic_fetch_add(&c->calls, 1);
}

int aotx_pool_selftest(aotx_pool *p, int64_t n_sections, int64_t *elapsed_ns) {
    if (!p || n_sections < 0) return AOTX_E_INVALID_ARGUMENT;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int64_t want = (int64_t)p->n * (p->n + 1) / 2;
    for (int64_t s = 0; s < n_sections; s++) {
        selftest_ctx c;
        atomic_init(&c.sum, 0);
        atomic_init(&c.calls, 0);
        aotx_pool_run(p, selftest_fn, &c);
        /* run() returned: every share ran exactly once already */
        if (atomic_load(&c.sum) != want || atomic_load(&c.calls) != p->n) return AOTX_E_INTERNAL;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (elapsed_ns)
        *elapsed_ns = (int64_t)(b.tv_sec - a.tv_sec) * 1000000000 + (b.tv_nsec - a.tv_nsec);
    return 0;
}
