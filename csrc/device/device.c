/* device.c -- the device handle, admission (prepare -> enqueue -> apply) and
 * the executor's start/complete.  Layers: device_internal.h.  Reads:
 * device_read.c; rights: device_rights.c; lookups and ids: device_tables.c;
 * canonical bytes: device_canon.c; recovery: device_recover.c. */
#include "device_internal.h"

#include <stdio.h>
#include <stdlib.h>

const aotx_code_entry aotx_device_codes[] = {
    {AOTX_E_LINEAGE_MISMATCH, "lineage_mismatch", "the lineage does not match this device; read /participant"},
    {AOTX_E_PARTICIPANT_NOT_FOUND, "participant_not_found", "the participant is not registered"},
    {AOTX_E_SEQUENCE_CONFLICT, "sequence_conflict", "this sequence was admitted with other canonical bytes"},
    {AOTX_E_FUTURE_SEQUENCE, "future_sequence", "the sequence is past the participant's next sequence"},
    {AOTX_E_BELOW_RETRY_FLOOR, "below_retry_floor", "the sequence is below the saved retry floor"},
    {AOTX_E_OPERATION_KEY_CONFLICT, "operation_key_conflict", "the operation key is used by a live receipt"},
    {AOTX_E_REGISTRATION_CONFLICT, "registration_conflict", "the participant is already registered"},
    {AOTX_E_SPACE_ID_CONFLICT, "space_id_conflict", "a space with this id exists"},
    {AOTX_E_CONVERSATION_ID_CONFLICT, "conversation_id_conflict", "a conversation with this id exists"},
    {AOTX_E_SPACE_NOT_FOUND, "space_not_found", "no such space, or it is not visible to the caller"},
    {AOTX_E_CONVERSATION_NOT_FOUND, "conversation_not_found", "no such conversation, or it is not visible to the caller"},
    {AOTX_E_OPERATION_NOT_FOUND, "operation_not_found", "no such operation, or it is not visible to the caller"},
    {AOTX_E_MEMBER_NOT_FOUND, "member_not_found", "the member participant is not registered"},
    {AOTX_E_TARGET_NOT_FOUND, "target_not_found", "target_sequence names no live operation of the caller"},
    {AOTX_E_FORBIDDEN, "forbidden", "the caller lacks the space right this needs"},
    {AOTX_E_GRANT_FORBIDDEN, "grant_forbidden", "the caller's current grants lack the action this needs"},
    {AOTX_R_RETIREMENT_BLOCKED, "retirement_blocked", "a receipt below the retry floor has no saved terminal result"},
    {AOTX_E_RETRY_FLOOR_INVALID, "retry_floor_invalid", "retry_floor must be >= the current floor and <= the retirement's sequence"},
    {AOTX_R_PARTICIPANTS_FULL, "participants_full", "the participant table is full"},
    {AOTX_R_SPACES_FULL, "spaces_full", "the space table is full"},
    {AOTX_R_CONVERSATIONS_FULL, "conversations_full", "the conversation table is full"},
    {AOTX_R_MEMBERS_FULL, "members_full", "the member table is full"},
    {AOTX_R_RECEIPT_TABLE_FULL, "receipt_table_full", "the receipt table is full until a saved retirement frees a slot"},
    {AOTX_E_COMMAND_TOO_LARGE, "command_too_large", "the canonical command exceeds the per-receipt command bytes"},
    {AOTX_E_RESULT_TOO_LARGE, "result_too_large", "the result exceeds the per-receipt result bytes"},
    {AOTX_E_ALREADY_TERMINAL, "already_terminal", "the operation already has a terminal result"},
    {AOTX_R_ADMISSION_UNSAVED, "admission_unsaved", "execution waits for a saved admission"},
    {AOTX_R_MEMORY_FULL, "memory_full", "the memory table is full"},
    {AOTX_E_MEMORY_RETAINED, "memory_retained", "the input's memory is retained already"},
    {AOTX_E_MEMORY_NOT_FOUND, "memory_not_found", "no such memory object, or it is not visible to the caller"},
    {AOTX_E_EMBEDDING_INVALID, "embedding_invalid", "the embedding must have 1..512 finite values"},
    {AOTX_E_VERSION_CONFLICT, "version_conflict", "source_version is not the memory object's current version"},
    {AOTX_E_PUBLICATION_UNSUPPORTED, "publication_unsupported", "only retained text memory can be published"},
    {AOTX_E_RETENTION_MODE_INVALID, "retention_mode_invalid", "the retention mode is not 1 or 2, or not 2 for an interpretation"},
    {AOTX_E_KIND_INVALID, "kind_invalid", "unknown mutation kind"},
    {AOTX_E_OPERATION_KEY_INVALID, "operation_key_invalid", "operation_key must be a nonzero 16-byte value"},
    {AOTX_E_SCOPE_INVALID, "scope_invalid", "scope must be private, room or instance"},
    {AOTX_E_RIGHTS_INVALID, "rights_invalid", "permissions must be read, write or manage"},
    {AOTX_E_TEXT_INVALID, "text_invalid", "text must be UTF-8, nonempty without media, and fit 2048 bytes with media links"},
    {AOTX_E_MODEL_INVALID, "model_invalid", "model must be 1..128 printable ASCII bytes"},
    {AOTX_E_MEDIA_INVALID, "media_invalid", "at most 8 media rows of type image or audio"},
    {AOTX_E_SAMPLING_INVALID, "sampling_invalid", "max_output_tokens 1..65536, temperature 0..2, top_p in (0, 1]"},
    {AOTX_E_STATUS_INVALID, "status_invalid", "not a terminal status"},
    {AOTX_E_CURSOR_INVALID, "cursor_invalid", "the cursor is past the table"},
    {AOTX_E_TARGET_SEQUENCE_INVALID, "target_sequence_invalid", "target_sequence must be >= 1"},
    {AOTX_E_RESERVED_TOKEN_INVALID, "reserved_token_invalid", "text holds a reserved media control token"},
    {AOTX_E_LEASE_INVALID, "lease_invalid", "a lease row or revision breaks a rule (docs/formats/device.md)"},
    {AOTX_E_LEASE_CONFLICT, "lease_conflict", "the input is leased already"},
    {AOTX_E_LEASE_MISSING, "lease_missing", "output needs a leased, running input"},
    {AOTX_E_OUTPUT_CONFLICT, "output_conflict", "the result does not extend the journaled output bytes"},
    {AOTX_E_RECOVERY_DAMAGE, "recovery_damage", "a journal transfer contradicts the recovered state"},
    {AOTX_E_DEVICE_STATE, "device_out_of_order", "call out of order for this device"},
    {0, NULL, NULL},
};

void aotx_device_default_params(aotx_device_params *p) {
    memset(p, 0, sizeof *p);
    p->default_pages = 0;
}

void aotx_device_free(aotx_device *d) {
    if (!d) return;
    free(d->participants);
    free(d->spaces);
    free(d->members);
    free(d->conversations);
    free(d->receipts);
    free(d->memory);
    free(d->memory_store);
    free(d->canon_store);
    free(d->result_store);
    free(d->scratch);
    free(d->plan);
    free(d->replay_pending);
    free(d->replay_pending_adm);
    if (d->mu_ready) pthread_mutex_destroy(&d->mu);
    free(d);
}

int aotx_device_new(const aotx_device_params *p, const uint8_t lineage[16], aotx_journal *j,
                    aotx_device **out) {
    if (!lineage || !j || !out) return AOTX_E_INVALID_ARGUMENT;
    aotx_device *d = calloc(1, sizeof *d);
    if (!d) return AOTX_E_NOMEM;
    if (p) d->params = *p;
    else aotx_device_default_params(&d->params);
    memcpy(d->lineage, lineage, 16);
    d->journal = j;
    d->participants = calloc(AOTX_MAX_PARTICIPANTS, sizeof *d->participants);
    d->spaces = calloc(AOTX_MAX_SPACES, sizeof *d->spaces);
    d->members = calloc(AOTX_MAX_MEMBERS, sizeof *d->members);
    d->conversations = calloc(AOTX_MAX_CONVERSATIONS, sizeof *d->conversations);
    d->receipts = calloc(DEV_RECEIPT_SLOTS, sizeof *d->receipts);
    d->memory = calloc(AOTX_MAX_MEMORY, sizeof *d->memory);
    d->memory_store = calloc(AOTX_MAX_MEMORY, AOTX_MEMORY_PAYLOAD_MAX);
    d->canon_store = calloc(DEV_RECEIPT_SLOTS, DEV_CANON_STRIDE);
    d->result_store = calloc(DEV_RECEIPT_SLOTS, DEV_RESULT_STRIDE);
    d->scratch_cap = AOTX_COMPLETION_HEADER + (size_t)AOTX_MAX_RESULT_BYTES;
    if (d->scratch_cap < AOTX_ADMISSION_HEADER + DEV_CANON_MAX + DEV_RESULT_JSON_MAX)
        d->scratch_cap = AOTX_ADMISSION_HEADER + DEV_CANON_MAX + DEV_RESULT_JSON_MAX;
    if (d->scratch_cap < AOTX_OUTPUT_HEADER_V2 + (size_t)AOTX_MAX_RESULT_BYTES)
        d->scratch_cap = AOTX_OUTPUT_HEADER_V2 + (size_t)AOTX_MAX_RESULT_BYTES;
    if (d->scratch_cap < AOTX_LEASE_HEADER + AOTX_LEASE_MAX_ROWS * AOTX_LEASE_ROW_BYTES)
        d->scratch_cap = AOTX_LEASE_HEADER + AOTX_LEASE_MAX_ROWS * AOTX_LEASE_ROW_BYTES;
    d->scratch = malloc(d->scratch_cap);
    d->plan = calloc(1, sizeof *d->plan);
    d->replay_pending = calloc(DEV_RECEIPT_SLOTS, sizeof *d->replay_pending);
    d->replay_pending_adm = calloc(DEV_RECEIPT_SLOTS, sizeof *d->replay_pending_adm);
    d->mu_ready = pthread_mutex_init(&d->mu, NULL) == 0;
    if (!d->mu_ready || !d->participants || !d->spaces || !d->members || !d->conversations || !d->receipts ||
        !d->memory || !d->memory_store || !d->canon_store || !d->result_store || !d->scratch || !d->plan || !d->replay_pending ||
        !d->replay_pending_adm) {
        aotx_device_free(d);
        return AOTX_E_NOMEM;
    }
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        d->receipts[i].canon = d->canon_store + (size_t)i * DEV_CANON_STRIDE;
        d->receipts[i].result = d->result_store + (size_t)i * DEV_RESULT_STRIDE;
    }
    for (uint32_t i = 0; i < AOTX_MAX_MEMORY; i++)
        d->memory[i].payload = d->memory_store + (size_t)i * AOTX_MEMORY_PAYLOAD_MAX;
    /* keep saved records in the journal's ring until their receipts copied
     * the identity of their save (dev_stamp_saves) */
    aotx_journal_retain(j, 0);
    *out = d;
    return AOTX_OK;
}

void aotx_device_lineage(const aotx_device *d, uint8_t out[16]) { memcpy(out, d->lineage, 16); }

void dev_usage_get_locked(aotx_device *d, aotx_device_usage *out) {
    dev_reclaim(d);
    memset(out, 0, sizeof *out);
    out->participants = d->n_participants;
    out->spaces = d->n_spaces;
    out->conversations = d->n_conversations;
    out->members = d->n_members;
    out->receipts = d->n_receipts;
    out->memory = d->n_memory;
    out->admissions = d->admissions;
}

/* ---- immediate results (JSON, docs/formats/device.md "Results") ------- */

static const char *scope_name(uint8_t s) {
    return s == AOTX_SCOPE_ROOM ? "room" : s == AOTX_SCOPE_INSTANCE ? "instance" : "private";
}

static void result_json(const aotx_device *d, dev_plan *pl, bool was_running) {
    const aotx_request *q = pl->req;
    char a[80], b[80];
    int n = 0;
    char *o = (char *)pl->result;
    size_t cap = sizeof pl->result;
    switch (q->kind) {
    case AOTX_KIND_REGISTER:
        dev_res_id(d, "par", pl->actor_key, a);
        n = snprintf(o, cap, "{\"participant\":\"%s\"}", a);
        break;
    case AOTX_KIND_SPACE_CREATE:
        dev_res_id(d, "spc", pl->resource_id, a);
        n = snprintf(o, cap, "{\"space\":\"%s\",\"scope\":\"%s\"}", a, scope_name(q->scope));
        break;
    case AOTX_KIND_MEMBER_SET: {
        dev_res_id(d, "spc", q->space, a);
        dev_res_id(d, "par", q->participant, b);
        char perms[40] = "";
        const char *names[3] = {"\"read\"", "\"write\"", "\"manage\""};
        for (int i = 0; i < 3; i++) {
            if (!(q->rights & (1 << i))) continue;
            if (perms[0]) strcat(perms, ",");
            strcat(perms, names[i]);
        }
        n = snprintf(o, cap, "{\"space\":\"%s\",\"participant\":\"%s\",\"permissions\":[%s]}", a, b,
                     perms);
        break;
    }
    case AOTX_KIND_CONVERSATION_CREATE:
        dev_res_id(d, "con", pl->resource_id, a);
        dev_res_id(d, "spc", q->space, b);
        n = snprintf(o, cap, "{\"conversation\":\"%s\",\"space\":\"%s\"}", a, b);
        break;
    case AOTX_KIND_CANCEL:
        n = snprintf(o, cap, "{\"target_sequence\":\"%llu\",\"cancel_requested\":%s}",
                     (unsigned long long)q->target_sequence, was_running ? "true" : "false");
        break;
    case AOTX_KIND_RETIRE:
        n = snprintf(o, cap, "{\"retry_floor\":\"%llu\"}", (unsigned long long)q->retry_floor);
        break;
    case AOTX_KIND_PUBLISH:   /* written by dev_publish_prepare */
        n = (int)pl->result_len;
        break;
    default:
        n = 0;
        break;
    }
    pl->result_len = n > 0 ? (uint32_t)n : 0;
}

/* ---- prepare: every check, no change ---------------------------------- */

static int prepare_kind(aotx_device *d, uint32_t grants, dev_plan *pl, const dev_participant *p,
                        uint64_t *freed) {
    const aotx_request *q = pl->req;
    int rc;
    switch (q->kind) {
    case AOTX_KIND_REGISTER:
        if (d->n_participants >= AOTX_MAX_PARTICIPANTS) return AOTX_R_PARTICIPANTS_FULL;
        memcpy(pl->resource_id, pl->actor_key, 16);
        break;
    case AOTX_KIND_SPACE_CREATE:
        memcpy(pl->resource_id, q->has_id ? q->id : q->operation_key, 16);
        if (dev_find_space(d, pl->resource_id) != DEV_NONE) return AOTX_E_SPACE_ID_CONFLICT;
        if (d->n_spaces >= AOTX_MAX_SPACES) return AOTX_R_SPACES_FULL;
        break;
    case AOTX_KIND_MEMBER_SET:
        pl->space = dev_find_space(d, q->space);
        rc = dev_space_access(d, grants, pl->actor, pl->space, AOTX_RIGHT_MANAGE,
                          AOTX_E_SPACE_NOT_FOUND);
        if (rc) return rc;
        /* A row may name a principal that is not registered (yet): the answer never
         * tells whether a principal key is registered.  It applies once it registers. */
        /* the owner's rights are the owner's: a manager cannot reduce (or change) them */
        if (memcmp(q->participant, d->participants[d->spaces[pl->space].owner].key, 16) == 0 &&
            pl->actor != d->spaces[pl->space].owner)
            return AOTX_E_FORBIDDEN;
        pl->member_row = dev_find_member_row(d, pl->space, q->participant);
        if (pl->member_row == DEV_NONE && d->n_members >= AOTX_MAX_MEMBERS)
            return AOTX_R_MEMBERS_FULL;
        memcpy(pl->resource_id, q->space, 16);
        break;
    case AOTX_KIND_CONVERSATION_CREATE:
        pl->space = dev_find_space(d, q->space);
        rc = dev_space_access(d, grants, pl->actor, pl->space, AOTX_RIGHT_WRITE,
                          AOTX_E_SPACE_NOT_FOUND);
        if (rc) return rc;
        memcpy(pl->resource_id, q->has_id ? q->id : q->operation_key, 16);
        if (dev_find_conversation(d, pl->resource_id) != DEV_NONE)
            return AOTX_E_CONVERSATION_ID_CONFLICT;
        if (d->n_conversations >= AOTX_MAX_CONVERSATIONS) return AOTX_R_CONVERSATIONS_FULL;
        break;
    case AOTX_KIND_INPUT:
        pl->conversation = dev_find_conversation(d, q->conversation);
        rc = dev_space_access(d, grants, pl->actor,
                          pl->conversation == DEV_NONE ? DEV_NONE
                                                       : d->conversations[pl->conversation].space,
                          AOTX_RIGHT_WRITE, AOTX_E_CONVERSATION_NOT_FOUND);
        if (rc) return rc;
        /* two memory rows (text + embedding) are promised to every input with text,
         * so retention before generation never finds the table full */
        if (q->text_len > 0 && (uint64_t)d->n_memory + 2u * dev_memory_promised(d) + 2u >
                                   AOTX_MAX_MEMORY)
            return AOTX_R_MEMORY_FULL;
        memcpy(pl->resource_id, q->conversation, 16);
        break;
    case AOTX_KIND_CANCEL:
        if (q->target_sequence >= q->sequence) return AOTX_E_TARGET_NOT_FOUND;
        pl->target_receipt = dev_find_receipt_seq(d, pl->actor, q->target_sequence);
        if (pl->target_receipt == DEV_NONE) return AOTX_E_TARGET_NOT_FOUND;
        memcpy(pl->resource_id, d->receipts[pl->target_receipt].op_id, 16);
        break;
    case AOTX_KIND_PUBLISH:
        pl->space = dev_find_space(d, q->space);
        rc = dev_space_access(d, grants, pl->actor, pl->space, AOTX_RIGHT_MANAGE,
                          AOTX_E_SPACE_NOT_FOUND);
        if (rc) return rc;
        rc = dev_publish_prepare(d, grants, pl);
        if (rc) return rc;
        memcpy(pl->resource_id, q->space, 16);
        break;
    case AOTX_KIND_RETIRE: {
        if (q->retry_floor > q->sequence || q->retry_floor < p->retry_floor)
            return AOTX_E_RETRY_FLOOR_INVALID;
        uint64_t saved = dev_saved_records(d);
        for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
            const dev_receipt *r = &d->receipts[i];
            if (!r->used || r->retiring || r->actor != pl->actor || r->sequence >= q->retry_floor)
                continue;
            if (!r->has_terminal_record || r->terminal_record >= saved)
                return AOTX_R_RETIREMENT_BLOCKED;
            (*freed)++;
        }
        break;
    }
    default:
        return AOTX_E_INTERNAL;
    }
    return AOTX_OK;
}

int dev_prepare(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                const aotx_request *req, dev_plan *pl, uint32_t *retry_slot) {
    *retry_slot = DEV_NONE;
    int rc = dev_validate_request(req);
    if (rc) return rc;
    memset(pl, 0, offsetof(dev_plan, canon));
    pl->req = req;
    memcpy(pl->actor_key, actor, 16);
    uint32_t n = 0;
    if (aotx_canonical_encode(req, pl->canon, sizeof pl->canon, &n) != AOTX_OK)
        return AOTX_E_INTERNAL;
    if (n > AOTX_MAX_COMMAND_BYTES) return AOTX_E_COMMAND_TOO_LARGE;
    pl->canon_len = n;
    if (memcmp(req->lineage, d->lineage, 16) != 0) return AOTX_E_LINEAGE_MISMATCH;
    if (!(grants & AOTX_GRANT_WRITE)) return AOTX_E_GRANT_FORBIDDEN;
    dev_reclaim(d);

    pl->actor = dev_find_participant(d, actor);
    const dev_participant *p = pl->actor == DEV_NONE ? NULL : &d->participants[pl->actor];
    uint64_t next = p ? p->next_sequence : 1, floor = p ? p->retry_floor : 1;
    if (req->sequence < floor) return AOTX_E_BELOW_RETRY_FLOOR;
    if (req->sequence > next) return AOTX_E_FUTURE_SEQUENCE;
    if (req->sequence < next) {
        uint32_t s = dev_find_receipt_seq(d, pl->actor, req->sequence);
        if (s == DEV_NONE) return AOTX_E_INTERNAL; /* [floor, next) always has receipts */
        const dev_receipt *r = &d->receipts[s];
        if (r->canon_len != pl->canon_len || memcmp(r->canon, pl->canon, pl->canon_len) != 0)
            return AOTX_E_SEQUENCE_CONFLICT;
        *retry_slot = s;
        return AOTX_OK;
    }
    if (req->kind == AOTX_KIND_REGISTER) {
        if (p) return AOTX_E_REGISTRATION_CONFLICT;
    } else if (!p) {
        return AOTX_E_PARTICIPANT_NOT_FOUND;
    }
    if (p) {
        for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
            const dev_receipt *r = &d->receipts[i];
            if (r->used && !r->retiring && r->actor == pl->actor &&
                memcmp(r->op_key, req->operation_key, 16) == 0)
                return AOTX_E_OPERATION_KEY_CONFLICT;
        }
    }
    uint64_t freed = 0;
    rc = prepare_kind(d, grants, pl, p, &freed);
    if (rc) return rc;
    /* Receipt slot: the reserve slot only takes a RETIRE that frees a receipt. */
    bool room = d->n_receipts < AOTX_MAX_RECEIPTS ||
                (req->kind == AOTX_KIND_RETIRE && freed > 0 && d->n_receipts < DEV_RECEIPT_SLOTS);
    if (!room) return AOTX_R_RECEIPT_TABLE_FULL;
    pl->slot = DEV_NONE;
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++)
        if (!d->receipts[i].used) { pl->slot = i; break; }
    if (pl->slot == DEV_NONE) return AOTX_E_INTERNAL;
    pl->admission_number = d->admissions + 1;
    dev_op_id(d, pl->admission_number, pl->op_id);
    pl->status = req->kind == AOTX_KIND_INPUT ? AOTX_STATUS_ADMITTED : AOTX_STATUS_SUCCEEDED;
    bool was_running = req->kind == AOTX_KIND_CANCEL &&
                       !dev_terminal(d->receipts[pl->target_receipt].status);
    result_json(d, pl, was_running);
    return AOTX_OK;
}

/* ---- the admission transfer ------------------------------------------- */

size_t dev_admission_encode(const dev_plan *pl, uint8_t *buf) {
    memset(buf, 0, AOTX_ADMISSION_HEADER);
    buf[0] = 1;
    buf[1] = pl->req->kind;
    buf[2] = pl->status;
    dev_le16(buf + 4, (uint16_t)pl->canon_len);
    dev_le16(buf + 6, (uint16_t)pl->result_len);
    memcpy(buf + 8, pl->actor_key, 16);
    memcpy(buf + 24, pl->op_id, 16);
    dev_le64(buf + 40, pl->admission_number);
    memcpy(buf + 48, pl->resource_id, 16);
    memcpy(buf + AOTX_ADMISSION_HEADER, pl->canon, pl->canon_len);
    memcpy(buf + AOTX_ADMISSION_HEADER + pl->canon_len, pl->result, pl->result_len);
    return AOTX_ADMISSION_HEADER + pl->canon_len + pl->result_len;
}

/* ---- apply: cannot fail ----------------------------------------------- */

void dev_apply(aotx_device *d, const dev_plan *pl, uint64_t record) {
    const aotx_request *q = pl->req;
    uint32_t actor = pl->actor;
    d->admissions = pl->admission_number;
    d->used = true;
    switch (q->kind) {
    case AOTX_KIND_REGISTER: {
        actor = d->n_participants++;
        dev_participant *p = &d->participants[actor];
        memcpy(p->key, pl->actor_key, 16);
        p->next_sequence = 1;
        p->retry_floor = 1;
        p->admission_number = pl->admission_number;
        break;
    }
    case AOTX_KIND_SPACE_CREATE: {
        dev_space *s = &d->spaces[d->n_spaces++];
        memcpy(s->id, pl->resource_id, 16);
        s->owner = actor;
        s->scope = q->scope;
        s->admission_number = pl->admission_number;
        s->conversations = 0;
        break;
    }
    case AOTX_KIND_MEMBER_SET:
        if (pl->member_row != DEV_NONE) {
            d->members[pl->member_row].rights = q->rights;
        } else {
            dev_member *m = &d->members[d->n_members++];
            m->space = pl->space;
            memcpy(m->key, q->participant, 16);
            m->rights = q->rights;
        }
        break;
    case AOTX_KIND_CONVERSATION_CREATE: {
        dev_conversation *c = &d->conversations[d->n_conversations++];
        memcpy(c->id, pl->resource_id, 16);
        c->space = pl->space;
        c->creator = actor;
        c->admission_number = pl->admission_number;
        c->inputs = 0;
        d->spaces[pl->space].conversations++;
        break;
    }
    case AOTX_KIND_INPUT:
        d->conversations[pl->conversation].inputs++;
        break;   /* the receipt takes the new count as its input_index below */
    case AOTX_KIND_CANCEL: {
        dev_receipt *t = &d->receipts[pl->target_receipt];
        if (!dev_terminal(t->status)) t->cancel_requested = 1;
        break;
    }
    case AOTX_KIND_PUBLISH:
        dev_publish_apply(d, pl, record);
        break;
    case AOTX_KIND_RETIRE:
        for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
            dev_receipt *r = &d->receipts[i];
            if (r->used && !r->retiring && r->actor == actor && r->sequence < q->retry_floor) {
                r->retiring = 1;
                r->retire_record = record;
            }
        }
        d->participants[actor].retry_floor = q->retry_floor;
        break;
    default:
        break;
    }
    dev_receipt *r = &d->receipts[pl->slot];
    uint8_t *canon = r->canon, *result = r->result;
    memset(r, 0, sizeof *r);
    r->canon = canon;
    r->result = result;
    r->used = 1;
    r->kind = q->kind;
    r->status = pl->status;
    r->actor = actor;
    r->sequence = q->sequence;
    memcpy(r->op_key, q->operation_key, 16);
    memcpy(r->op_id, pl->op_id, 16);
    memcpy(r->resource_id, pl->resource_id, 16);
    r->admission_number = pl->admission_number;
    r->admission_record = record;
    if (dev_terminal(pl->status)) {
        r->has_terminal_record = 1;
        r->terminal_record = record;
    }
    if (q->kind == AOTX_KIND_INPUT) {
        r->input_index = d->conversations[pl->conversation].inputs;
        r->retains = q->text_len > 0;
    }
    r->canon_len = pl->canon_len;
    memcpy(r->canon, pl->canon, pl->canon_len);
    r->result_len = pl->result_len;
    memcpy(r->result, pl->result, pl->result_len);
    d->n_receipts++;
    d->participants[actor].next_sequence = q->sequence + 1;
}

int dev_submit_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       const aotx_request *req, aotx_receipt_view *out) {
    if (!d || !actor || !req || !out) return AOTX_E_INVALID_ARGUMENT;
    if (d->replaying) return AOTX_E_DEVICE_STATE;
    dev_plan *pl = d->plan;
    uint32_t retry = DEV_NONE;
    int rc = dev_prepare(d, grants, actor, req, pl, &retry);
    if (rc) return rc;
    if (retry != DEV_NONE) {
        dev_receipt_view(d, retry, false, out);
        out->retry = 1;
        return AOTX_OK;
    }
    size_t len = dev_admission_encode(pl, d->scratch);
    uint64_t last = 0;
    rc = aotx_journal_enqueue(d->journal, AOTX_XFER_ADMISSION, d->scratch, (uint32_t)len, &last);
    if (rc) return rc;
    dev_apply(d, pl, last);
    dev_receipt_view(d, pl->slot, false, out);
    return AOTX_OK;
}

/* ---- executor ---------------------------------------------------------- */

int dev_start_locked(aotx_device *d, const uint8_t op_id[16]) {
    if (!d || !op_id) return AOTX_E_INVALID_ARGUMENT;
    uint32_t s = dev_find_receipt_by_op(d, op_id);
    if (s == DEV_NONE) return AOTX_E_OPERATION_NOT_FOUND;
    dev_receipt *r = &d->receipts[s];
    if (dev_terminal(r->status)) return AOTX_E_ALREADY_TERMINAL;
    if (r->admission_record >= dev_saved_records(d)) return AOTX_R_ADMISSION_UNSAVED;
    r->status = AOTX_STATUS_RUNNING;
    return AOTX_OK;
}

int dev_complete_check(const aotx_device *d, uint32_t slot, const dev_completion *c) {
    if (slot == DEV_NONE) return AOTX_E_OPERATION_NOT_FOUND;
    if (!dev_terminal(c->status)) return AOTX_E_STATUS_INVALID;
    if (c->finish > AOTX_FINISH_LENGTH ||
        (c->finish != AOTX_FINISH_NONE && c->status != AOTX_STATUS_SUCCEEDED))
        return AOTX_E_STATUS_INVALID;
    if (dev_terminal(d->receipts[slot].status)) return AOTX_E_ALREADY_TERMINAL;
    /* c carries the bytes after the journaled output (result_len so far) */
    if ((uint64_t)d->receipts[slot].result_len + c->len > AOTX_MAX_RESULT_BYTES)
        return AOTX_E_RESULT_TOO_LARGE;
    return AOTX_OK;
}

size_t dev_completion_encode(const uint8_t op_id[16], const dev_completion *c, uint8_t *buf) {
    memset(buf, 0, AOTX_COMPLETION_HEADER);
    buf[0] = 1;
    buf[1] = c->status;
    buf[2] = c->finish;
    dev_le32(buf + 4, c->len);
    memcpy(buf + 8, op_id, 16);
    dev_le32(buf + 24, c->in_tok);
    dev_le32(buf + 28, c->out_tok);
    if (c->len) memcpy(buf + AOTX_COMPLETION_HEADER, c->result, c->len);
    return AOTX_COMPLETION_HEADER + (size_t)c->len;
}

void dev_complete_apply(aotx_device *d, uint32_t slot, const dev_completion *c, uint64_t record) {
    dev_receipt *r = &d->receipts[slot];
    r->status = c->status;
    r->finish = c->finish;
    if (c->len) memcpy(r->result + r->result_len, c->result, c->len);
    r->result_len += c->len;  /* after the bytes OUTPUT transfers journaled */
    r->input_tokens = c->in_tok;
    r->output_tokens = c->out_tok;
    r->has_terminal_record = 1;
    r->terminal_record = record;
    d->used = true;
}

int dev_complete_locked(aotx_device *d, const uint8_t op_id[16], const dev_completion *c) {
    if (!d || !op_id || !c || (c->len && !c->result)) return AOTX_E_INVALID_ARGUMENT;
    uint32_t s = dev_find_receipt_by_op(d, op_id);
    if (s == DEV_NONE) return AOTX_E_OPERATION_NOT_FOUND;
    /* `c` holds the whole result: the journaled output must be its prefix, and
     * the completion carries the rest */
    uint32_t journaled = dev_terminal(d->receipts[s].status) ? 0 : d->receipts[s].result_len;
    if (journaled && (c->len < journaled || memcmp(c->result, d->receipts[s].result, journaled)))
        return AOTX_E_OUTPUT_CONFLICT;
    dev_completion tail = *c;
    tail.len -= journaled;
    if (tail.result) tail.result += journaled;
    c = &tail;
    int rc = dev_complete_check(d, s, c);
    if (rc) return rc;
    size_t n = dev_completion_encode(op_id, c, d->scratch);
    uint64_t last = 0;
    rc = aotx_journal_enqueue(d->journal, AOTX_XFER_COMPLETION, d->scratch, (uint32_t)n, &last);
    if (rc) return rc;
    dev_complete_apply(d, s, c, last);
    return AOTX_OK;
}
