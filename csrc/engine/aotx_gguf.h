/* aotx_gguf.h -- read-only GGUF v3 reader over an mmap.
 *
 * Layout (little-endian, public GGUF v3): magic "GGUF", u32 version, u64
 * tensor_count, u64 kv_count, kv_count x {string key, u32 type, value},
 * tensor_count x {string name, u32 n_dims, u64 dims[n_dims], u32 type,
 * u64 offset}, padding to general.alignment (default 32), tensor data.
 * A string is u64 length + bytes (no NUL).  An array value is u32 elem_type,
 * u64 count, elements.  Every read is bounds-checked; a corrupt file is
 * refused with a message naming the byte offset (aotx_gguf_open's err).
 * Tensor data is used in place from the mapping (never copied).
 */
#ifndef AOTX_GGUF_H
#define AOTX_GGUF_H

#include "aotx.h"

/* CDEF-BEGIN */
enum {
    AOTX_GGUF_U8 = 0, AOTX_GGUF_I8 = 1, AOTX_GGUF_U16 = 2, AOTX_GGUF_I16 = 3,
    AOTX_GGUF_U32 = 4, AOTX_GGUF_I32 = 5, AOTX_GGUF_F32 = 6, AOTX_GGUF_BOOL = 7,
    AOTX_GGUF_STRING = 8, AOTX_GGUF_ARRAY = 9, AOTX_GGUF_U64 = 10, AOTX_GGUF_I64 = 11,
    AOTX_GGUF_F64 = 12,

    AOTX_E_GGUF_OPEN = -401,        /* file cannot be opened or mapped */
    AOTX_E_GGUF_MAGIC = -402,       /* not a GGUF file */
    AOTX_E_GGUF_VERSION = -403,     /* GGUF version other than 2 or 3 */
    AOTX_E_GGUF_TRUNCATED = -404,   /* a field runs past the end of the file */
    AOTX_E_GGUF_VALUE_TYPE = -405,  /* unknown metadata value type */
    AOTX_E_GGUF_TENSOR = -406,      /* tensor entry malformed (dims, type, offset, bounds) */
    AOTX_E_GGUF_ALIGNMENT = -407,   /* general.alignment not a power of two */
    AOTX_E_GGUF_KEY = -408,         /* metadata key missing or of the wrong type */
    AOTX_E_GGUF_LIMIT = -409        /* a count exceeds the reader's limits */
};

typedef struct aotx_gguf aotx_gguf;

typedef struct aotx_gguf_tensor_info {
    const char *name;       /* NUL-terminated copy owned by the reader */
    int32_t type;           /* AOTX_T_* (ggml numbering) */
    int32_t n_dims;
    int64_t dims[4];        /* ne[0] = elements per row (fastest), unused = 1 */
    uint64_t offset;        /* relative to the data section */
    uint64_t nbytes;
    const void *data;       /* into the mapping */
} aotx_gguf_tensor_info;

/* Map and validate the file.  On failure *out stays NULL and err (if cap > 0)
 * holds a NUL-terminated message naming the byte offset. */
int aotx_gguf_open(const char *path, aotx_gguf **out, char *err, int64_t err_cap);
/* The same for a GGUF held as an extent of a larger file (a runtime file's
 * component): bytes [offset, offset + length) of path, mapped read-only in
 * place (no copy); length 0 = to the end of the file.  Offsets in messages
 * are relative to the extent. */
int aotx_gguf_open_range(const char *path, uint64_t offset, uint64_t length, aotx_gguf **out,
                         char *err, int64_t err_cap);
void aotx_gguf_close(aotx_gguf *g);

uint32_t aotx_gguf_version(const aotx_gguf *g);
uint32_t aotx_gguf_alignment(const aotx_gguf *g);
uint64_t aotx_gguf_data_offset(const aotx_gguf *g);
uint64_t aotx_gguf_file_size(const aotx_gguf *g);

int64_t aotx_gguf_n_kv(const aotx_gguf *g);
/* Index of a key, or -1. */
int64_t aotx_gguf_find_key(const aotx_gguf *g, const char *key);
const char *aotx_gguf_key(const aotx_gguf *g, int64_t i);        /* NUL-terminated copy */
int32_t aotx_gguf_kv_type(const aotx_gguf *g, int64_t i);        /* AOTX_GGUF_*; -1 bad i */
/* Scalars converted: any integer/bool type to int64, any number to double. */
int aotx_gguf_get_int(const aotx_gguf *g, int64_t i, int64_t *out);
int aotx_gguf_get_float(const aotx_gguf *g, int64_t i, double *out);
/* A string value: pointer into the mapping (not NUL-terminated) and length. */
int aotx_gguf_get_str(const aotx_gguf *g, int64_t i, const char **ptr, uint64_t *len);
/* Array: element type and count. */
int aotx_gguf_arr_info(const aotx_gguf *g, int64_t i, int32_t *elem_type, uint64_t *count);
/* Element j of a numeric array converted, or of a string array as (ptr, len). */
int aotx_gguf_arr_int(const aotx_gguf *g, int64_t i, uint64_t j, int64_t *out);
int aotx_gguf_arr_float(const aotx_gguf *g, int64_t i, uint64_t j, double *out);
int aotx_gguf_arr_str(const aotx_gguf *g, int64_t i, uint64_t j, const char **ptr, uint64_t *len);

int64_t aotx_gguf_n_tensors(const aotx_gguf *g);
int64_t aotx_gguf_find_tensor(const aotx_gguf *g, const char *name);
int aotx_gguf_tensor(const aotx_gguf *g, int64_t i, aotx_gguf_tensor_info *out);
/* CDEF-END */

/* For C users: a raw pointer to a numeric array's elements (unaligned) or NULL. */
const void *aotx_gguf_arr_data(const aotx_gguf *g, int64_t i);

#endif
