/* device_memory.c -- the memory table: retention (mode 1: an input's source
 * text and its embedding, two rows in one MEMORY transfer; mode 2 adds the
 * model's interpretation and its embedding in a second one), its replay at
 * recovery, the reads (list, one object), and recall (cosine ranking).
 * Layouts: docs/formats/device.md, "Memory rows" and "Memory transfer". */
#include "device_internal.h"

#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>

AOTX_STATIC_ASSERT(sizeof(aotx_memory_row) == AOTX_MEMORY_ROW_BYTES, "memory row is 128 bytes");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, version) == 16, "memory row: version at 16");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, kind) == 24, "memory row: kind at 24");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, byte_length) == 28, "memory row: length at 28");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, owner) == 32, "memory row: owner at 32");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, room) == 48, "memory row: room at 48");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, source) == 64, "memory row: source at 64");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, actor) == 80, "memory row: actor at 80");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, conversation) == 96, "memory row: conversation at 96");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, admission_number) == 112, "memory row: admission at 112");
AOTX_STATIC_ASSERT(offsetof(aotx_memory_row, dim) == 120, "memory row: dim at 120");
AOTX_STATIC_ASSERT(AOTX_MEMORY_MAX_DIM * 4 <= AOTX_MEMORY_PAYLOAD_MAX, "an embedding fits a row");
AOTX_STATIC_ASSERT(AOTX_MAX_TEXT_BYTES <= AOTX_MEMORY_PAYLOAD_MAX, "a text fits a row");

#define MEM_RECALL_MAX 64

/* What retaining the memory of receipt `slot` writes: the two rows and
 * their payloads (text, then dim little-endian float32s), or a code.  A
 * retention (rows[0] TEXT, the input's own text) or, in mode 2, an
 * interpretation (rows[0] INTERPRETATION, the model's text). */
typedef struct mem_plan {
    aotx_memory_row rows[2];
    const uint8_t *text;
    uint32_t text_len;
    uint8_t vec[AOTX_MEMORY_PAYLOAD_MAX];
} mem_plan;

static int check_vector(const uint8_t *vec_le, uint32_t dim) {
    if (dim == 0 || dim > AOTX_MEMORY_MAX_DIM) return AOTX_E_EMBEDDING_INVALID;
    for (uint32_t i = 0; i < dim; i++) {
        float f;
        uint32_t u = dev_rd32(vec_le + 4 * i);
        memcpy(&f, &u, 4);
        if (!isfinite(f)) return AOTX_E_EMBEDDING_INVALID;
    }
    return AOTX_OK;
}

/* The two rows of receipt `r` (in conversation `c`): rows[0] of `kind` holding
 * `text`, rows[1] its embedding, both recorded with `mode`. */
static void plan_rows(const aotx_device *d, const dev_receipt *r, uint32_t c, uint8_t kind,
                      uint8_t mode, const uint8_t *text, uint32_t tlen, const uint8_t *vec_le,
                      uint32_t dim, mem_plan *mp) {
    const dev_space *sp = &d->spaces[d->conversations[c].space];
    memset(mp->rows, 0, sizeof mp->rows);
    for (int k = 0; k < 2; k++) {
        aotx_memory_row *m = &mp->rows[k];
        dev_memory_id(d, (uint64_t)d->n_memory + 1 + (uint64_t)k, m->object);
        m->version = 1;
        m->kind = k == 0 ? kind : AOTX_MEMORY_EMBEDDING;
        m->scope = sp->scope;
        m->mode = mode;
        m->origin = AOTX_MEMORY_RETAINED;
        memcpy(m->owner, sp->id, 16);
        if (sp->scope == AOTX_SCOPE_ROOM) memcpy(m->room, sp->id, 16);
        memcpy(m->actor, d->participants[r->actor].key, 16);
        memcpy(m->conversation, r->resource_id, 16);
        m->admission_number = r->admission_number;
    }
    mp->text = text;
    mp->text_len = tlen;
    mp->rows[0].byte_length = tlen;
    memcpy(mp->rows[0].source, r->op_id, 16);
    mp->rows[1].byte_length = 4 * dim;
    mp->rows[1].dim = dim;
    memcpy(mp->rows[1].source, mp->rows[0].object, 16);
    memcpy(mp->vec, vec_le, 4 * (size_t)dim);
}

static int plan_retention(const aotx_device *d, uint32_t slot, uint8_t mode,
                          const uint8_t *vec_le, uint32_t dim, mem_plan *mp) {
    if (slot == DEV_NONE) return AOTX_E_OPERATION_NOT_FOUND;
    const dev_receipt *r = &d->receipts[slot];
    if (r->kind != AOTX_KIND_INPUT) return AOTX_E_OPERATION_NOT_FOUND;
    if (r->retained) return AOTX_E_MEMORY_RETAINED;
    if (dev_terminal(r->status)) return AOTX_E_ALREADY_TERMINAL;
    if (mode != AOTX_RETENTION_MODE_1 && mode != AOTX_RETENTION_MODE_2)
        return AOTX_E_RETENTION_MODE_INVALID;
    /* retained after its lease: with the mode the lease row recorded */
    if (r->leased && r->lease_mode != mode) return AOTX_E_RETENTION_MODE_INVALID;
    int rc = check_vector(vec_le, dim);
    if (rc) return rc;
    uint32_t c = dev_find_conversation(d, r->resource_id);
    if (c == DEV_NONE) return AOTX_E_INTERNAL;
    if (d->n_memory + 2u > AOTX_MAX_MEMORY) return AOTX_R_MEMORY_FULL;
    /* the text: from the receipt's canonical INPUT bytes */
    const uint8_t *body = r->canon + AOTX_CANON_HEADER;
    uint32_t tlen = dev_rd16(body + 40), mlen = body[42], nmedia = body[43];
    plan_rows(d, r, c, AOTX_MEMORY_TEXT, mode, body + 48 + 33 * nmedia + mlen, tlen, vec_le,
              dim, mp);
    return AOTX_OK;
}

static int plan_interpretation(const aotx_device *d, uint32_t slot, const uint8_t *text,
                               uint32_t tlen, const uint8_t *vec_le, uint32_t dim,
                               mem_plan *mp) {
    if (slot == DEV_NONE) return AOTX_E_OPERATION_NOT_FOUND;
    const dev_receipt *r = &d->receipts[slot];
    if (r->kind != AOTX_KIND_INPUT) return AOTX_E_OPERATION_NOT_FOUND;
    if (!r->retained || r->mode != AOTX_RETENTION_MODE_2) return AOTX_E_RETENTION_MODE_INVALID;
    if (r->interpreted) return AOTX_E_MEMORY_RETAINED;
    if (dev_terminal(r->status)) return AOTX_E_ALREADY_TERMINAL;
    if (tlen == 0 || tlen > AOTX_MAX_TEXT_BYTES || !dev_utf8_valid(text, tlen))
        return AOTX_E_TEXT_INVALID;
    int rc = check_vector(vec_le, dim);
    if (rc) return rc;
    uint32_t c = dev_find_conversation(d, r->resource_id);
    if (c == DEV_NONE) return AOTX_E_INTERNAL;
    /* not promised at admission: room next to the rows promised to other inputs */
    if ((uint64_t)d->n_memory + 2u * dev_memory_promised(d) + 2u > AOTX_MAX_MEMORY)
        return AOTX_R_MEMORY_FULL;
    plan_rows(d, r, c, AOTX_MEMORY_INTERPRETATION, AOTX_RETENTION_MODE_2, text, tlen, vec_le,
              dim, mp);
    return AOTX_OK;
}

static size_t transfer_encode(const mem_plan *mp, uint8_t *buf) {
    memset(buf, 0, AOTX_MEMORY_HEADER);
    buf[0] = 1;
    buf[1] = 2;    /* row count */
    size_t at = AOTX_MEMORY_HEADER;
    for (int k = 0; k < 2; k++, at += AOTX_MEMORY_ROW_BYTES) dev_memory_row_encode(&mp->rows[k], buf + at);
    memcpy(buf + at, mp->text, mp->text_len);
    at += mp->text_len;
    memcpy(buf + at, mp->vec, mp->rows[1].byte_length);
    return at + mp->rows[1].byte_length;
}

static void apply_plan(aotx_device *d, uint32_t slot, const mem_plan *mp, uint64_t record) {
    for (int k = 0; k < 2; k++) {
        dev_memory *m = &d->memory[d->n_memory++];
        m->row = mp->rows[k];
        m->record = record;
        if (k == 0) memcpy(m->payload, mp->text, mp->text_len);
        else memcpy(m->payload, mp->vec, mp->rows[1].byte_length);
    }
    dev_receipt *r = &d->receipts[slot];
    if (mp->rows[0].kind == AOTX_MEMORY_INTERPRETATION) {
        r->interpreted = 1;
    } else {
        r->retained = 1;
        r->mode = mp->rows[0].mode;
    }
    d->used = true;
}

static void vector_le(const float *embedding, uint32_t dim, uint8_t *vec) {
    for (uint32_t i = 0; i < dim; i++) {
        uint32_t u;
        memcpy(&u, &embedding[i], 4);
        dev_le32(vec + 4 * i, u);
    }
}

/* Journal the plan as one MEMORY transfer, then apply it. */
static int enqueue_plan(aotx_device *d, uint32_t slot, const mem_plan *mp, aotx_memory_row *out,
                        uint32_t *out_rows) {
    size_t len = transfer_encode(mp, d->scratch);
    uint64_t last = 0;
    int rc = aotx_journal_enqueue(d->journal, AOTX_XFER_MEMORY, d->scratch, (uint32_t)len, &last);
    if (rc != AOTX_OK) return rc;
    apply_plan(d, slot, mp, last);
    if (out) memcpy(out, mp->rows, sizeof mp->rows);
    *out_rows = 2;
    return AOTX_OK;
}

int dev_memory_retain_locked(aotx_device *d, const uint8_t op_id[16], uint8_t mode,
                             const float *embedding, uint32_t dim, aotx_memory_row *out,
                             uint32_t *out_rows) {
    if (!d || !op_id || !out_rows || (dim && !embedding)) return AOTX_E_INVALID_ARGUMENT;
    *out_rows = 0;
    uint32_t s = dev_find_receipt_by_op(d, op_id);
    if (s == DEV_NONE || d->receipts[s].kind != AOTX_KIND_INPUT)
        return AOTX_E_OPERATION_NOT_FOUND;
    if (!d->receipts[s].retains) return AOTX_OK;    /* no text: nothing to retain */
    if (d->receipts[s].admission_record >= dev_saved_records(d)) return AOTX_R_ADMISSION_UNSAVED;
    if (dim > AOTX_MEMORY_MAX_DIM) return AOTX_E_EMBEDDING_INVALID;
    uint8_t vec[AOTX_MEMORY_PAYLOAD_MAX];
    vector_le(embedding, dim, vec);
    mem_plan *mp = malloc(sizeof *mp);
    if (!mp) return AOTX_E_NOMEM;
    int rc = plan_retention(d, s, mode, vec, dim, mp);
    if (rc == AOTX_OK) rc = enqueue_plan(d, s, mp, out, out_rows);
    free(mp);
    return rc;
}

int dev_memory_interpret_locked(aotx_device *d, const uint8_t op_id[16], const uint8_t *text,
                                uint32_t text_len, const float *embedding, uint32_t dim,
                                aotx_memory_row *out, uint32_t *out_rows) {
    if (!d || !op_id || !out_rows || (dim && !embedding) || (text_len && !text))
        return AOTX_E_INVALID_ARGUMENT;
    *out_rows = 0;
    if (dim > AOTX_MEMORY_MAX_DIM) return AOTX_E_EMBEDDING_INVALID;
    uint8_t vec[AOTX_MEMORY_PAYLOAD_MAX];
    vector_le(embedding, dim, vec);
    mem_plan *mp = malloc(sizeof *mp);
    if (!mp) return AOTX_E_NOMEM;
    uint32_t s = dev_find_receipt_by_op(d, op_id);
    int rc = plan_interpretation(d, s, text, text_len, vec, dim, mp);
    if (rc == AOTX_OK) rc = enqueue_plan(d, s, mp, out, out_rows);
    free(mp);
    return rc;
}

/* Recovery: the transfer must be exactly what retaining (or, for an
 * INTERPRETATION first row, interpreting) its input's memory at this point of
 * the replay writes: same rows, the input's own text, the recorded mode. */
int dev_memory_replay(aotx_device *d, const uint8_t *data, uint32_t len, uint64_t record) {
    if (len < AOTX_MEMORY_HEADER + 2 * AOTX_MEMORY_ROW_BYTES || data[0] != 1 || data[1] != 2 ||
        !dev_is_zero(data + 2, 6))
        return AOTX_E_RECOVERY_DAMAGE;
    const uint8_t *r0 = data + AOTX_MEMORY_HEADER, *r1 = r0 + AOTX_MEMORY_ROW_BYTES;
    uint32_t slot = dev_find_receipt_by_op(d, r0 + 64);
    uint32_t dim = dev_rd32(r1 + 120);
    if (slot == DEV_NONE || !d->receipts[slot].retains || dim == 0 || dim > AOTX_MEMORY_MAX_DIM)
        return AOTX_E_RECOVERY_DAMAGE;
    const uint8_t *payload = r1 + AOTX_MEMORY_ROW_BYTES;
    uint32_t tlen = dev_rd32(r0 + 28);
    if ((uint64_t)AOTX_MEMORY_HEADER + 2 * AOTX_MEMORY_ROW_BYTES + tlen + 4ull * dim != len)
        return AOTX_E_RECOVERY_DAMAGE;
    mem_plan *mp = malloc(sizeof *mp);
    if (!mp) return AOTX_E_NOMEM;
    int rc;
    if (r0[24] == AOTX_MEMORY_INTERPRETATION)
        rc = plan_interpretation(d, slot, payload, tlen, payload + tlen, dim, mp);
    else   /* the recorded mode, whatever the models qualify for today */
        rc = plan_retention(d, slot, r0[26], payload + tlen, dim, mp);
    if (rc == AOTX_OK) {
        uint8_t *again = d->scratch;
        size_t n = transfer_encode(mp, again);
        if (n != len || memcmp(again, data, len) != 0) rc = AOTX_E_RECOVERY_DAMAGE;
    } else {
        rc = AOTX_E_RECOVERY_DAMAGE;
    }
    if (rc == AOTX_OK) apply_plan(d, slot, mp, record);
    free(mp);
    return rc;
}

/* ---- publication (a PUBLISH admission) ------------------------------------ */

/* The source of a publication: a saved TEXT row (with its EMBEDDING row next to it)
 * the actor may read, at the named version; then room for two rows; the result. */
int dev_publish_prepare(const aotx_device *d, uint32_t grants, dev_plan *pl) {
    const aotx_request *q = pl->req;
    uint32_t src = DEV_NONE;
    for (uint32_t i = 0; i < d->n_memory; i++)
        if (memcmp(d->memory[i].row.object, q->object, 16) == 0) { src = i; break; }
    if (src == DEV_NONE || !(d->memory[src].record < dev_saved_records(d)))
        return AOTX_E_MEMORY_NOT_FOUND;
    const aotx_memory_row *row = &d->memory[src].row;
    uint32_t owner = dev_find_space(d, row->owner);
    if (!(dev_resolved_rights(d, owner, pl->actor) & grants & AOTX_RIGHT_READ))
        return AOTX_E_MEMORY_NOT_FOUND;   /* the source is not visible to the publisher */
    if (row->kind != AOTX_MEMORY_TEXT || src + 1 >= d->n_memory ||
        d->memory[src + 1].row.kind != AOTX_MEMORY_EMBEDDING ||
        memcmp(d->memory[src + 1].row.source, row->object, 16) != 0)
        return AOTX_E_PUBLICATION_UNSUPPORTED;
    if (row->version != q->source_version) return AOTX_E_VERSION_CONFLICT;
    if ((uint64_t)d->n_memory + 2u * dev_memory_promised(d) + 2u > AOTX_MAX_MEMORY)
        return AOTX_R_MEMORY_FULL;
    pl->memory_src = src;
    uint8_t a[16], b[16];
    dev_memory_id(d, (uint64_t)d->n_memory + 1, a);
    dev_memory_id(d, (uint64_t)d->n_memory + 2, b);
    char sp[80], t[80], e[80], s[80];
    dev_res_id(d, "spc", q->space, sp);
    dev_res_id(d, "mem", a, t);
    dev_res_id(d, "mem", b, e);
    dev_res_id(d, "mem", row->object, s);
    int n = snprintf((char *)pl->result, sizeof pl->result,
                     "{\"space\":\"%s\",\"objects\":[\"%s\",\"%s\"],\"source\":\"%s\","
                     "\"source_version\":\"%llu\"}",
                     sp, t, e, s, (unsigned long long)row->version);
    pl->result_len = n > 0 && (size_t)n < sizeof pl->result ? (uint32_t)n : 0;
    return AOTX_OK;
}

/* Copies of the source text row and its embedding row, owned by the destination
 * space; the copies' `record` is the admission's, so they read once it is saved. */
void dev_publish_apply(aotx_device *d, const dev_plan *pl, uint64_t record) {
    const dev_space *dst = &d->spaces[pl->space];
    uint8_t text_id[16];
    for (uint32_t k = 0; k < 2; k++) {
        const dev_memory *from = &d->memory[pl->memory_src + k];
        dev_memory *m = &d->memory[d->n_memory];
        m->row = from->row;
        dev_memory_id(d, (uint64_t)d->n_memory + 1, m->row.object);
        m->row.version = 1;
        m->row.origin = AOTX_MEMORY_PUBLISHED;
        m->row.scope = dst->scope;
        memcpy(m->row.owner, dst->id, 16);
        memset(m->row.room, 0, 16);
        if (dst->scope == AOTX_SCOPE_ROOM) memcpy(m->row.room, dst->id, 16);
        /* provenance: the text copy names its source object; the embedding copy its text */
        memcpy(m->row.source, k == 0 ? from->row.object : text_id, 16);
        if (k == 0) memcpy(text_id, m->row.object, 16);
        m->row.admission_number = pl->admission_number;
        memcpy(m->payload, from->payload, from->row.byte_length);
        m->record = record;
        d->n_memory++;
    }
}

/* ---- reads -------------------------------------------------------------- */

static bool saved(const aotx_device *d, const dev_memory *m) {
    return m->record < dev_saved_records(d);
}

int dev_memory_list_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                           const uint8_t space[16], uint64_t cursor, uint32_t limit,
                           aotx_memory_row *out, uint32_t *out_n, uint64_t *out_next) {
    if (!d || !actor || !space || !out_n || !out_next || (limit && !out))
        return AOTX_E_INVALID_ARGUMENT;
    uint32_t s;
    int rc = dev_space_for_read(d, grants, actor, space, &s);
    if (rc) return rc;
    if (cursor > d->n_memory) return AOTX_E_CURSOR_INVALID;
    uint32_t n = 0;
    uint64_t i = cursor;
    for (; i < d->n_memory && n < limit; i++) {
        const dev_memory *m = &d->memory[i];
        if (memcmp(m->row.owner, d->spaces[s].id, 16) != 0 || !saved(d, m)) continue;
        out[n++] = m->row;
    }
    *out_n = n;
    *out_next = i < d->n_memory ? i : 0;
    return AOTX_OK;
}

int64_t dev_memory_read_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                               const uint8_t space[16], const uint8_t object[16],
                               uint64_t offset, uint8_t *buf, size_t cap, aotx_memory_row *row) {
    if (!d || !actor || !space || !object || !row || (cap && !buf)) return AOTX_E_INVALID_ARGUMENT;
    uint32_t s;
    int rc = dev_space_for_read(d, grants, actor, space, &s);
    if (rc) return rc;
    for (uint32_t i = 0; i < d->n_memory; i++) {
        const dev_memory *m = &d->memory[i];
        if (memcmp(m->row.object, object, 16) != 0) continue;
        if (memcmp(m->row.owner, d->spaces[s].id, 16) != 0 || !saved(d, m)) break;
        *row = m->row;
        if (offset >= m->row.byte_length) return 0;
        size_t n = m->row.byte_length - (size_t)offset;
        if (n > cap) n = cap;
        memcpy(buf, m->payload + offset, n);
        return (int64_t)n;
    }
    return AOTX_E_MEMORY_NOT_FOUND;
}

static float vec_at(const uint8_t *p, uint32_t i) {
    uint32_t u = dev_rd32(p + 4 * i);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* dot(payload, q) and |payload|^2 of a stored little-endian float32 vector: eight
 * float lanes (the compiler vectorises them), summed in double at the end. */
static void row_dot(const uint8_t *payload, const float *q, uint32_t dim, double *dot,
                    double *norm) {
    float v[AOTX_MEMORY_MAX_DIM];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(v, payload, 4 * (size_t)dim);
#else
    for (uint32_t k = 0; k < dim; k++) v[k] = vec_at(payload, k);
#endif
    float d[8] = {0}, n[8] = {0};
    uint32_t k = 0;
    for (; k + 8 <= dim; k += 8)
        for (int l = 0; l < 8; l++) {
            d[l] += v[k + l] * q[k + l];
            n[l] += v[k + l] * v[k + l];
        }
    double ds = 0, ns = 0;
    for (int l = 0; l < 8; l++) {
        ds += d[l];
        ns += n[l];
    }
    for (; k < dim; k++) {
        ds += (double)v[k] * q[k];
        ns += (double)v[k] * v[k];
    }
    *dot = ds;
    *norm = ns;
}

int dev_memory_recall_locked(aotx_device *d, const uint8_t actor[16], const uint8_t space[16],
                             const float *query, uint32_t dim, const uint8_t *exclude,
                             uint32_t limit, aotx_memory_row *out, float *out_score,
                             uint32_t *out_n) {
    if (!d || !actor || !space || !out_n || (dim && !query) || (limit && (!out || !out_score)))
        return AOTX_E_INVALID_ARGUMENT;
    *out_n = 0;
    if (dim == 0 || dim > AOTX_MEMORY_MAX_DIM) return AOTX_E_EMBEDDING_INVALID;
    if (limit > MEM_RECALL_MAX) limit = MEM_RECALL_MAX;
    if (limit == 0) return AOTX_OK;
    uint32_t s = dev_find_space(d, space);
    if (s == DEV_NONE) return AOTX_E_SPACE_NOT_FOUND;
    if (!(dev_resolved_rights(d, s, dev_find_participant(d, actor)) & AOTX_RIGHT_READ))
        return AOTX_OK;    /* the actor may see none of it */
    double qn = 0;
    for (uint32_t k = 0; k < dim; k++) qn += (double)query[k] * query[k];
    if (!(qn > 0)) return AOTX_OK;
    uint32_t best[MEM_RECALL_MAX];
    float score[MEM_RECALL_MAX];
    uint32_t n = 0;
    /* retention appends a TEXT (or INTERPRETATION) row and its EMBEDDING row together */
    for (uint32_t i = 0; i + 1 < d->n_memory; i++) {
        const dev_memory *t = &d->memory[i], *e = &d->memory[i + 1];
        if ((t->row.kind != AOTX_MEMORY_TEXT && t->row.kind != AOTX_MEMORY_INTERPRETATION) ||
            e->row.kind != AOTX_MEMORY_EMBEDDING ||
            e->row.dim != dim || memcmp(t->row.owner, d->spaces[s].id, 16) != 0 ||
            !saved(d, e))
            continue;
        if (exclude && memcmp(t->row.source, exclude, 16) == 0) continue;
        double dot, en;
        row_dot(e->payload, query, dim, &dot, &en);
        if (!(en > 0)) continue;
        float sc = (float)(dot / (sqrt(qn) * sqrt(en)));
        uint32_t at;   /* insertion into the sorted top list */
        if (n < limit) at = n++;
        else if (sc > score[limit - 1]) at = limit - 1;
        else continue;
        while (at > 0 && score[at - 1] < sc) {
            score[at] = score[at - 1];
            best[at] = best[at - 1];
            at--;
        }
        score[at] = sc;
        best[at] = i;
    }
    for (uint32_t k = 0; k < n; k++) {
        out[k] = d->memory[best[k]].row;
        out_score[k] = score[k];
    }
    *out_n = n;
    return AOTX_OK;
}
