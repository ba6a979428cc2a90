/* aotx_sample.h -- token sampling: greedy, temperature, top-p (nucleus),
 * seeded and deterministic per seed (xoshiro256** seeded by splitmix64; the
 * state lives in the caller's aotx_rng, one per sequence).
 *
 * Rules: temperature <= 0 or top_p <= 0 -> argmax (lowest id on ties); NaN
 * logits count as -inf.  Otherwise p = softmax(logits / T); with top_p < 1
 * the candidates are the shortest prefix of tokens sorted by p descending
 * (ties: lower id first) whose mass reaches top_p (at least one token; found
 * by histograms of the float bits, never by sorting the vocabulary).  One
 * uniform draw u in [0, 1) (53 bits) picks, walking the candidates in id
 * order, the first token whose cumulative mass exceeds u x (their mass).
 * No allocation: scratch buffers come from the caller.
 */
#ifndef AOTX_SAMPLE_H
#define AOTX_SAMPLE_H

#include "aotx.h"

/* CDEF-BEGIN */
typedef struct aotx_rng { uint64_t s[4]; } aotx_rng;

typedef struct aotx_sample_params {
    float temperature;
    float top_p;
} aotx_sample_params;

void aotx_rng_seed(aotx_rng *r, uint64_t seed);
uint64_t aotx_rng_next(aotx_rng *r);
/* Uniform double in [0, 1) from the top 53 bits. */
double aotx_rng_uniform(aotx_rng *r);

int32_t aotx_argmax(const float *logits, int32_t n);
/* Returns the token id (>= 0) or a negative code.  probs: float[n] scratch,
 * idx: int32[n] scratch (used for top_p < 1 only; may be NULL otherwise). */
int32_t aotx_sample(const float *logits, int32_t n, const aotx_sample_params *p, aotx_rng *r,
                    float *probs, int32_t *idx);
/* CDEF-END */

#endif
