/* cpu_internal.h -- the one CPU-feature probe (common.c) as the kernels use it.
 * Not part of the cffi surface: aotx_cpu_features() in aotx.h is the public face.
 * Every kernel family (quant.c / quant_x86.c, sgemm.c) derives its level from
 * these bits and honours the same AOTX_KERNELS=ref override. */
#ifndef AOTX_CPU_INTERNAL_H
#define AOTX_CPU_INTERNAL_H

#include "aotx.h"

/* Bits of aotx_cpu_features() (documented in aotx.h). */
enum {
    AOTX_CPU_AVX2_FMA = 1u << 0,     /* AVX2 and FMA */
    AOTX_CPU_AVX512 = 1u << 1,       /* AVX-512 F, BW and VL */
    AOTX_CPU_AVX512VNNI = 1u << 2,
    AOTX_CPU_AVXVNNI = 1u << 3,
    AOTX_CPU_F16C = 1u << 4,
    AOTX_CPU_AVX512F = 1u << 5       /* AVX-512 F alone (sgemm needs no more) */
};

/* The kernel cap AOTX_KERNELS set in the environment at first call (read once):
 * "ref" -> AOTX_KERNELS_REF, "avx2" -> AOTX_KERNELS_AVX2 (no AVX-512 even where the
 * CPU has it: how benchmarks measure the AVX2 path), unset or else -> AUTO. */
enum { AOTX_KERNELS_AUTO = 0, AOTX_KERNELS_REF = 1, AOTX_KERNELS_AVX2 = 2 };
int aotx_cpu_kernel_cap(void);
/* 1 when the cap is "ref". */
int aotx_cpu_forced_ref(void);

static inline int aotx_cpu_has(uint32_t bits) { return (aotx_cpu_features() & bits) == bits; }

#endif
