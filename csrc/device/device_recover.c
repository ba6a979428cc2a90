/* device_recover.c -- rebuild the tables from the journal's transfers.
 * Each admission is decoded, re-validated through the same dev_prepare the
 * live path uses (all grants: grants are not recorded, the admission was
 * permitted when it was made), and its recorded device fields (admission
 * number, operation id, resource id, status, result bytes) must equal what
 * the replay computes; only then is it applied.  Any mismatch fails closed. */
#include "device_internal.h"

static int replay_admission(aotx_device *d, const uint8_t *data, uint32_t len, uint64_t record,
                            aotx_request *req) {
    if (len < AOTX_ADMISSION_HEADER || data[0] != 1 || data[3] != 0) return AOTX_E_RECOVERY_DAMAGE;
    uint32_t canon_len = dev_rd16(data + 4), result_len = dev_rd16(data + 6);
    if ((uint64_t)AOTX_ADMISSION_HEADER + canon_len + result_len != len)
        return AOTX_E_RECOVERY_DAMAGE;
    if (!dev_is_zero(data + 64, 8)) return AOTX_E_RECOVERY_DAMAGE;
    if (aotx_canonical_decode(data + AOTX_ADMISSION_HEADER, canon_len, req) != AOTX_OK)
        return AOTX_E_RECOVERY_DAMAGE;
    if (req->kind != data[1]) return AOTX_E_RECOVERY_DAMAGE;
    dev_plan *pl = d->plan;
    uint32_t retry = DEV_NONE;
    int rc = dev_prepare(d, DEV_ALL_GRANTS, data + 8, req, pl, &retry);
    if (rc != AOTX_OK || retry != DEV_NONE) return AOTX_E_RECOVERY_DAMAGE;
    if (pl->canon_len != canon_len || pl->status != data[2] ||
        memcmp(pl->op_id, data + 24, 16) != 0 || pl->admission_number != dev_rd64(data + 40) ||
        memcmp(pl->resource_id, data + 48, 16) != 0 || pl->result_len != result_len ||
        memcmp(pl->result, data + AOTX_ADMISSION_HEADER + canon_len, result_len) != 0)
        return AOTX_E_RECOVERY_DAMAGE;
    dev_apply(d, pl, record);
    return AOTX_OK;
}

static int replay_completion(aotx_device *d, const uint8_t *data, uint32_t len, uint64_t record) {
    if (len < AOTX_COMPLETION_HEADER || data[0] != 1 || data[3] != 0)
        return AOTX_E_RECOVERY_DAMAGE;
    uint32_t rlen = dev_rd32(data + 4);
    if ((uint64_t)AOTX_COMPLETION_HEADER + rlen != len) return AOTX_E_RECOVERY_DAMAGE;
    uint32_t s = dev_find_receipt_by_op(d, data + 8);
    dev_completion c = {.status = data[1], .finish = data[2], .result = data + AOTX_COMPLETION_HEADER,
                        .len = rlen, .in_tok = dev_rd32(data + 24), .out_tok = dev_rd32(data + 28)};
    if (dev_complete_check(d, s, &c) != AOTX_OK) return AOTX_E_RECOVERY_DAMAGE;
    if (d->receipts[s].kind != AOTX_KIND_INPUT) return AOTX_E_RECOVERY_DAMAGE;
    dev_complete_apply(d, s, &c, record);
    return AOTX_OK;
}

/* Save identities at recovery (docs/formats/journal.md, "Save identity"):
 * a receipt's save is the generation stamped on its admission's last part;
 * that save's commit point is the end of the last complete transfer with the
 * same generation, known once a transfer of a later generation (or the end)
 * is read.  Until then the receipt waits in replay_pending. */
static void replay_close_saves(aotx_device *d, uint64_t incarnation, uint64_t commit_records,
                               const uint8_t digest[32]) {
    for (uint32_t k = 0; k < d->n_replay_pending; k++) {
        dev_receipt *r = &d->receipts[d->replay_pending[k]];
        if (!r->used || r->admission_number != d->replay_pending_adm[k]) continue;
        memset(&r->save, 0, sizeof r->save);
        r->save.file_incarnation = incarnation;
        r->save.generation = d->replay_gen;
        r->save.boot = d->replay_boot;
        r->save.commit_records = commit_records;
        memcpy(r->save.commit_digest, digest, 32);
        r->save_known = 1;
    }
    d->n_replay_pending = 0;
}

static void replay_wait_save(aotx_device *d, uint32_t slot, uint64_t gen, uint64_t boot) {
    if (d->n_replay_pending == DEV_RECEIPT_SLOTS) { /* drop entries whose slot was reused */
        uint32_t n = 0;
        for (uint32_t k = 0; k < d->n_replay_pending; k++) {
            const dev_receipt *r = &d->receipts[d->replay_pending[k]];
            if (r->used && r->admission_number == d->replay_pending_adm[k]) {
                d->replay_pending[n] = d->replay_pending[k];
                d->replay_pending_adm[n++] = d->replay_pending_adm[k];
            }
        }
        d->n_replay_pending = n;
    }
    if (d->n_replay_pending == DEV_RECEIPT_SLOTS) return; /* cannot happen: <= slots live */
    d->replay_pending[d->n_replay_pending] = slot;
    d->replay_pending_adm[d->n_replay_pending++] = d->receipts[slot].admission_number;
    d->replay_gen = gen;
    d->replay_boot = boot;
}

/* A refused recovery must not expose what it applied before the bad transfer:
 * wipe every table back to the fresh state and refuse further mutations. */
static int recover_failed(aotx_device *d, int rc) {
    memset(d->participants, 0, AOTX_MAX_PARTICIPANTS * sizeof *d->participants);
    memset(d->spaces, 0, AOTX_MAX_SPACES * sizeof *d->spaces);
    memset(d->members, 0, AOTX_MAX_MEMBERS * sizeof *d->members);
    memset(d->conversations, 0, AOTX_MAX_CONVERSATIONS * sizeof *d->conversations);
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        dev_receipt *r = &d->receipts[i];
        uint8_t *canon = r->canon, *result = r->result;
        memset(r, 0, sizeof *r);
        r->canon = canon;
        r->result = result;
    }
    for (uint32_t i = 0; i < d->n_memory; i++) {
        memset(&d->memory[i].row, 0, sizeof d->memory[i].row);
        d->memory[i].record = 0;
        memset(d->memory[i].payload, 0, AOTX_MEMORY_PAYLOAD_MAX);
    }
    d->n_memory = 0;
    d->n_participants = d->n_spaces = d->n_conversations = d->n_members = d->n_receipts = 0;
    d->admissions = 0;
    d->n_replay_pending = 0;
    d->failed = true;
    return rc;
}

int dev_recover_locked(aotx_device *d, aotx_journal_reader *r, uint64_t *out_bad_record) {
    if (!d || !r) return AOTX_E_INVALID_ARGUMENT;
    if (d->used || d->replaying) return AOTX_E_DEVICE_STATE;
    uint64_t bad = 0;
    aotx_request req;
    int rc = AOTX_OK;
    rc = aotx_journal_reader_expect_lineage(r, d->lineage);
    if (rc) {
        if (out_bad_record) *out_bad_record = aotx_journal_reader_error_offset(r);
        return rc;
    }
    if (d->ck_loaded) { /* checkpoint hook: the reader continues after the checkpoint's records */
        aotx_journal_anchor at;
        if (aotx_journal_reader_anchor(r, &at) != AOTX_OK || at.records != d->ck_records)
            return AOTX_E_DEVICE_STATE;
    }
    d->replaying = true;
    d->n_replay_pending = 0;
    uint64_t incarnation = aotx_journal_reader_incarnation(r);
    uint64_t prev_end = 0;          /* records up to the end of the previous transfer */
    uint8_t prev_digest[32] = {0};  /* the chained digest there */
    for (;;) {
        uint8_t kind = 0;
        const uint8_t *data = NULL;
        uint32_t len = 0;
        uint64_t first = 0;
        int more = aotx_journal_reader_next(r, &kind, &data, &len, &first);
        if (more == 0) break;
        if (more < 0) {
            rc = more;
            bad = aotx_journal_reader_error_offset(r);
            break;
        }
        bad = first;
        uint64_t gen = aotx_journal_reader_generation(r);
        uint64_t end = (aotx_journal_reader_valid_end(r) - AOTX_JOURNAL_FILE_HEADER) /
                       AOTX_JOURNAL_RECORD_SIZE;
        uint64_t last = end - 1;    /* the transfer's last part, as the live path records */
        if (d->n_replay_pending && gen > d->replay_gen)
            replay_close_saves(d, incarnation, prev_end, prev_digest);
        switch (kind) {
        case AOTX_XFER_BOOT:
            rc = AOTX_OK;
            break;
        case AOTX_XFER_LEASE:
            rc = dev_lease_replay(d, data, len, last);
            break;
        case AOTX_XFER_OUTPUT:
            rc = dev_output_replay(d, data, len, last);
            break;
        case AOTX_XFER_ADMISSION:
            rc = replay_admission(d, data, len, last, &req);
            if (rc == AOTX_OK)
                replay_wait_save(d, d->plan->slot, gen, aotx_journal_reader_boot(r));
            break;
        case AOTX_XFER_COMPLETION:
            rc = replay_completion(d, data, len, last);
            break;
        case AOTX_XFER_MEMORY:
            rc = dev_memory_replay(d, data, len, last);
            break;
        default:
            rc = AOTX_E_RECOVERY_DAMAGE;
            break;
        }
        if (rc) break;
        prev_end = end;
        aotx_journal_reader_digest(r, prev_digest);
    }
    if (rc == AOTX_OK && d->n_replay_pending) replay_close_saves(d, incarnation, prev_end, prev_digest);
    d->replaying = false;
    d->used = true;
    if (rc == AOTX_OK) rc = aotx_journal_resume(d->journal, r);
    if (rc) {
        if (out_bad_record) *out_bad_record = bad;
        return recover_failed(d, rc);
    }
    dev_reclaim(d);
    if (d->ck_offline) return AOTX_OK; /* an offline checkpoint keeps the journal's state */
    /* Restored INPUTs without a terminal result become interrupted (never re-run). */
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        dev_receipt *rc_ = &d->receipts[i];
        if (!rc_->used || rc_->kind != AOTX_KIND_INPUT || rc_->has_terminal_record) continue;
        /* keeps the output bytes journaled so far (its whole result) */
        /* and the token counts its last OUTPUT transfer journaled (0 without one) */
        const dev_completion c = {.status = AOTX_STATUS_INTERRUPTED, .result = rc_->result,
                                  .len = rc_->result_len, .in_tok = rc_->input_tokens,
                                  .out_tok = rc_->output_tokens};
        rc = dev_complete_locked(d, rc_->op_id, &c);
        if (rc) {
            if (out_bad_record) *out_bad_record = rc_->admission_record;
            return recover_failed(d, rc);
        }
    }
    return AOTX_OK;
}
