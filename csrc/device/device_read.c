/* device_read.c -- every read (receipts, results, participants, spaces, members,
 * conversations).  Reads check the caller's current grants first
 * (grant_forbidden), then stored rights (device_rights.c): a resource the
 * caller has no resolved right on reads as not found. */
#include "device_internal.h"

/* The receipt slot `actor` may read, or a code. Own receipts are always
 * visible; another participant's INPUT receipt is visible to readers of its
 * conversation's space (counters absent). A retiring receipt is never found
 * (dev_find_receipt_by_op), so a read needs no dev_reclaim scan of every slot:
 * the slots are freed where the count matters (submit, usage, input lists). */
static int readable_receipt(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                            const uint8_t op_id[16], uint32_t *slot, bool *foreign) {
    if (!(grants & AOTX_GRANT_READ)) return AOTX_E_GRANT_FORBIDDEN;
    uint32_t s = dev_find_receipt_by_op(d, op_id);
    if (s == DEV_NONE) return AOTX_E_OPERATION_NOT_FOUND;
    const dev_receipt *r = &d->receipts[s];
    uint32_t me = dev_find_participant(d, actor);
    if (me != DEV_NONE && r->actor == me) {
        *slot = s;
        *foreign = false;
        return AOTX_OK;
    }
    if (r->kind != AOTX_KIND_INPUT) return AOTX_E_OPERATION_NOT_FOUND;
    uint32_t c = dev_find_conversation(d, r->resource_id);
    if (c == DEV_NONE) return AOTX_E_OPERATION_NOT_FOUND;
    int rc = dev_space_access(d, grants, me, d->conversations[c].space, AOTX_RIGHT_READ,
                              AOTX_E_OPERATION_NOT_FOUND);
    if (rc) return rc;
    *slot = s;
    *foreign = true;
    return AOTX_OK;
}

int dev_receipt_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                        const uint8_t op_id[16], aotx_receipt_view *out) {
    if (!d || !actor || !op_id || !out) return AOTX_E_INVALID_ARGUMENT;
    uint32_t s;
    bool foreign;
    int rc = readable_receipt(d, grants, actor, op_id, &s, &foreign);
    if (rc) return rc;
    dev_receipt_view(d, s, foreign, out);
    return AOTX_OK;
}

int64_t dev_result_read_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                                const uint8_t op_id[16], uint64_t offset, uint8_t *buf,
                                size_t cap, uint32_t *out_total) {
    if (!d || !actor || !op_id || (cap && !buf)) return AOTX_E_INVALID_ARGUMENT;
    uint32_t s;
    bool foreign;
    int rc = readable_receipt(d, grants, actor, op_id, &s, &foreign);
    if (rc) return rc;
    const dev_receipt *r = &d->receipts[s];
    uint32_t visible = dev_result_visible(d, s);
    if (out_total) *out_total = visible;
    if (offset >= visible) return 0;
    size_t n = visible - (size_t)offset;
    if (n > cap) n = cap;
    memcpy(buf, r->result + offset, n);
    return (int64_t)n;
}

int dev_participant_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                            const uint8_t key[16], aotx_participant_view *out) {
    if (!d || !actor || !key || !out) return AOTX_E_INVALID_ARGUMENT;
    if (!(grants & AOTX_GRANT_READ)) return AOTX_E_GRANT_FORBIDDEN;
    uint32_t p = dev_find_participant(d, key);
    bool own = memcmp(actor, key, 16) == 0;
    if (!own && p == DEV_NONE) return AOTX_E_PARTICIPANT_NOT_FOUND;
    memset(out, 0, sizeof *out);
    memcpy(out->key, key, 16);
    out->registered = p != DEV_NONE;
    out->counters_visible = own;
    if (own) {
        out->next_sequence = p == DEV_NONE ? 1 : d->participants[p].next_sequence;
        out->retry_floor = p == DEV_NONE ? 1 : d->participants[p].retry_floor;
    }
    return AOTX_OK;
}

static void space_view(const aotx_device *d, uint32_t s, uint8_t eff, aotx_space_view *out) {
    const dev_space *sp = &d->spaces[s];
    memset(out, 0, sizeof *out);
    memcpy(out->id, sp->id, 16);
    memcpy(out->owner, d->participants[sp->owner].key, 16);
    out->scope = sp->scope;
    out->rights = eff;
    out->admission_number = sp->admission_number;
    out->conversations = sp->conversations;
}

int dev_space_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                      const uint8_t space[16], aotx_space_view *out) {
    if (!d || !actor || !space || !out) return AOTX_E_INVALID_ARGUMENT;
    uint32_t s;
    int rc = dev_space_for_read(d, grants, actor, space, &s);
    if (rc) return rc;
    uint8_t rights = dev_resolved_rights(d, s, dev_find_participant(d, actor));
    space_view(d, s, rights & (uint8_t)grants, out);
    return AOTX_OK;
}

int dev_spaces_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       uint64_t cursor, uint32_t limit, aotx_space_view *out,
                       uint32_t *out_n, uint64_t *out_next) {
    if (!d || !actor || !out_n || !out_next || (limit && !out)) return AOTX_E_INVALID_ARGUMENT;
    if (!(grants & AOTX_GRANT_READ)) return AOTX_E_GRANT_FORBIDDEN;
    if (cursor > d->n_spaces) return AOTX_E_CURSOR_INVALID;
    uint32_t me = dev_find_participant(d, actor);
    uint32_t n = 0;
    uint64_t i = cursor;
    for (; i < d->n_spaces && n < limit; i++) {
        uint8_t resolved = dev_resolved_rights(d, (uint32_t)i, me);
        if (!(resolved & grants & AOTX_RIGHT_READ)) continue;
        space_view(d, (uint32_t)i, resolved & (uint8_t)grants, &out[n++]);
    }
    *out_n = n;
    *out_next = i < d->n_spaces ? i : 0;
    return AOTX_OK;
}

int dev_members_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                        const uint8_t space[16], uint64_t cursor, uint32_t limit,
                        aotx_member_view *out, uint32_t *out_n, uint64_t *out_next) {
    if (!d || !actor || !space || !out_n || !out_next || (limit && !out))
        return AOTX_E_INVALID_ARGUMENT;
    uint32_t s;
    int rc = dev_space_for_read(d, grants, actor, space, &s);
    if (rc) return rc;
    if (cursor > d->n_members) return AOTX_E_CURSOR_INVALID;
    uint32_t n = 0;
    uint64_t i = cursor;
    for (; i < d->n_members && n < limit; i++) {
        const dev_member *m = &d->members[i];
        if (m->space != s) continue;
        memset(&out[n], 0, sizeof out[n]);
        memcpy(out[n].participant, m->key, 16);
        out[n].rights = m->rights;
        n++;
    }
    *out_n = n;
    *out_next = i < d->n_members ? i : 0;
    return AOTX_OK;
}

static void conversation_view(const aotx_device *d, uint32_t c, aotx_conversation_view *out) {
    const dev_conversation *cv = &d->conversations[c];
    memset(out, 0, sizeof *out);
    memcpy(out->id, cv->id, 16);
    memcpy(out->space, d->spaces[cv->space].id, 16);
    memcpy(out->creator, d->participants[cv->creator].key, 16);
    out->admission_number = cv->admission_number;
    out->inputs = cv->inputs;
}

int dev_conversations_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                              const uint8_t space[16], uint64_t cursor, uint32_t limit,
                              aotx_conversation_view *out, uint32_t *out_n,
                              uint64_t *out_next) {
    if (!d || !actor || !space || !out_n || !out_next || (limit && !out))
        return AOTX_E_INVALID_ARGUMENT;
    uint32_t s;
    int rc = dev_space_for_read(d, grants, actor, space, &s);
    if (rc) return rc;
    if (cursor > d->n_conversations) return AOTX_E_CURSOR_INVALID;
    uint32_t n = 0;
    uint64_t i = cursor;
    for (; i < d->n_conversations && n < limit; i++) {
        if (d->conversations[i].space != s) continue;
        conversation_view(d, (uint32_t)i, &out[n++]);
    }
    *out_n = n;
    *out_next = i < d->n_conversations ? i : 0;
    return AOTX_OK;
}

int dev_conversation_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                             const uint8_t conversation[16], aotx_conversation_view *out) {
    if (!d || !actor || !conversation || !out) return AOTX_E_INVALID_ARGUMENT;
    if (!(grants & AOTX_GRANT_READ)) return AOTX_E_GRANT_FORBIDDEN;
    uint32_t me = dev_find_participant(d, actor);
    uint32_t c = dev_find_conversation(d, conversation);
    int rc = dev_space_access(d, grants, me, c == DEV_NONE ? DEV_NONE : d->conversations[c].space,
                              AOTX_RIGHT_READ, AOTX_E_CONVERSATION_NOT_FOUND);
    if (rc) return rc;
    conversation_view(d, c, out);
    return AOTX_OK;
}

/* The live INPUT slot of conversation `c` with the least input_index > after,
 * or DEV_NONE.  (A scan of the receipt table per row: the table is small and
 * fixed, and listing pages are bounded by `limit`.) */
static uint32_t next_input(const aotx_device *d, const uint8_t conv_id[16], uint64_t after) {
    uint32_t best = DEV_NONE;
    for (uint32_t i = 0; i < DEV_RECEIPT_SLOTS; i++) {
        const dev_receipt *r = &d->receipts[i];
        if (!r->used || r->retiring || r->kind != AOTX_KIND_INPUT) continue;
        if (r->input_index <= after || memcmp(r->resource_id, conv_id, 16) != 0) continue;
        if (best == DEV_NONE || r->input_index < d->receipts[best].input_index) best = i;
    }
    return best;
}

int dev_conversation_inputs_locked(aotx_device *d, uint32_t grants, const uint8_t *actor,
                                   const uint8_t conversation[16], uint64_t cursor,
                                   uint32_t limit, aotx_receipt_view *out, uint32_t *out_n,
                                   uint64_t *out_next, uint64_t *out_floor) {
    if (!d || !conversation || !out_n || !out_next || !out_floor || (limit && !out))
        return AOTX_E_INVALID_ARGUMENT;
    uint32_t c = dev_find_conversation(d, conversation);
    uint32_t me = DEV_NONE;
    if (actor) {
        if (!(grants & AOTX_GRANT_READ)) return AOTX_E_GRANT_FORBIDDEN;
        me = dev_find_participant(d, actor);
        int rc = dev_space_access(d, grants, me, c == DEV_NONE ? DEV_NONE : d->conversations[c].space,
                                  AOTX_RIGHT_READ, AOTX_E_CONVERSATION_NOT_FOUND);
        if (rc) return rc;
    } else if (c == DEV_NONE) {
        return AOTX_E_CONVERSATION_NOT_FOUND;
    }
    dev_reclaim(d);
    const dev_conversation *cv = &d->conversations[c];
    if (cursor > cv->inputs) return AOTX_E_CURSOR_INVALID;
    uint32_t first = next_input(d, cv->id, 0);
    *out_floor = first == DEV_NONE ? cv->inputs : d->receipts[first].input_index - 1;
    uint32_t n = 0;
    uint64_t at = cursor;
    uint32_t s = next_input(d, cv->id, at);
    while (s != DEV_NONE && n < limit) {
        dev_receipt_view(d, s, actor != NULL && d->receipts[s].actor != me, &out[n++]);
        at = d->receipts[s].input_index;
        s = next_input(d, cv->id, at);
    }
    *out_n = n;
    *out_next = s != DEV_NONE ? at : 0;
    return AOTX_OK;
}

int dev_canonical_locked(aotx_device *d, const uint8_t op_id[16], uint8_t *buf, size_t cap,
                         uint32_t *out_len) {
    if (!d || !op_id || !out_len || (cap && !buf)) return AOTX_E_INVALID_ARGUMENT;
    uint32_t s = dev_find_receipt_by_op(d, op_id);
    if (s == DEV_NONE) return AOTX_E_OPERATION_NOT_FOUND;
    const dev_receipt *r = &d->receipts[s];
    *out_len = r->canon_len;
    memcpy(buf, r->canon, r->canon_len < cap ? r->canon_len : cap);
    return AOTX_OK;
}
