/* gguf.c -- GGUF v3 (and v2) reader over a read-only mmap, bounds-checked. */
#include "aotx_gguf.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_DIMS 4

typedef struct gguf_kv {
    char *key;            /* NUL-terminated copy */
    int32_t type;         /* AOTX_GGUF_* */
    int32_t elem_type;    /* arrays: element type */
    uint64_t count;       /* arrays: element count */
    uint64_t off;         /* file offset of the value (arrays: of the first element) */
    uint64_t *str_offs;   /* string arrays: [count] file offsets of each string */
} gguf_kv;

struct aotx_gguf {
    const uint8_t *map;   /* [size] the GGUF's bytes, inside the mapping */
    uint64_t size;
    void *map_base;       /* [map_len] the mapping itself (page-aligned) */
    size_t map_len;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off;
    int64_t n_kv;
    gguf_kv *kv;                      /* [n_kv] */
    int64_t n_tensors;
    aotx_gguf_tensor_info *tensors;   /* [n_tensors] */
};

/* The 4xx code table (gguf_* and model_* names) lives in model.c. */

/* Block geometry of ggml types (public GGUF facts): elements and bytes per block. */
static int type_geom(int32_t t, int64_t *be, int64_t *bb) {
    static const int16_t tab[][3] = {
        {0, 1, 4}, {1, 1, 2}, {2, 32, 18}, {3, 32, 20}, {6, 32, 22}, {7, 32, 24},
        {8, 32, 34}, {9, 32, 36}, {10, 256, 84}, {11, 256, 110}, {12, 256, 144},
        {13, 256, 176}, {14, 256, 210}, {15, 256, 292}, {20, 32, 18}, {23, 256, 136},
        {24, 1, 1}, {25, 1, 2},
        {26, 1, 4}, {27, 1, 8}, {28, 1, 8}, {30, 1, 2},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (tab[i][0] == t) { *be = tab[i][1]; *bb = tab[i][2]; return 0; }
    return -1;
}

static int scalar_size(int32_t t) {
    switch (t) {
    case AOTX_GGUF_U8: case AOTX_GGUF_I8: case AOTX_GGUF_BOOL: return 1;
    case AOTX_GGUF_U16: case AOTX_GGUF_I16: return 2;
    case AOTX_GGUF_U32: case AOTX_GGUF_I32: case AOTX_GGUF_F32: return 4;
    case AOTX_GGUF_U64: case AOTX_GGUF_I64: case AOTX_GGUF_F64: return 8;
    default: return 0;
    }
}

typedef struct cursor {
    const uint8_t *p;
    uint64_t size, off;
    char *err;
    int64_t cap;
} cursor;

static int fail(cursor *c, int code, const char *fmt, ...) {
    if (c->err && c->cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, (size_t)c->cap, fmt, ap);
        va_end(ap);
        /* names come from the file: keep the message printable ASCII (and valid UTF-8) */
        for (char *q = c->err; *q; q++)
            if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e) *q = '?';
    }
    return code;
}

static int need(cursor *c, uint64_t n, const char *what) {
    if (n > c->size || c->off > c->size - n)
        return fail(c, AOTX_E_GGUF_TRUNCATED, "%s at byte %llu needs %llu bytes; file has %llu",
                    what, (unsigned long long)c->off, (unsigned long long)n,
                    (unsigned long long)c->size);
    return 0;
}

static int rd(cursor *c, void *dst, uint64_t n, const char *what) {
    int rc = need(c, n, what);
    if (rc) return rc;
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return 0;
}

/* Reads a string header, returns its offset and length, advances past it. */
static int rd_str(cursor *c, uint64_t *off, uint64_t *len, const char *what) {
    int rc = rd(c, len, 8, what);
    if (rc) return rc;
    if ((rc = need(c, *len, what))) return rc;
    *off = c->off;
    c->off += *len;
    return 0;
}

static char *dup_str(const uint8_t *p, uint64_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static int parse_value(cursor *c, aotx_gguf *g, gguf_kv *kv) {
    int rc;
    if (kv->type == AOTX_GGUF_STRING) {
        uint64_t o, n;
        kv->off = c->off;
        return rd_str(c, &o, &n, "string value");
    }
    if (kv->type == AOTX_GGUF_ARRAY) {
        uint32_t et;
        uint64_t at = c->off;
        if ((rc = rd(c, &et, 4, "array element type"))) return rc;
        if ((rc = rd(c, &kv->count, 8, "array count"))) return rc;
        kv->elem_type = (int32_t)et;
        kv->off = c->off;
        if (et == AOTX_GGUF_STRING) {
            if (kv->count > c->size / 8)
                return fail(c, AOTX_E_GGUF_TRUNCATED, "string array at byte %llu claims %llu items",
                            (unsigned long long)at, (unsigned long long)kv->count);
            kv->str_offs = malloc(sizeof(uint64_t) * (kv->count ? kv->count : 1));
            if (!kv->str_offs) return AOTX_E_NOMEM;
            for (uint64_t j = 0; j < kv->count; j++) {
                uint64_t o, n;
                kv->str_offs[j] = c->off;
                if ((rc = rd_str(c, &o, &n, "array string"))) return rc;
            }
            return 0;
        }
        int es = scalar_size((int32_t)et);
        if (!es)
            return fail(c, AOTX_E_GGUF_VALUE_TYPE, "array at byte %llu has element type %u",
                        (unsigned long long)at, et);
        if (kv->count > c->size / (uint64_t)es)
            return fail(c, AOTX_E_GGUF_TRUNCATED, "array at byte %llu claims %llu items",
                        (unsigned long long)at, (unsigned long long)kv->count);
        if ((rc = need(c, kv->count * (uint64_t)es, "array elements"))) return rc;
        c->off += kv->count * (uint64_t)es;
        return 0;
    }
    int s = scalar_size(kv->type);
    if (!s)
        return fail(c, AOTX_E_GGUF_VALUE_TYPE, "value type %d at byte %llu is unknown", kv->type,
                    (unsigned long long)(c->off - 4));
    kv->off = c->off;
    (void)g;
    return rd(c, (uint8_t[8]){0}, (uint64_t)s, "scalar value");
}

static void free_all(aotx_gguf *g) {
    if (!g) return;
    if (g->kv) {
        for (int64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free(g->kv[i].str_offs);
        }
        free(g->kv);
    }
    if (g->tensors) {
        for (int64_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
        free(g->tensors);
    }
    if (g->map_base) munmap(g->map_base, g->map_len);
    free(g);
}

static int parse_kvs(cursor *c, aotx_gguf *g, uint64_t n_kv) {
    int rc;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof(gguf_kv));
    if (!g->kv) return AOTX_E_NOMEM;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        uint64_t ko, kl;
        uint32_t t;
        if ((rc = rd_str(c, &ko, &kl, "metadata key"))) return rc;
        if (!(kv->key = dup_str(c->p + ko, kl))) return AOTX_E_NOMEM;
        g->n_kv = (int64_t)i + 1;
        if ((rc = rd(c, &t, 4, "metadata value type"))) return rc;
        kv->type = (int32_t)t;
        if ((rc = parse_value(c, g, kv))) return rc;
    }
    return 0;
}

static int parse_tensors(cursor *c, aotx_gguf *g, uint64_t n_t) {
    int rc;
    g->tensors = calloc(n_t ? n_t : 1, sizeof(aotx_gguf_tensor_info));
    if (!g->tensors) return AOTX_E_NOMEM;
    for (uint64_t i = 0; i < n_t; i++) {
        aotx_gguf_tensor_info *t = &g->tensors[i];
        uint64_t no, nl, at = c->off;
        uint32_t nd, ty;
        if ((rc = rd_str(c, &no, &nl, "tensor name"))) return rc;
        if (!(t->name = dup_str(c->p + no, nl))) return AOTX_E_NOMEM;
        g->n_tensors = (int64_t)i + 1;
        if ((rc = rd(c, &nd, 4, "tensor n_dims"))) return rc;
        if (nd < 1 || nd > GGUF_MAX_DIMS)
            return fail(c, AOTX_E_GGUF_TENSOR, "tensor '%s' at byte %llu has %u dims", t->name,
                        (unsigned long long)at, nd);
        t->n_dims = (int32_t)nd;
        for (int d = 0; d < 4; d++) t->dims[d] = 1;
        uint64_t nel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t v;
            if ((rc = rd(c, &v, 8, "tensor dim"))) return rc;
            if (v == 0 || v > ((uint64_t)1 << 40) || nel > (((uint64_t)1 << 42) / v))
                return fail(c, AOTX_E_GGUF_TENSOR, "tensor '%s' dim %u = %llu at byte %llu",
                            t->name, d, (unsigned long long)v, (unsigned long long)(c->off - 8));
            t->dims[d] = (int64_t)v;
            nel *= v;
        }
        if ((rc = rd(c, &ty, 4, "tensor type"))) return rc;
        int64_t be, bb;
        if (type_geom((int32_t)ty, &be, &bb))
            return fail(c, AOTX_E_GGUF_TENSOR, "tensor '%s' has unknown type %u at byte %llu",
                        t->name, ty, (unsigned long long)(c->off - 4));
        if (t->dims[0] % be)
            return fail(c, AOTX_E_GGUF_TENSOR,
                        "tensor '%s' row of %lld elements is not a multiple of block %lld "
                        "(type at byte %llu)", t->name, (long long)t->dims[0], (long long)be,
                        (unsigned long long)(c->off - 4));
        t->type = (int32_t)ty;
        t->nbytes = nel / (uint64_t)be * (uint64_t)bb;
        if ((rc = rd(c, &t->offset, 8, "tensor offset"))) return rc;
        if (t->offset % g->alignment)
            return fail(c, AOTX_E_GGUF_TENSOR, "tensor '%s' offset %llu (byte %llu) not aligned",
                        t->name, (unsigned long long)t->offset, (unsigned long long)(c->off - 8));
    }
    return 0;
}

static int check_tensor_bounds(cursor *c, aotx_gguf *g) {
    for (int64_t i = 0; i < g->n_tensors; i++) {
        aotx_gguf_tensor_info *t = &g->tensors[i];
        uint64_t room = g->size - g->data_off;
        if (t->offset > room || t->nbytes > room - t->offset)
            return fail(c, AOTX_E_GGUF_TENSOR,
                        "tensor '%s' data [%llu, %llu) runs past the end of the file (%llu bytes)",
                        t->name, (unsigned long long)(g->data_off + t->offset),
                        (unsigned long long)(g->data_off + t->offset + t->nbytes),
                        (unsigned long long)g->size);
        t->data = g->map + g->data_off + t->offset;
    }
    return 0;
}

static int parse(cursor *c, aotx_gguf *g) {
    int rc;
    uint32_t magic;
    uint64_t n_t, n_kv;
    if ((rc = rd(c, &magic, 4, "magic"))) return rc;
    if (memcmp(&magic, "GGUF", 4))
        return fail(c, AOTX_E_GGUF_MAGIC, "bytes 0..4 are not \"GGUF\"");
    if ((rc = rd(c, &g->version, 4, "version"))) return rc;
    if (g->version != 2 && g->version != 3)
        return fail(c, AOTX_E_GGUF_VERSION, "version %u at byte 4 is not 2 or 3", g->version);
    if ((rc = rd(c, &n_t, 8, "tensor_count"))) return rc;
    if ((rc = rd(c, &n_kv, 8, "kv_count"))) return rc;
    if (n_t > GGUF_MAX_TENSORS || n_kv > GGUF_MAX_KV)
        return fail(c, AOTX_E_GGUF_LIMIT, "tensor_count %llu / kv_count %llu (bytes 8..24) too large",
                    (unsigned long long)n_t, (unsigned long long)n_kv);
    if ((rc = parse_kvs(c, g, n_kv))) return rc;
    g->alignment = 32;
    int64_t ai = aotx_gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        int64_t a;
        if (aotx_gguf_get_int(g, ai, &a) || a <= 0 || a > (1 << 20) || (a & (a - 1)))
            return fail(c, AOTX_E_GGUF_ALIGNMENT, "general.alignment (byte %llu) is invalid",
                        (unsigned long long)g->kv[ai].off);
        g->alignment = (uint32_t)a;
    }
    if ((rc = parse_tensors(c, g, n_t))) return rc;
    uint64_t a = g->alignment;
    g->data_off = (c->off + a - 1) / a * a;
    if (g->data_off > g->size && n_t > 0)
        return fail(c, AOTX_E_GGUF_TRUNCATED, "data section at byte %llu is past the end (%llu)",
                    (unsigned long long)g->data_off, (unsigned long long)g->size);
    return check_tensor_bounds(c, g);
}

int aotx_gguf_open_range(const char *path, uint64_t offset, uint64_t length, aotx_gguf **out,
                         char *err, int64_t err_cap) {
    if (!path || !out) return AOTX_E_INVALID_ARGUMENT;
    *out = NULL;
    if (err && err_cap > 0) err[0] = 0;
    cursor c = {.err = err, .cap = err_cap};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(&c, AOTX_E_GGUF_OPEN, "cannot open %s", path);
    struct stat st;
    if (fstat(fd, &st) || st.st_size < 0 || offset > (uint64_t)st.st_size) {
        close(fd);
        return fail(&c, AOTX_E_GGUF_OPEN, "extent at byte %llu is past the end of %s",
                    (unsigned long long)offset, path);
    }
    uint64_t avail = (uint64_t)st.st_size - offset;
    if (length == 0) length = avail;
    if (length > avail || length < 24) {
        close(fd);
        return fail(&c, AOTX_E_GGUF_TRUNCATED, "extent of %llu bytes (file has %llu after byte "
                    "%llu) is shorter than the 24-byte header or past the end",
                    (unsigned long long)length, (unsigned long long)avail,
                    (unsigned long long)offset);
    }
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = offset / page * page, lead = offset - start;
    if (length > SIZE_MAX - lead) { close(fd); return AOTX_E_NOMEM; }
    size_t map_len = (size_t)(lead + length);
    void *m = mmap(NULL, map_len, PROT_READ, MAP_SHARED, fd, (off_t)start);
    close(fd);
    if (m == MAP_FAILED) return fail(&c, AOTX_E_GGUF_OPEN, "cannot map %s", path);
    aotx_gguf *g = calloc(1, sizeof *g);
    if (!g) { munmap(m, map_len); return AOTX_E_NOMEM; }
    g->map_base = m;
    g->map_len = map_len;
    g->map = (const uint8_t *)m + lead;
    g->size = length;
    c.p = g->map;
    c.size = g->size;
    int rc = parse(&c, g);
    if (rc) { free_all(g); return rc; }
    *out = g;
    return 0;
}

int aotx_gguf_open(const char *path, aotx_gguf **out, char *err, int64_t err_cap) {
    return aotx_gguf_open_range(path, 0, 0, out, err, err_cap);
}

void aotx_gguf_close(aotx_gguf *g) { free_all(g); }
uint32_t aotx_gguf_version(const aotx_gguf *g) { return g->version; }
uint32_t aotx_gguf_alignment(const aotx_gguf *g) { return g->alignment; }
uint64_t aotx_gguf_data_offset(const aotx_gguf *g) { return g->data_off; }
uint64_t aotx_gguf_file_size(const aotx_gguf *g) { return g->size; }
int64_t aotx_gguf_n_kv(const aotx_gguf *g) { return g->n_kv; }
int64_t aotx_gguf_n_tensors(const aotx_gguf *g) { return g->n_tensors; }

int64_t aotx_gguf_find_key(const aotx_gguf *g, const char *key) {
    for (int64_t i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, key)) return i;
    return -1;
}

const char *aotx_gguf_key(const aotx_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? g->kv[i].key : NULL;
}

int32_t aotx_gguf_kv_type(const aotx_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? g->kv[i].type : -1;
}

/* Converts the scalar of type t at p; returns 0 or AOTX_E_GGUF_KEY. */
static int conv(int32_t t, const uint8_t *p, int64_t *iv, double *fv) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            float f32; uint64_t u64; int64_t i64; double f64; } u;
    int s = scalar_size(t);
    if (!s) return AOTX_E_GGUF_KEY;
    memcpy(&u, p, (size_t)s);
    int64_t i = 0;
    double f = 0;
    int is_int = 1;
    switch (t) {
    case AOTX_GGUF_U8: case AOTX_GGUF_BOOL: i = u.u8; break;
    case AOTX_GGUF_I8: i = u.i8; break;
    case AOTX_GGUF_U16: i = u.u16; break;
    case AOTX_GGUF_I16: i = u.i16; break;
    case AOTX_GGUF_U32: i = u.u32; break;
    case AOTX_GGUF_I32: i = u.i32; break;
    case AOTX_GGUF_U64: i = (int64_t)u.u64; break;
    case AOTX_GGUF_I64: i = u.i64; break;
    case AOTX_GGUF_F32: f = u.f32; is_int = 0; break;
    case AOTX_GGUF_F64: f = u.f64; is_int = 0; break;
    default: return AOTX_E_GGUF_KEY;
    }
    if (iv) {
        if (!is_int) return AOTX_E_GGUF_KEY;
        *iv = i;
    }
    if (fv) *fv = is_int ? (double)i : f;
    return 0;
}

int aotx_gguf_get_int(const aotx_gguf *g, int64_t i, int64_t *out) {
    if (i < 0 || i >= g->n_kv) return AOTX_E_GGUF_KEY;
    return conv(g->kv[i].type, g->map + g->kv[i].off, out, NULL);
}

int aotx_gguf_get_float(const aotx_gguf *g, int64_t i, double *out) {
    if (i < 0 || i >= g->n_kv) return AOTX_E_GGUF_KEY;
    return conv(g->kv[i].type, g->map + g->kv[i].off, NULL, out);
}

static void str_at(const aotx_gguf *g, uint64_t off, const char **ptr, uint64_t *len) {
    uint64_t n;
    memcpy(&n, g->map + off, 8);
    *ptr = (const char *)g->map + off + 8;
    *len = n;
}

int aotx_gguf_get_str(const aotx_gguf *g, int64_t i, const char **ptr, uint64_t *len) {
    if (i < 0 || i >= g->n_kv || g->kv[i].type != AOTX_GGUF_STRING) return AOTX_E_GGUF_KEY;
    str_at(g, g->kv[i].off, ptr, len);
    return 0;
}

int aotx_gguf_arr_info(const aotx_gguf *g, int64_t i, int32_t *elem_type, uint64_t *count) {
    if (i < 0 || i >= g->n_kv || g->kv[i].type != AOTX_GGUF_ARRAY) return AOTX_E_GGUF_KEY;
    *elem_type = g->kv[i].elem_type;
    *count = g->kv[i].count;
    return 0;
}

static const gguf_kv *arr_elem(const aotx_gguf *g, int64_t i, uint64_t j) {
    if (i < 0 || i >= g->n_kv || g->kv[i].type != AOTX_GGUF_ARRAY || j >= g->kv[i].count)
        return NULL;
    return &g->kv[i];
}

int aotx_gguf_arr_int(const aotx_gguf *g, int64_t i, uint64_t j, int64_t *out) {
    const gguf_kv *kv = arr_elem(g, i, j);
    if (!kv || kv->elem_type == AOTX_GGUF_STRING) return AOTX_E_GGUF_KEY;
    return conv(kv->elem_type, g->map + kv->off + j * (uint64_t)scalar_size(kv->elem_type), out,
                NULL);
}

int aotx_gguf_arr_float(const aotx_gguf *g, int64_t i, uint64_t j, double *out) {
    const gguf_kv *kv = arr_elem(g, i, j);
    if (!kv || kv->elem_type == AOTX_GGUF_STRING) return AOTX_E_GGUF_KEY;
    return conv(kv->elem_type, g->map + kv->off + j * (uint64_t)scalar_size(kv->elem_type), NULL,
                out);
}

int aotx_gguf_arr_str(const aotx_gguf *g, int64_t i, uint64_t j, const char **ptr, uint64_t *len) {
    const gguf_kv *kv = arr_elem(g, i, j);
    if (!kv || kv->elem_type != AOTX_GGUF_STRING) return AOTX_E_GGUF_KEY;
    str_at(g, kv->str_offs[j], ptr, len);
    return 0;
}

const void *aotx_gguf_arr_data(const aotx_gguf *g, int64_t i) {
    if (i < 0 || i >= g->n_kv || g->kv[i].type != AOTX_GGUF_ARRAY ||
        g->kv[i].elem_type == AOTX_GGUF_STRING)
        return NULL;
    return g->map + g->kv[i].off;
}

int64_t aotx_gguf_find_tensor(const aotx_gguf *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return i;
    return -1;
}

int aotx_gguf_tensor(const aotx_gguf *g, int64_t i, aotx_gguf_tensor_info *out) {
    if (i < 0 || i >= g->n_tensors) return AOTX_E_INVALID_ARGUMENT;
    *out = g->tensors[i];
    return 0;
}
