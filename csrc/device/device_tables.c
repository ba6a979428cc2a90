/* device_tables.c -- the lower layer's table side (see device_internal.h): lookups,
 * ids (op, object, resource), receipt views and the save bookkeeping every
 * operation kind reads.  No admission, no rights, no journal writes. */
#include "device_internal.h"

#include <stdio.h>

/* ---- lookups ---------------------------------------------------------- */

uint32_t dev_find_participant(const aotx_device *d, const uint8_t key[16]) {
    for (uint32_t i = 0; i < d->n_participants; i++)
        if (memcmp(d->participants[i].key, key, 16) == 0) return i;
    return DEV_NONE;
}

uint32_t dev_find_space(const aotx_device *d, const uint8_t id[16]) {
    for (uint32_t i = 0; i < d->n_spaces; i++)
        if (memcmp(d->spaces[i].id, id, 16) == 0) return i;
    return DEV_NONE;
}

uint32_t dev_find_conversation(const aotx_device *d, const uint8_t id[16]) {
    for (uint32_t i = 0; i < d->n_conversations; i++)
        if (memcmp(d->conversations[i].id, id, 16) == 0) return i;
    return DEV_NONE;
}

uint32_t dev_find_member_row(const aotx_device *d, uint32_t space, const uint8_t key[16]) {
    for (uint32_t i = 0; i < d->n_members; i++)
        if (d->members[i].space == space && memcmp(d->members[i].key, key, 16) == 0) return i;
    return DEV_NONE;
}

/* A live (not retiring) receipt of `actor` at `sequence`. */
uint32_t dev_find_receipt_seq(const aotx_device *d, uint32_t actor, uint64_t sequence) {
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        const dev_receipt *r = &d->receipts[i];
        if (r->used && !r->retiring && r->actor == actor && r->sequence == sequence) return i;
    }
    return DEV_NONE;
}

uint32_t dev_find_receipt_by_op(const aotx_device *d, const uint8_t op_id[16]) {
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        const dev_receipt *r = &d->receipts[i];
        if (r->used && !r->retiring && memcmp(r->op_id, op_id, 16) == 0) return i;
    }
    return DEV_NONE;
}

uint64_t dev_saved_records(const aotx_device *d) {
    if (d->replaying) return UINT64_MAX;
    aotx_save_state s;
    aotx_journal_save_state(d->journal, &s);
    return s.saved_records;
}

/* Every receipt whose admission got saved since the last call copies the
 * identity of that save from the journal's ring; then the ring may reuse
 * those records.  Runs at the start of every public call (device_api.c). */
void dev_stamp_saves(aotx_device *d) {
    if (d->replaying || d->failed) return;
    aotx_save_state st;
    aotx_journal_save_state(d->journal, &st);
    if (st.saved_records == d->stamped_saved) return;
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        dev_receipt *r = &d->receipts[i];
        if (r->used && !r->save_known && r->admission_record < st.saved_records &&
            aotx_journal_save_of(d->journal, r->admission_record, &r->save) == AOTX_OK)
            r->save_known = 1;
    }
    aotx_journal_retain(d->journal, st.saved_records);
    d->stamped_saved = st.saved_records;
}

/* Free the slots of retiring receipts whose retirement is saved. */
void dev_reclaim(aotx_device *d) {
    uint64_t saved = dev_saved_records(d);
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        dev_receipt *r = &d->receipts[i];
        if (r->used && r->retiring && r->retire_record < saved) {
            r->used = 0;
            r->retiring = 0;
            d->n_receipts--;
        }
    }
}

bool dev_terminal(uint8_t s) {
    return s >= AOTX_STATUS_SUCCEEDED && s <= AOTX_STATUS_DEADLINE_EXCEEDED;
}

/* Rows promised to admitted inputs that have not retained yet (two each). */
uint32_t dev_memory_promised(const aotx_device *d) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        const dev_receipt *r = &d->receipts[i];
        if (r->used && r->kind == AOTX_KIND_INPUT && r->retains && !r->retained &&
            !dev_terminal(r->status))
            n++;
    }
    return n;
}

/* Result bytes a read may serve: all of them once terminal (the handler
 * waits for the terminal save) or once the newest OUTPUT transfer is saved;
 * before that only what was saved before it, so no read shows output a crash
 * could take back. */
uint32_t dev_result_visible(const aotx_device *d, uint32_t slot) {
    const dev_receipt *r = &d->receipts[slot];
    if (dev_terminal(r->status) || !r->has_output || r->output_record < dev_saved_records(d))
        return r->result_len;
    return r->output_visible;
}

/* ---- ids ---------------------------------------------------------------- */

static uint64_t mix64(uint64_t z) { /* splitmix64 finaliser: a bijection (op and object ids) */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Operation id of admission n: bytes 0..7 = mix64(n ^ L0) (a bijection of n,
 * so never reused), bytes 8..15 = mix64(n ^ L1 ^ 0x6f70...). */
void dev_op_id(const aotx_device *d, uint64_t n, uint8_t out[16]) {
    uint64_t l0 = dev_rd64(d->lineage), l1 = dev_rd64(d->lineage + 8);
    dev_le64(out, mix64(n ^ l0));
    dev_le64(out + 8, mix64(n ^ l1 ^ 0x6f705f69645f7631ULL));
}

/* Object id of memory row m (1-based, in retention order). */
void dev_memory_id(const aotx_device *d, uint64_t m, uint8_t out[16]) {
    uint64_t l0 = dev_rd64(d->lineage), l1 = dev_rd64(d->lineage + 8);
    dev_le64(out, mix64(m ^ l0 ^ 0x6d656d5f6f626a31ULL));
    dev_le64(out + 8, mix64(m ^ l1 ^ 0x6f626a5f69645f32ULL));
}

void dev_res_id(const aotx_device *d, const char *prefix, const uint8_t id[16], char *out) {
    char l[33], h[33];
    dev_hex(d->lineage, 16, l);
    dev_hex(id, 16, h);
    snprintf(out, 80, "%s-%s-%s", prefix, l, h);
}

/* ---- views -------------------------------------------------------------- */

void dev_receipt_view(aotx_device *d, uint32_t slot, bool foreign, aotx_receipt_view *out) {
    const dev_receipt *r = &d->receipts[slot];
    memset(out, 0, sizeof *out);
    aotx_save_state st;
    aotx_journal_save_state(d->journal, &st);
    out->saved_records = st.saved_records;
    out->pending_bytes = st.pending_bytes;
    out->file_incarnation = st.file_incarnation;
    out->generation = st.generation;
    out->boot = st.boot;
    memcpy(out->commit_digest, st.commit_digest, 32);
    out->disk_error = st.disk_error;
    out->hold = st.hold;
    uint64_t saved = d->replaying ? UINT64_MAX : st.saved_records;
    memcpy(out->op_id, r->op_id, 16);
    out->kind = r->kind;
    out->status = r->status;
    out->foreign = foreign;
    out->device_committed = 1;
    out->admission_saved = r->admission_record < saved;
    out->terminal_saved = r->has_terminal_record && r->terminal_record < saved;
    out->cancel_requested = r->cancel_requested;
    memcpy(out->participant, d->participants[r->actor].key, 16);
    if (!foreign) {
        memcpy(out->operation_key, r->op_key, 16);
        out->sequence = r->sequence;
    }
    out->admission_number = r->admission_number;
    out->admission_record = r->admission_record;
    out->terminal_record = r->has_terminal_record ? r->terminal_record : UINT64_MAX;
    memcpy(out->resource_id, r->resource_id, 16);
    out->result_len = dev_result_visible(d, slot);
    out->leased = r->leased;
    out->lease_revision = r->lease_revision;
    out->lease_mode = r->lease_mode;
    out->input_tokens = r->input_tokens;
    out->output_tokens = r->output_tokens;
    out->input_index = r->input_index;
    out->finish = r->finish;
    if (r->save_known && out->admission_saved) {
        out->admission_save_known = 1;
        out->admission_save = r->save;
    }
}
