/* aotx.h -- the public header of the aotx native library.
 *
 * Conventions (DESIGN.md, "The native boundary"):
 *   - every public symbol has the aotx_ prefix; handles are opaque;
 *   - every call that can fail returns an int: 0 ok, >0 a recoverable refusal
 *     (the caller may retry later or pick another path), <0 an error; a failed
 *     call leaves the state it was given unchanged;
 *   - codes are grouped by area in hundreds: 1..99 common, 1xx device state,
 *     2xx journal, 3xx runtime file, 4xx model/gguf, 5xx KV pool,
 *     6xx tokenizer, 7xx embeddings, 8xx kernels.  aotx_code_name() gives
 *     the snake_case name Python and HTTP use, aotx_strerror() a sentence;
 *   - buffers are owned by the caller; a function that fills a buffer returns
 *     the number of bytes written, or minus the size needed when the buffer
 *     is too small (and writes nothing);
 *   - no exit(), no allocation on the decode path.
 *
 * Each area declares its API in csrc/aotx_<area>.h; this file holds what is
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

#define AOTX_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)

#endif /* AOTX_H */
