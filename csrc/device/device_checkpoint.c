/* device_checkpoint.c -- the device's state tables as one checksummed
 * section tied to a journal position (docs/formats/checkpoint.md).
 *
 * Section = 192-byte header, six tables (each a 16-byte table header and its
 * rows), a 32-byte SHA-256 trailer over everything before it.  One encoder
 * and one parser per table: a table that gains fields bumps its own version.
 * Loading checks everything before it returns (indices, lengths, reserved
 * bytes); the caller seeks the journal reader to the anchor and replays the
 * suffix through aotx_device_recover (device_recover.c checks the reader is
 * there). */
#include "device_internal.h"

#include <stddef.h>

/* ---- layout ------------------------------------------------------------ */

static const uint8_t CK_MAGIC[8] = {'A', 'O', 'T', 'X', 'C', 'K', 'P', 'T'};

enum {
    CK_VERSION = 1,
    CK_HEADER = 192,
    CK_TRAILER = 32,
    CK_TABLES = 6,
    CK_TABLE_HEADER = 16,

    /* header */
    CKH_MAGIC = 0, CKH_VERSION = 8, CKH_HEADER_LEN = 12, CKH_SECTION_LEN = 16,
    CKH_TABLES = 24, CKH_RESERVED0 = 28, CKH_LINEAGE = 32, CKH_INCARNATION = 48,
    CKH_RECORDS = 56, CKH_BOOT = 64, CKH_GENERATION = 72, CKH_ADMISSIONS = 80,
    CKH_RESERVED1 = 88, CKH_PREV_DIGEST = 96, CKH_DIGEST = 128, CKH_RESERVED2 = 160,

    /* table header */
    CKT_TAG = 0, CKT_VERSION = 2, CKT_ROWS = 4, CKT_LENGTH = 8,

    /* table tags, in section order */
    CK_TAG_PARTICIPANTS = 1, CK_TAG_SPACES = 2, CK_TAG_MEMBERS = 3,
    CK_TAG_CONVERSATIONS = 4, CK_TAG_RECEIPTS = 5, CK_TAG_MEMORY = 6,

    /* participants v1 */
    CKP_KEY = 0, CKP_NEXT = 16, CKP_FLOOR = 24, CKP_ADMISSION = 32, CKP_ROW = 40,
    /* spaces v1 */
    CKS_ID = 0, CKS_OWNER = 16, CKS_SCOPE = 20, CKS_RESERVED = 21, CKS_ADMISSION = 24,
    CKS_CONVERSATIONS = 32, CKS_ROW = 40,
    /* members v1 */
    CKM_SPACE = 0, CKM_RIGHTS = 4, CKM_RESERVED = 5, CKM_KEY = 8, CKM_ROW = 24,
    /* conversations v1 */
    CKC_ID = 0, CKC_SPACE = 16, CKC_CREATOR = 20, CKC_ADMISSION = 24, CKC_INPUTS = 32,
    CKC_ROW = 40,
    /* receipts v1: fixed part, then canon_len canonical bytes, then result_len result bytes */
    CKR_SLOT = 0, CKR_KIND = 4, CKR_STATUS = 5, CKR_FLAGS = 6, CKR_FINISH = 7, CKR_ACTOR = 8,
    CKR_CANON_LEN = 12, CKR_SEQUENCE = 16, CKR_OP_KEY = 24, CKR_OP_ID = 40,
    CKR_RESOURCE = 56, CKR_ADMISSION = 72, CKR_ADM_RECORD = 80, CKR_TERM_RECORD = 88,
    CKR_RETIRE_RECORD = 96, CKR_INPUT_INDEX = 104, CKR_IN_TOK = 112, CKR_OUT_TOK = 116,
    CKR_RESULT_LEN = 120, CKR_LEASED = 124, CKR_LEASE_REVISION = 125, CKR_LEASE_MODE = 126,
    CKR_MODE = 127, CKR_SAVE_INCARNATION = 128,
    CKR_SAVE_GENERATION = 136, CKR_SAVE_BOOT = 144, CKR_SAVE_RECORDS = 152,
    CKR_SAVE_DIGEST = 160, CKR_FIXED = 192,
    /* receipt flag bits */
    CKF_RETIRING = 1, CKF_CANCEL = 2, CKF_TERMINAL = 4, CKF_SAVE_KNOWN = 8, CKF_RETAINS = 16,
    CKF_RETAINED = 32, CKF_INTERPRETED = 64, CKF_ALL = 127,
    /* memory v1: record, the 128-byte row (docs/formats/device.md), byte_length payload bytes */
    CKY_RECORD = 0, CKY_ROW = 8, CKY_FIXED = 8 + AOTX_MEMORY_ROW_BYTES,
};

AOTX_STATIC_ASSERT(CKH_RESERVED2 + 32 == CK_HEADER, "checkpoint header is 192 bytes");
AOTX_STATIC_ASSERT(CKT_LENGTH + 8 == CK_TABLE_HEADER, "table header is 16 bytes");
AOTX_STATIC_ASSERT(CKP_ADMISSION + 8 == CKP_ROW, "participant row is 40 bytes");
AOTX_STATIC_ASSERT(CKS_CONVERSATIONS + 8 == CKS_ROW, "space row is 40 bytes");
AOTX_STATIC_ASSERT(CKM_KEY + 16 == CKM_ROW, "member row is 24 bytes");
AOTX_STATIC_ASSERT(CKC_INPUTS + 8 == CKC_ROW, "conversation row is 40 bytes");
AOTX_STATIC_ASSERT(CKR_SAVE_DIGEST + 32 == CKR_FIXED, "receipt row fixed part is 192 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_save_id) == CKR_FIXED - CKR_SAVE_INCARNATION,
                   "a save identity is 64 bytes");
AOTX_STATIC_ASSERT(CKY_FIXED == 136, "memory row fixed part is 136 bytes");

typedef struct ck_writer {
    uint8_t *buf;   /* NULL: size only */
    size_t cap, pos;
} ck_writer;

/* Room for n more bytes at w->pos (always true when only sizing). */
static uint8_t *ck_put(ck_writer *w, size_t n) {
    uint8_t *p = NULL;
    if (w->buf && w->pos + n <= w->cap) {
        p = w->buf + w->pos;
        memset(p, 0, n);
    }
    w->pos += n;
    return p;
}

typedef struct ck_reader {
    const uint8_t *buf;
    size_t len, pos;
    uint64_t bad;   /* offset of the first bad byte */
} ck_reader;

static int ck_bad(ck_reader *r, size_t off) {
    r->bad = off;
    return AOTX_E_RECOVERY_DAMAGE;
}

/* ---- per-table encoders -------------------------------------------------- */

static uint8_t *table_begin(ck_writer *w, uint16_t tag, uint32_t rows, size_t *at) {
    *at = w->pos;
    uint8_t *h = ck_put(w, CK_TABLE_HEADER);
    if (h) {
        dev_le16(h + CKT_TAG, tag);
        dev_le16(h + CKT_VERSION, 1);
        dev_le32(h + CKT_ROWS, rows);
    }
    return h;
}

static void table_end(ck_writer *w, size_t at) {
    if (w->buf && at + CK_TABLE_HEADER <= w->cap)
        dev_le64(w->buf + at + CKT_LENGTH, (uint64_t)(w->pos - at - CK_TABLE_HEADER));
}

static void enc_participants(const aotx_device *d, ck_writer *w) {
    size_t at;
    table_begin(w, CK_TAG_PARTICIPANTS, d->n_participants, &at);
    for (uint32_t i = 0; i < d->n_participants; i++) {
        const dev_participant *p = &d->participants[i];
        uint8_t *b = ck_put(w, CKP_ROW);
        if (!b) continue;
        memcpy(b + CKP_KEY, p->key, 16);
        dev_le64(b + CKP_NEXT, p->next_sequence);
        dev_le64(b + CKP_FLOOR, p->retry_floor);
        dev_le64(b + CKP_ADMISSION, p->admission_number);
    }
    table_end(w, at);
}

static void enc_spaces(const aotx_device *d, ck_writer *w) {
    size_t at;
    table_begin(w, CK_TAG_SPACES, d->n_spaces, &at);
    for (uint32_t i = 0; i < d->n_spaces; i++) {
        const dev_space *s = &d->spaces[i];
        uint8_t *b = ck_put(w, CKS_ROW);
        if (!b) continue;
        memcpy(b + CKS_ID, s->id, 16);
        dev_le32(b + CKS_OWNER, s->owner);
        b[CKS_SCOPE] = s->scope;
        dev_le64(b + CKS_ADMISSION, s->admission_number);
        dev_le64(b + CKS_CONVERSATIONS, s->conversations);
    }
    table_end(w, at);
}

static void enc_members(const aotx_device *d, ck_writer *w) {
    size_t at;
    table_begin(w, CK_TAG_MEMBERS, d->n_members, &at);
    for (uint32_t i = 0; i < d->n_members; i++) {
        const dev_member *m = &d->members[i];
        uint8_t *b = ck_put(w, CKM_ROW);
        if (!b) continue;
        dev_le32(b + CKM_SPACE, m->space);
        b[CKM_RIGHTS] = m->rights;
        memcpy(b + CKM_KEY, m->key, 16);
    }
    table_end(w, at);
}

static void enc_conversations(const aotx_device *d, ck_writer *w) {
    size_t at;
    table_begin(w, CK_TAG_CONVERSATIONS, d->n_conversations, &at);
    for (uint32_t i = 0; i < d->n_conversations; i++) {
        const dev_conversation *c = &d->conversations[i];
        uint8_t *b = ck_put(w, CKC_ROW);
        if (!b) continue;
        memcpy(b + CKC_ID, c->id, 16);
        dev_le32(b + CKC_SPACE, c->space);
        dev_le32(b + CKC_CREATOR, c->creator);
        dev_le64(b + CKC_ADMISSION, c->admission_number);
        dev_le64(b + CKC_INPUTS, c->inputs);
    }
    table_end(w, at);
}

static void enc_receipts(const aotx_device *d, ck_writer *w) {
    size_t at;
    table_begin(w, CK_TAG_RECEIPTS, d->n_receipts, &at);
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        const dev_receipt *r = &d->receipts[i];
        if (!r->used) continue;
        uint8_t *b = ck_put(w, CKR_FIXED);
        uint8_t *canon = ck_put(w, r->canon_len);
        uint8_t *result = ck_put(w, r->result_len);
        if (!b || !canon || !result) continue;
        dev_le32(b + CKR_SLOT, i);
        b[CKR_KIND] = r->kind;
        /* `running` is not saved state: replay leaves a started input admitted */
        b[CKR_STATUS] = r->status == AOTX_STATUS_RUNNING ? AOTX_STATUS_ADMITTED : r->status;
        b[CKR_FLAGS] = (uint8_t)((r->retiring ? CKF_RETIRING : 0) |
                                 (r->cancel_requested ? CKF_CANCEL : 0) |
                                 (r->has_terminal_record ? CKF_TERMINAL : 0) |
                                 (r->save_known ? CKF_SAVE_KNOWN : 0) |
                                 (r->retains ? CKF_RETAINS : 0) | (r->retained ? CKF_RETAINED : 0) |
                                 (r->interpreted ? CKF_INTERPRETED : 0));
        b[CKR_FINISH] = r->finish;
        /* the lease and the recorded retention mode; a checkpoint holds saved state only,
         * so no OUTPUT transfer is unsaved (output_visible is moot) */
        b[CKR_LEASED] = r->leased;
        b[CKR_LEASE_REVISION] = r->lease_revision;
        b[CKR_LEASE_MODE] = r->lease_mode;
        b[CKR_MODE] = r->mode;
        dev_le32(b + CKR_ACTOR, r->actor);
        dev_le32(b + CKR_CANON_LEN, r->canon_len);
        dev_le64(b + CKR_SEQUENCE, r->sequence);
        memcpy(b + CKR_OP_KEY, r->op_key, 16);
        memcpy(b + CKR_OP_ID, r->op_id, 16);
        memcpy(b + CKR_RESOURCE, r->resource_id, 16);
        dev_le64(b + CKR_ADMISSION, r->admission_number);
        dev_le64(b + CKR_ADM_RECORD, r->admission_record);
        dev_le64(b + CKR_TERM_RECORD, r->terminal_record);
        dev_le64(b + CKR_RETIRE_RECORD, r->retire_record);
        dev_le64(b + CKR_INPUT_INDEX, r->input_index);
        dev_le32(b + CKR_IN_TOK, r->input_tokens);
        dev_le32(b + CKR_OUT_TOK, r->output_tokens);
        dev_le32(b + CKR_RESULT_LEN, r->result_len);
        dev_le64(b + CKR_SAVE_INCARNATION, r->save.file_incarnation);
        dev_le64(b + CKR_SAVE_GENERATION, r->save.generation);
        dev_le64(b + CKR_SAVE_BOOT, r->save.boot);
        dev_le64(b + CKR_SAVE_RECORDS, r->save.commit_records);
        memcpy(b + CKR_SAVE_DIGEST, r->save.commit_digest, 32);
        memcpy(canon, r->canon, r->canon_len);
        memcpy(result, r->result, r->result_len);
    }
    table_end(w, at);
}

static void memory_row_decode(const uint8_t *b, aotx_memory_row *r) {
    memset(r, 0, sizeof *r);
    memcpy(r->object, b, 16);
    r->version = dev_rd64(b + 16);
    r->kind = b[24];
    r->scope = b[25];
    r->mode = b[26];
    r->origin = b[27];
    r->byte_length = dev_rd32(b + 28);
    memcpy(r->owner, b + 32, 16);
    memcpy(r->room, b + 48, 16);
    memcpy(r->source, b + 64, 16);
    memcpy(r->actor, b + 80, 16);
    memcpy(r->conversation, b + 96, 16);
    r->admission_number = dev_rd64(b + 112);
    r->dim = dev_rd32(b + 120);
    r->reserved1 = dev_rd32(b + 124);
}

static void enc_memory(const aotx_device *d, ck_writer *w) {
    size_t at;
    table_begin(w, CK_TAG_MEMORY, d->n_memory, &at);
    for (uint32_t i = 0; i < d->n_memory; i++) {
        const dev_memory *m = &d->memory[i];
        uint8_t *b = ck_put(w, CKY_FIXED);
        uint8_t *payload = ck_put(w, m->row.byte_length);
        if (!b || !payload) continue;
        dev_le64(b + CKY_RECORD, m->record);
        dev_memory_row_encode(&m->row, b + CKY_ROW);
        memcpy(payload, m->payload, m->row.byte_length);
    }
    table_end(w, at);
}

/* ---- encode ---------------------------------------------------------------- */

/* Everything in the tables lies inside the anchor's records (and every
 * receipt knows its save): else the checkpoint would claim state the journal
 * prefix does not hold. */
static bool checkpointable(const aotx_device *d, uint64_t records) {
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        const dev_receipt *r = &d->receipts[i];
        if (!r->used) continue;
        if (!r->save_known || r->admission_record >= records ||
            (r->has_terminal_record && r->terminal_record >= records) ||
            (r->retiring && r->retire_record >= records))
            return false;
    }
    for (uint32_t i = 0; i < d->n_memory; i++)
        if (d->memory[i].record >= records) return false;
    return true;
}

static int checkpoint_encode_locked(aotx_device *d, const aotx_journal_anchor *a, uint8_t *buf,
                                    size_t cap, size_t *out_len) {
    if (!a || !out_len) return AOTX_E_INVALID_ARGUMENT;
    if (d->replaying || d->failed || a->records == 0) return AOTX_E_DEVICE_STATE;
    dev_reclaim(d);
    if (!checkpointable(d, a->records)) return AOTX_E_DEVICE_STATE;
    ck_writer sizer = {0};
    ck_writer *w = &sizer;
    for (int pass = 0; pass < 2; pass++) {
        w->pos = 0;
        uint8_t *h = ck_put(w, CK_HEADER);
        if (h) {
            memcpy(h + CKH_MAGIC, CK_MAGIC, 8);
            dev_le32(h + CKH_VERSION, CK_VERSION);
            dev_le32(h + CKH_HEADER_LEN, CK_HEADER);
            dev_le32(h + CKH_TABLES, CK_TABLES);
            memcpy(h + CKH_LINEAGE, d->lineage, 16);
            dev_le64(h + CKH_INCARNATION, a->file_incarnation);
            dev_le64(h + CKH_RECORDS, a->records);
            dev_le64(h + CKH_BOOT, a->boot);
            dev_le64(h + CKH_GENERATION, a->generation);
            dev_le64(h + CKH_ADMISSIONS, d->admissions);
            memcpy(h + CKH_PREV_DIGEST, a->prev_digest, 32);
            memcpy(h + CKH_DIGEST, a->digest, 32);
        }
        enc_participants(d, w);
        enc_spaces(d, w);
        enc_members(d, w);
        enc_conversations(d, w);
        enc_receipts(d, w);
        enc_memory(d, w);
        size_t body = w->pos;
        ck_put(w, CK_TRAILER);
        if (pass == 0) {
            *out_len = w->pos;
            if (!buf) return AOTX_OK;
            if (cap < w->pos) return AOTX_E_BUFFER_TOO_SMALL;
            sizer = (ck_writer){.buf = buf, .cap = cap};
            continue;
        }
        dev_le64(buf + CKH_SECTION_LEN, (uint64_t)w->pos);
        aotx_sha256(buf, body, buf + body);
    }
    return AOTX_OK;
}

int aotx_device_checkpoint_encode(aotx_device *d, const aotx_journal_anchor *a, uint8_t *buf,
                                  size_t cap, size_t *out_len) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    dev_stamp_saves(d);
    int rc = checkpoint_encode_locked(d, a, buf, cap, out_len);
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* ---- per-table parsers ----------------------------------------------------- */

/* The table header at r->pos: its tag, version 1, rows <= max; *end = the
 * offset just after its rows. */
static int table_open(ck_reader *r, uint16_t tag, uint32_t max, uint32_t *rows, size_t *end) {
    size_t at = r->pos;
    if (r->len - at < CK_TABLE_HEADER) return ck_bad(r, at);
    const uint8_t *h = r->buf + at;
    if (dev_rd16(h + CKT_TAG) != tag) return ck_bad(r, at + CKT_TAG);
    if (dev_rd16(h + CKT_VERSION) != 1) return ck_bad(r, at + CKT_VERSION);
    *rows = dev_rd32(h + CKT_ROWS);
    if (*rows > max) return ck_bad(r, at + CKT_ROWS);
    uint64_t length = dev_rd64(h + CKT_LENGTH);
    if (length > r->len - at - CK_TABLE_HEADER) return ck_bad(r, at + CKT_LENGTH);
    r->pos = at + CK_TABLE_HEADER;
    *end = r->pos + (size_t)length;
    return AOTX_OK;
}

/* A fixed-size table: rows * row bytes must be its length exactly. */
static int table_fixed(ck_reader *r, uint16_t tag, uint32_t max, size_t row, uint32_t *rows) {
    size_t end;
    size_t at = r->pos;
    int rc = table_open(r, tag, max, rows, &end);
    if (rc) return rc;
    if ((uint64_t)*rows * row != end - r->pos) return ck_bad(r, at + CKT_LENGTH);
    return AOTX_OK;
}

static int par_participants(aotx_device *d, ck_reader *r) {
    uint32_t n;
    int rc = table_fixed(r, CK_TAG_PARTICIPANTS, AOTX_MAX_PARTICIPANTS, CKP_ROW, &n);
    if (rc) return rc;
    for (uint32_t i = 0; i < n; i++, r->pos += CKP_ROW) {
        const uint8_t *b = r->buf + r->pos;
        dev_participant *p = &d->participants[i];
        memcpy(p->key, b + CKP_KEY, 16);
        p->next_sequence = dev_rd64(b + CKP_NEXT);
        p->retry_floor = dev_rd64(b + CKP_FLOOR);
        p->admission_number = dev_rd64(b + CKP_ADMISSION);
        if (p->retry_floor == 0 || p->retry_floor > p->next_sequence)
            return ck_bad(r, r->pos + CKP_FLOOR);
    }
    d->n_participants = n;
    return AOTX_OK;
}

static int par_spaces(aotx_device *d, ck_reader *r) {
    uint32_t n;
    int rc = table_fixed(r, CK_TAG_SPACES, AOTX_MAX_SPACES, CKS_ROW, &n);
    if (rc) return rc;
    for (uint32_t i = 0; i < n; i++, r->pos += CKS_ROW) {
        const uint8_t *b = r->buf + r->pos;
        dev_space *s = &d->spaces[i];
        memcpy(s->id, b + CKS_ID, 16);
        s->owner = dev_rd32(b + CKS_OWNER);
        s->scope = b[CKS_SCOPE];
        s->admission_number = dev_rd64(b + CKS_ADMISSION);
        s->conversations = dev_rd64(b + CKS_CONVERSATIONS);
        if (s->owner >= d->n_participants) return ck_bad(r, r->pos + CKS_OWNER);
        if (s->scope > AOTX_SCOPE_INSTANCE) return ck_bad(r, r->pos + CKS_SCOPE);
        if (!dev_is_zero(b + CKS_RESERVED, 3)) return ck_bad(r, r->pos + CKS_RESERVED);
    }
    d->n_spaces = n;
    return AOTX_OK;
}

static int par_members(aotx_device *d, ck_reader *r) {
    uint32_t n;
    int rc = table_fixed(r, CK_TAG_MEMBERS, AOTX_MAX_MEMBERS, CKM_ROW, &n);
    if (rc) return rc;
    for (uint32_t i = 0; i < n; i++, r->pos += CKM_ROW) {
        const uint8_t *b = r->buf + r->pos;
        dev_member *m = &d->members[i];
        m->space = dev_rd32(b + CKM_SPACE);
        m->rights = b[CKM_RIGHTS];
        memcpy(m->key, b + CKM_KEY, 16);
        if (m->space >= d->n_spaces) return ck_bad(r, r->pos + CKM_SPACE);
        if (m->rights & ~DEV_ALL_GRANTS) return ck_bad(r, r->pos + CKM_RIGHTS);
        if (!dev_is_zero(b + CKM_RESERVED, 3)) return ck_bad(r, r->pos + CKM_RESERVED);
    }
    d->n_members = n;
    return AOTX_OK;
}

static int par_conversations(aotx_device *d, ck_reader *r) {
    uint32_t n;
    int rc = table_fixed(r, CK_TAG_CONVERSATIONS, AOTX_MAX_CONVERSATIONS, CKC_ROW, &n);
    if (rc) return rc;
    for (uint32_t i = 0; i < n; i++, r->pos += CKC_ROW) {
        const uint8_t *b = r->buf + r->pos;
        dev_conversation *c = &d->conversations[i];
        memcpy(c->id, b + CKC_ID, 16);
        c->space = dev_rd32(b + CKC_SPACE);
        c->creator = dev_rd32(b + CKC_CREATOR);
        c->admission_number = dev_rd64(b + CKC_ADMISSION);
        c->inputs = dev_rd64(b + CKC_INPUTS);
        if (c->space >= d->n_spaces) return ck_bad(r, r->pos + CKC_SPACE);
        if (c->creator >= d->n_participants) return ck_bad(r, r->pos + CKC_CREATOR);
    }
    d->n_conversations = n;
    return AOTX_OK;
}

static int par_receipts(aotx_device *d, ck_reader *r, uint64_t records) {
    uint32_t n;
    size_t end;
    int rc = table_open(r, CK_TAG_RECEIPTS, DEV_RECEIPT_SLOTS, &n, &end);
    if (rc) return rc;
    for (uint32_t i = 0; i < n; i++) {
        size_t at = r->pos;
        if (end - at < CKR_FIXED) return ck_bad(r, at);
        const uint8_t *b = r->buf + at;
        uint32_t slot = dev_rd32(b + CKR_SLOT);
        uint32_t canon_len = dev_rd32(b + CKR_CANON_LEN), result_len = dev_rd32(b + CKR_RESULT_LEN);
        uint8_t flags = b[CKR_FLAGS];
        if (slot >= DEV_RECEIPT_SLOTS || d->receipts[slot].used) return ck_bad(r, at + CKR_SLOT);
        if (b[CKR_KIND] < AOTX_KIND_REGISTER || b[CKR_KIND] > AOTX_KIND_PUBLISH)
            return ck_bad(r, at + CKR_KIND);
        if (b[CKR_STATUS] > AOTX_STATUS_DEADLINE_EXCEEDED || b[CKR_STATUS] == AOTX_STATUS_RUNNING)
            return ck_bad(r, at + CKR_STATUS);
        if (flags & ~CKF_ALL || !(flags & CKF_SAVE_KNOWN)) return ck_bad(r, at + CKR_FLAGS);
        if (b[CKR_FINISH] > AOTX_FINISH_LENGTH) return ck_bad(r, at + CKR_FINISH);
        if (dev_rd32(b + CKR_ACTOR) >= d->n_participants) return ck_bad(r, at + CKR_ACTOR);
        if (canon_len > DEV_CANON_STRIDE) return ck_bad(r, at + CKR_CANON_LEN);
        if (result_len > DEV_RESULT_STRIDE) return ck_bad(r, at + CKR_RESULT_LEN);
        if (b[CKR_LEASED] > 1) return ck_bad(r, at + CKR_LEASED);
        if (b[CKR_LEASE_REVISION] > AOTX_LEASE_MAX_REVISION || (!b[CKR_LEASED] && b[CKR_LEASE_REVISION]))
            return ck_bad(r, at + CKR_LEASE_REVISION);
        if (b[CKR_LEASE_MODE] > 2 || (!b[CKR_LEASED] && b[CKR_LEASE_MODE]))
            return ck_bad(r, at + CKR_LEASE_MODE);
        if (b[CKR_MODE] > 2) return ck_bad(r, at + CKR_MODE);
        if ((uint64_t)end - at - CKR_FIXED < (uint64_t)canon_len + result_len)
            return ck_bad(r, at + CKR_CANON_LEN);
        dev_receipt *x = &d->receipts[slot];
        x->used = 1;
        x->kind = b[CKR_KIND];
        x->status = b[CKR_STATUS];
        x->retiring = (flags & CKF_RETIRING) != 0;
        x->cancel_requested = (flags & CKF_CANCEL) != 0;
        x->has_terminal_record = (flags & CKF_TERMINAL) != 0;
        x->save_known = 1;
        x->retains = (flags & CKF_RETAINS) != 0;
        x->retained = (flags & CKF_RETAINED) != 0;
        x->interpreted = (flags & CKF_INTERPRETED) != 0;
        x->leased = b[CKR_LEASED];
        x->lease_revision = b[CKR_LEASE_REVISION];
        x->lease_mode = b[CKR_LEASE_MODE];
        x->mode = b[CKR_MODE];
        x->finish = b[CKR_FINISH];
        x->actor = dev_rd32(b + CKR_ACTOR);
        x->sequence = dev_rd64(b + CKR_SEQUENCE);
        memcpy(x->op_key, b + CKR_OP_KEY, 16);
        memcpy(x->op_id, b + CKR_OP_ID, 16);
        memcpy(x->resource_id, b + CKR_RESOURCE, 16);
        x->admission_number = dev_rd64(b + CKR_ADMISSION);
        x->admission_record = dev_rd64(b + CKR_ADM_RECORD);
        x->terminal_record = dev_rd64(b + CKR_TERM_RECORD);
        x->retire_record = dev_rd64(b + CKR_RETIRE_RECORD);
        x->input_index = dev_rd64(b + CKR_INPUT_INDEX);
        x->input_tokens = dev_rd32(b + CKR_IN_TOK);
        x->output_tokens = dev_rd32(b + CKR_OUT_TOK);
        x->save.file_incarnation = dev_rd64(b + CKR_SAVE_INCARNATION);
        x->save.generation = dev_rd64(b + CKR_SAVE_GENERATION);
        x->save.boot = dev_rd64(b + CKR_SAVE_BOOT);
        x->save.commit_records = dev_rd64(b + CKR_SAVE_RECORDS);
        memcpy(x->save.commit_digest, b + CKR_SAVE_DIGEST, 32);
        x->canon_len = canon_len;
        x->result_len = result_len;
        memcpy(x->canon, b + CKR_FIXED, canon_len);
        memcpy(x->result, b + CKR_FIXED + canon_len, result_len);
        d->n_receipts++;
        if (x->admission_record >= records) return ck_bad(r, at + CKR_ADM_RECORD);
        if (x->has_terminal_record != dev_terminal(x->status) ||
            (x->has_terminal_record && x->terminal_record >= records))
            return ck_bad(r, at + CKR_TERM_RECORD);
        if (x->retiring && x->retire_record >= records) return ck_bad(r, at + CKR_RETIRE_RECORD);
        r->pos = at + CKR_FIXED + canon_len + result_len;
    }
    if (r->pos != end) return ck_bad(r, r->pos);
    return AOTX_OK;
}

static int par_memory(aotx_device *d, ck_reader *r, uint64_t records) {
    uint32_t n;
    size_t end;
    int rc = table_open(r, CK_TAG_MEMORY, AOTX_MAX_MEMORY, &n, &end);
    if (rc) return rc;
    for (uint32_t i = 0; i < n; i++) {
        size_t at = r->pos;
        if (end - at < CKY_FIXED) return ck_bad(r, at);
        dev_memory *m = &d->memory[i];
        m->record = dev_rd64(r->buf + at + CKY_RECORD);
        memory_row_decode(r->buf + at + CKY_ROW, &m->row);
        uint32_t len = m->row.byte_length;
        if (m->record >= records) return ck_bad(r, at + CKY_RECORD);
        if (len > AOTX_MEMORY_PAYLOAD_MAX || end - at - CKY_FIXED < len)
            return ck_bad(r, at + CKY_ROW + 28);
        memcpy(m->payload, r->buf + at + CKY_FIXED, len);
        d->n_memory = i + 1;
        r->pos = at + CKY_FIXED + len;
    }
    if (r->pos != end) return ck_bad(r, r->pos);
    return AOTX_OK;
}

/* ---- load ------------------------------------------------------------------ */

static int parse_header(const aotx_device *d, ck_reader *r, aotx_journal_anchor *a,
                        uint64_t *admissions) {
    const uint8_t *h = r->buf;
    if (r->len < CK_HEADER + CK_TRAILER || memcmp(h + CKH_MAGIC, CK_MAGIC, 8) != 0)
        return ck_bad(r, CKH_MAGIC);
    if (dev_rd32(h + CKH_VERSION) != CK_VERSION) return ck_bad(r, CKH_VERSION);
    if (dev_rd32(h + CKH_HEADER_LEN) != CK_HEADER) return ck_bad(r, CKH_HEADER_LEN);
    if (dev_rd64(h + CKH_SECTION_LEN) != r->len) return ck_bad(r, CKH_SECTION_LEN);
    uint8_t sum[32];
    aotx_sha256(h, r->len - CK_TRAILER, sum);
    if (memcmp(sum, h + r->len - CK_TRAILER, 32) != 0) return ck_bad(r, r->len - CK_TRAILER);
    if (dev_rd32(h + CKH_TABLES) != CK_TABLES) return ck_bad(r, CKH_TABLES);
    if (dev_rd32(h + CKH_RESERVED0)) return ck_bad(r, CKH_RESERVED0);
    if (!dev_is_zero(h + CKH_RESERVED1, 8)) return ck_bad(r, CKH_RESERVED1);
    if (!dev_is_zero(h + CKH_RESERVED2, 32)) return ck_bad(r, CKH_RESERVED2);
    if (memcmp(h + CKH_LINEAGE, d->lineage, 16) != 0) return AOTX_E_LINEAGE_MISMATCH;
    memset(a, 0, sizeof *a);
    a->file_incarnation = dev_rd64(h + CKH_INCARNATION);
    a->records = dev_rd64(h + CKH_RECORDS);
    a->boot = dev_rd64(h + CKH_BOOT);
    a->generation = dev_rd64(h + CKH_GENERATION);
    memcpy(a->prev_digest, h + CKH_PREV_DIGEST, 32);
    memcpy(a->digest, h + CKH_DIGEST, 32);
    *admissions = dev_rd64(h + CKH_ADMISSIONS);
    if (a->records == 0) return ck_bad(r, CKH_RECORDS);
    r->pos = CK_HEADER;
    return AOTX_OK;
}

static int checkpoint_load_locked(aotx_device *d, const uint8_t *buf, size_t len,
                                  aotx_journal_anchor *a, uint64_t *bad) {
    if (d->used || d->replaying || d->failed || d->ck_loaded || d->n_participants)
        return AOTX_E_DEVICE_STATE;
    ck_reader r = {.buf = buf, .len = len};
    uint64_t admissions = 0;
    int rc = parse_header(d, &r, a, &admissions);
    if (rc == AOTX_OK) rc = par_participants(d, &r);
    if (rc == AOTX_OK) rc = par_spaces(d, &r);
    if (rc == AOTX_OK) rc = par_members(d, &r);
    if (rc == AOTX_OK) rc = par_conversations(d, &r);
    if (rc == AOTX_OK) rc = par_receipts(d, &r, a->records);
    if (rc == AOTX_OK) rc = par_memory(d, &r, a->records);
    if (rc == AOTX_OK && r.pos != len - CK_TRAILER) rc = ck_bad(&r, r.pos);
    if (rc) {
        if (bad) *bad = r.bad;
        /* never half a state: empty tables, every mutation refused */
        for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) d->receipts[i].used = 0;
        d->n_participants = d->n_spaces = d->n_members = d->n_conversations = 0;
        d->n_receipts = d->n_memory = 0;
        d->failed = true;
        return rc;
    }
    d->admissions = admissions;
    d->ck_loaded = true;
    d->ck_records = a->records;
    return AOTX_OK;
}

int aotx_device_checkpoint_load(aotx_device *d, const uint8_t *buf, size_t len,
                                aotx_journal_anchor *out_anchor, uint64_t *out_bad_offset) {
    if (!d || !buf || !out_anchor) return AOTX_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    int rc = checkpoint_load_locked(d, buf, len, out_anchor, out_bad_offset);
    pthread_mutex_unlock(&d->mu);
    return rc;
}

void aotx_device_recover_offline(aotx_device *d) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->ck_offline = true;
    pthread_mutex_unlock(&d->mu);
}
