/* common.c -- version, capacities, code names, the one CPU feature probe. */
#include "aotx.h"
#include "cpu_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const char *aotx_version(void) { return "0.1.0"; }

void aotx_capacities_get(aotx_capacities *out) {
    out->participants = AOTX_MAX_PARTICIPANTS;
    out->spaces = AOTX_MAX_SPACES;
    out->conversations = AOTX_MAX_CONVERSATIONS;
    out->members = AOTX_MAX_MEMBERS;
    out->receipts = AOTX_MAX_RECEIPTS;
    out->command_bytes = AOTX_MAX_COMMAND_BYTES;
    out->result_bytes = AOTX_MAX_RESULT_BYTES;
    out->memory = AOTX_MAX_MEMORY;
}

static const aotx_code_entry common_codes[] = {
    {AOTX_OK, "ok", "success"},
    {AOTX_R_BUSY, "busy", "the resource is busy; try again"},
    {AOTX_E_NOMEM, "out_of_memory", "memory allocation failed"},
    {AOTX_E_INVALID_ARGUMENT, "invalid_argument", "an argument is out of range or malformed"},
    {AOTX_E_IO, "io_error", "an input/output operation failed"},
    {AOTX_E_INTERNAL, "internal_error", "internal invariant violated"},
    {AOTX_E_UNSUPPORTED, "unsupported", "the operation or format is not supported"},
    {AOTX_E_BUFFER_TOO_SMALL, "buffer_too_small", "the caller's buffer is too small"},
    {0, NULL, NULL},
};

/* Each area's table, terminated by a NULL name. Weak: absent in partial builds. */
extern const aotx_code_entry aotx_device_codes[] __attribute__((weak));
extern const aotx_code_entry aotx_journal_codes[] __attribute__((weak));
extern const aotx_code_entry aotx_ccir_codes[] __attribute__((weak));
extern const aotx_code_entry aotx_model_codes[] __attribute__((weak));
extern const aotx_code_entry aotx_kv_codes[] __attribute__((weak));
extern const aotx_code_entry aotx_tokenizer_codes[] __attribute__((weak));
extern const aotx_code_entry aotx_embed_codes[] __attribute__((weak));
extern const aotx_code_entry aotx_kernel_codes[] __attribute__((weak));
extern const aotx_code_entry aotx_cuda_codes[] __attribute__((weak));

static const aotx_code_entry *lookup(int code) {
    int area = abs(code) / 100;
    const aotx_code_entry *t = NULL;
    switch (area) {
    case 0: t = common_codes; break;
    case 1: t = aotx_device_codes; break;
    case 2: t = aotx_journal_codes; break;
    case 3: t = aotx_ccir_codes; break;
    case 4: t = aotx_model_codes; break;
    case 5: t = aotx_kv_codes; break;
    case 6: t = aotx_tokenizer_codes; break;
    case 7: t = aotx_embed_codes; break;
    case 8: t = aotx_kernel_codes; break;
    case 9: t = aotx_cuda_codes; break;
    default: return NULL;
    }
    if (!t) return NULL;
    for (; t->name; t++)
        if (t->code == code) return t;
    return NULL;
}

const char *aotx_code_name(int code) {
    const aotx_code_entry *e = lookup(code);
    if (e) return e->name;
    return code > 0 ? "unknown_refusal" : "unknown_error";
}

const char *aotx_strerror(int code) {
    const aotx_code_entry *e = lookup(code);
    return e ? e->message : "unknown code";
}

static uint32_t cpu_bits;
static int cpu_cap;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_probe(void) {
    uint32_t f = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f |= AOTX_CPU_AVX2_FMA;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        f |= AOTX_CPU_AVX512;
    if (__builtin_cpu_supports("avx512vnni")) f |= AOTX_CPU_AVX512VNNI;
    if (__builtin_cpu_supports("avxvnni")) f |= AOTX_CPU_AVXVNNI;
    if (__builtin_cpu_supports("f16c")) f |= AOTX_CPU_F16C;
    if (__builtin_cpu_supports("avx512f")) f |= AOTX_CPU_AVX512F;
#endif
    cpu_bits = f;
    const char *env = getenv("AOTX_KERNELS");
    cpu_cap = !env ? AOTX_KERNELS_AUTO
            : strcmp(env, "ref") == 0 ? AOTX_KERNELS_REF
            : strcmp(env, "avx2") == 0 ? AOTX_KERNELS_AVX2 : AOTX_KERNELS_AUTO;
}

uint32_t aotx_cpu_features(void) {
    pthread_once(&cpu_once, cpu_probe);
    return cpu_bits;
}

int aotx_cpu_kernel_cap(void) {
    pthread_once(&cpu_once, cpu_probe);
    return cpu_cap;
}

int aotx_cpu_forced_ref(void) { return aotx_cpu_kernel_cap() == AOTX_KERNELS_REF; }
