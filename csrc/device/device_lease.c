/* device_lease.c -- execution leases and output transfers
 * (docs/formats/device.md "Lease transfer", "Output transfer").
 *
 * A lease names the inputs of one execution group.  Every row is checked
 * against the receipt table before anything changes (the live call and the
 * replay run the same check); then one LEASE transfer is enqueued and each
 * receipt records its lease (running, revision, mode).  Output bytes of a
 * leased input are journaled as OUTPUT transfers and appended to its result;
 * the completion then carries only the bytes after them. */
#include "device_internal.h"

#include <assert.h>
#include <stddef.h>

static_assert(sizeof(aotx_lease_row) == AOTX_LEASE_ROW_BYTES, "lease row is 40 bytes");
static_assert(offsetof(aotx_lease_row, request_index) == 0, "request index @0");
static_assert(offsetof(aotx_lease_row, slot) == 4, "slot @4");
static_assert(offsetof(aotx_lease_row, sequence) == 8, "sequence @8");
static_assert(offsetof(aotx_lease_row, actor) == 16, "actor @16");
static_assert(offsetof(aotx_lease_row, mode) == 32, "retention mode @32");
static_assert(offsetof(aotx_lease_row, reserved) == 36, "reserved @36");
static_assert(AOTX_LEASE_ROW_V1_BYTES == offsetof(aotx_lease_row, mode),
              "a revision 0/1 row is the 40-byte row without mode and reserved");

/* The one place that reads an input's retention mode: the mode recorded in
 * its retained text row (memory rows byte 26); 0 when it retained nothing. */
uint32_t dev_retention_mode(const aotx_device *d, uint32_t slot) {
    const dev_receipt *r = &d->receipts[slot];
    if (!r->retained) return 0;
    for (uint32_t i = 0; i < d->n_memory; i++) {
        const aotx_memory_row *m = &d->memory[i].row;
        if (m->kind == AOTX_MEMORY_TEXT && m->origin == AOTX_MEMORY_RETAINED &&
            memcmp(m->source, r->op_id, 16) == 0)
            return m->mode;
    }
    return 0;
}

/* Modes a revision's rows may carry: 0 none retained, 1 source text, 2 also
 * interpretation.  Revision 0 implies 0, 1 implies 1; 4 is source-only (1),
 * 5 affect-managed (2); 2 and 3 take any. */
static bool mode_allowed(uint32_t revision, uint32_t mode) {
    switch (revision) {
    case 0: return mode == 0;
    case 1: case 4: return mode == 1;
    case 5: return mode == 2;
    default: return mode <= 2;
    }
}

/* A row's mode: once the input retained (an older journal retained before its
 * lease), exactly the recorded mode; before retention (the runtime leases
 * first, then retains with the mode the lease recorded: device_memory.c), the
 * mode it will retain with, 0 for an input without text. */
static bool lease_mode_ok(const dev_receipt *r, uint32_t mode, const aotx_device *d,
                          uint32_t slot) {
    if (r->retained) return mode == dev_retention_mode(d, slot);
    return r->retains || mode == 0;
}

/* Recovery: the live receipt of (actor, sequence), whatever slot the row
 * names.  Replay reassigns slots: a retirement frees its slots once it is
 * saved, a moment the journal does not record, so a replayed receipt may sit
 * in another slot than it did live; actor and sequence name it uniquely. */
static void resolve_slots(const aotx_device *d, aotx_lease_row *rows, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = dev_find_participant(d, rows[i].actor);
        uint32_t found = DEV_RECEIPT_SLOTS;     /* out of range: refused below */
        for (uint32_t s = 0; p != DEV_NONE && s < DEV_RECEIPT_SLOTS; s++) {
            const dev_receipt *r = &d->receipts[s];
            if (r->used && !r->retiring && r->actor == p && r->sequence == rows[i].sequence) {
                found = s;
                break;
            }
        }
        if (rows[i].slot < DEV_RECEIPT_SLOTS) rows[i].slot = found;
    }
}

/* Every rule of every row, nothing changed.  The first failing row decides
 * the code. */
static int lease_check(const aotx_device *d, uint32_t revision, const aotx_lease_row *rows,
                       uint32_t n) {
    if (revision > AOTX_LEASE_MAX_REVISION || n == 0 || n > AOTX_LEASE_MAX_ROWS)
        return AOTX_E_LEASE_INVALID;
    uint64_t saved = dev_saved_records(d);
    for (uint32_t i = 0; i < n; i++) {
        const aotx_lease_row *w = &rows[i];
        if (w->request_index != i || w->reserved != 0) return AOTX_E_LEASE_INVALID;
        if (w->slot >= DEV_RECEIPT_SLOTS) return AOTX_E_LEASE_INVALID;
        const dev_receipt *r = &d->receipts[w->slot];
        if (!r->used || r->retiring) return AOTX_E_OPERATION_NOT_FOUND;
        if (r->kind != AOTX_KIND_INPUT) return AOTX_E_LEASE_INVALID;
        if (r->sequence != w->sequence ||
            memcmp(d->participants[r->actor].key, w->actor, 16) != 0)
            return AOTX_E_LEASE_INVALID;
        if (dev_terminal(r->status)) return AOTX_E_ALREADY_TERMINAL;
        if (r->leased) return AOTX_E_LEASE_CONFLICT;
        if (r->admission_record >= saved) return AOTX_R_ADMISSION_UNSAVED;
        if (!mode_allowed(revision, w->mode) || !lease_mode_ok(r, w->mode, d, w->slot))
            return AOTX_E_LEASE_INVALID;
        for (uint32_t k = 0; k < i; k++)
            if (rows[k].slot == w->slot) return AOTX_E_LEASE_INVALID;
    }
    return AOTX_OK;
}

static void lease_apply(aotx_device *d, uint32_t revision, const aotx_lease_row *rows,
                        uint32_t n, uint64_t record) {
    for (uint32_t i = 0; i < n; i++) {
        dev_receipt *r = &d->receipts[rows[i].slot];
        r->status = AOTX_STATUS_RUNNING;
        r->leased = 1;
        r->lease_revision = (uint8_t)revision;
        r->lease_mode = (uint8_t)rows[i].mode;
        r->lease_record = record;
    }
    d->used = true;
}

static size_t lease_encode(uint32_t revision, const aotx_lease_row *rows, uint32_t n,
                           uint8_t *buf) {
    dev_le32(buf, n);
    dev_le32(buf + 4, revision);
    uint8_t *p = buf + AOTX_LEASE_HEADER;
    for (uint32_t i = 0; i < n; i++, p += AOTX_LEASE_ROW_BYTES) {
        dev_le32(p, rows[i].request_index);
        dev_le32(p + 4, rows[i].slot);
        dev_le64(p + 8, rows[i].sequence);
        memcpy(p + 16, rows[i].actor, 16);
        dev_le32(p + 32, rows[i].mode);
        dev_le32(p + 36, rows[i].reserved);
    }
    return (size_t)(p - buf);
}

int dev_lease_row_locked(aotx_device *d, const uint8_t op_id[16], uint32_t request_index,
                         aotx_lease_row *out) {
    if (!d || !op_id || !out) return AOTX_E_INVALID_ARGUMENT;
    uint32_t s = dev_find_receipt_by_op(d, op_id);
    if (s == DEV_NONE || d->receipts[s].kind != AOTX_KIND_INPUT)
        return AOTX_E_OPERATION_NOT_FOUND;
    const dev_receipt *r = &d->receipts[s];
    memset(out, 0, sizeof *out);
    out->request_index = request_index;
    out->slot = s;
    out->sequence = r->sequence;
    memcpy(out->actor, d->participants[r->actor].key, 16);
    out->mode = dev_retention_mode(d, s);
    return AOTX_OK;
}

int dev_lease_locked(aotx_device *d, uint32_t revision, const aotx_lease_row *rows, uint32_t n) {
    if (!d || (n && !rows)) return AOTX_E_INVALID_ARGUMENT;
    if (d->replaying) return AOTX_E_DEVICE_STATE;
    if (revision < 2) return AOTX_E_LEASE_INVALID;  /* 0 and 1 are read, never written */
    int rc = lease_check(d, revision, rows, n);
    if (rc) return rc;
    size_t len = lease_encode(revision, rows, n, d->scratch);
    uint64_t last = 0;
    rc = aotx_journal_enqueue(d->journal, AOTX_XFER_LEASE, d->scratch, (uint32_t)len, &last);
    if (rc) return rc;
    lease_apply(d, revision, rows, n, last);
    return AOTX_OK;
}

int dev_lease_replay(aotx_device *d, const uint8_t *data, uint32_t len, uint64_t record) {
    if (len < AOTX_LEASE_HEADER) return AOTX_E_RECOVERY_DAMAGE;
    uint32_t n = dev_rd32(data), revision = dev_rd32(data + 4);
    if (revision > AOTX_LEASE_MAX_REVISION || n == 0 || n > AOTX_LEASE_MAX_ROWS)
        return AOTX_E_RECOVERY_DAMAGE;
    uint32_t row_bytes = revision < 2 ? AOTX_LEASE_ROW_V1_BYTES : AOTX_LEASE_ROW_BYTES;
    if ((uint64_t)AOTX_LEASE_HEADER + (uint64_t)n * row_bytes != len) return AOTX_E_RECOVERY_DAMAGE;
    aotx_lease_row rows[AOTX_LEASE_MAX_ROWS];
    const uint8_t *p = data + AOTX_LEASE_HEADER;
    for (uint32_t i = 0; i < n; i++, p += row_bytes) {
        rows[i].request_index = dev_rd32(p);
        rows[i].slot = dev_rd32(p + 4);
        rows[i].sequence = dev_rd64(p + 8);
        memcpy(rows[i].actor, p + 16, 16);
        rows[i].mode = revision < 2 ? revision : dev_rd32(p + 32);
        rows[i].reserved = revision < 2 ? 0 : dev_rd32(p + 36);
    }
    resolve_slots(d, rows, n);
    if (lease_check(d, revision, rows, n) != AOTX_OK) return AOTX_E_RECOVERY_DAMAGE;
    lease_apply(d, revision, rows, n, record);
    return AOTX_OK;
}

/* ---- output ------------------------------------------------------------ */

static int output_check(const aotx_device *d, uint32_t s, uint32_t offset, uint32_t len) {
    if (s == DEV_NONE) return AOTX_E_OPERATION_NOT_FOUND;
    const dev_receipt *r = &d->receipts[s];
    if (r->kind != AOTX_KIND_INPUT) return AOTX_E_LEASE_MISSING;
    if (dev_terminal(r->status)) return AOTX_E_ALREADY_TERMINAL;
    if (!r->leased) return AOTX_E_LEASE_MISSING;
    if (len == 0) return AOTX_E_INVALID_ARGUMENT;
    if (offset != r->result_len) return AOTX_E_OUTPUT_CONFLICT;
    if ((uint64_t)r->result_len + len > AOTX_MAX_RESULT_BYTES) return AOTX_E_RESULT_TOO_LARGE;
    return AOTX_OK;
}

static void output_apply(aotx_device *d, uint32_t s, const uint8_t *data, uint32_t len,
                         uint64_t record, const uint32_t *tokens) {
    dev_receipt *r = &d->receipts[s];
    if (tokens) {   /* version 2: the counts so far (an interrupted input keeps them) */
        r->input_tokens = tokens[0];
        r->output_tokens = tokens[1];
    }
    if (!r->has_output || r->output_record < dev_saved_records(d))
        r->output_visible = r->result_len;   /* everything before this transfer is saved */
    memcpy(r->result + r->result_len, data, len);
    r->result_len += len;
    r->output_record = record;
    r->has_output = 1;
    d->used = true;
}

int dev_output_locked(aotx_device *d, const uint8_t op_id[16], const uint8_t *data, uint32_t len,
                      uint32_t input_tokens, uint32_t output_tokens) {
    if (!d || !op_id || (len && !data)) return AOTX_E_INVALID_ARGUMENT;
    if (d->replaying) return AOTX_E_DEVICE_STATE;
    uint32_t s = dev_find_receipt_by_op(d, op_id);
    int rc = output_check(d, s, s == DEV_NONE ? 0 : d->receipts[s].result_len, len);
    if (rc) return rc;
    uint8_t *b = d->scratch;
    memset(b, 0, AOTX_OUTPUT_HEADER_V2);
    b[0] = 2;
    dev_le32(b + 4, d->receipts[s].result_len);
    dev_le32(b + 8, len);
    memcpy(b + 16, op_id, 16);
    dev_le32(b + 32, input_tokens);
    dev_le32(b + 36, output_tokens);
    memcpy(b + AOTX_OUTPUT_HEADER_V2, data, len);
    uint64_t last = 0;
    rc = aotx_journal_enqueue(d->journal, AOTX_XFER_OUTPUT, b, AOTX_OUTPUT_HEADER_V2 + len,
                              &last);
    if (rc) return rc;
    const uint32_t tokens[2] = {input_tokens, output_tokens};
    output_apply(d, s, data, len, last, tokens);
    return AOTX_OK;
}

int dev_output_replay(aotx_device *d, const uint8_t *data, uint32_t len, uint64_t record) {
    /* version 1 (no token counts) or 2 (the counts after the header's first 32 bytes) */
    uint32_t head = len && data[0] == 2 ? AOTX_OUTPUT_HEADER_V2 : AOTX_OUTPUT_HEADER;
    if (len <= head || data[0] < 1 || data[0] > 2 || !dev_is_zero(data + 1, 3) ||
        !dev_is_zero(data + 12, 4))
        return AOTX_E_RECOVERY_DAMAGE;
    uint32_t n = dev_rd32(data + 8);
    if ((uint64_t)head + n != len) return AOTX_E_RECOVERY_DAMAGE;
    uint32_t s = dev_find_receipt_by_op(d, data + 16);
    if (output_check(d, s, dev_rd32(data + 4), n) != AOTX_OK) return AOTX_E_RECOVERY_DAMAGE;
    const uint32_t tokens[2] = {head == AOTX_OUTPUT_HEADER_V2 ? dev_rd32(data + 32) : 0,
                                head == AOTX_OUTPUT_HEADER_V2 ? dev_rd32(data + 36) : 0};
    output_apply(d, s, data + head, n, record, head == AOTX_OUTPUT_HEADER_V2 ? tokens : NULL);
    return AOTX_OK;
}

