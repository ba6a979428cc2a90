/* device_api.c -- the public entry points: each takes the device mutex and
 * calls its dev_*_locked body (the executor thread and the gateway call in
 * concurrently; every call is microseconds and never waits on I/O). */
#include "device_internal.h"

#define LOCKED(expr)                        \
    do {                                    \
        pthread_mutex_lock(&d->mu);         \
        dev_stamp_saves(d);                 \
        __typeof__(expr) rc_ = (expr);      \
        pthread_mutex_unlock(&d->mu);       \
        return rc_;                         \
    } while (0)

void aotx_device_usage_get(aotx_device *d, aotx_device_usage *out) {
    pthread_mutex_lock(&d->mu);
    dev_stamp_saves(d);
    dev_usage_get_locked(d, out);
    pthread_mutex_unlock(&d->mu);
}

int aotx_device_submit(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       const aotx_request *req, aotx_receipt_view *out) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(d->failed ? AOTX_E_DEVICE_STATE : dev_submit_locked(d, grants, actor, req, out));
}

int aotx_device_start(aotx_device *d, const uint8_t op_id[16]) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(d->failed ? AOTX_E_DEVICE_STATE : dev_start_locked(d, op_id));
}

int aotx_device_complete(aotx_device *d, const uint8_t op_id[16], uint8_t status,
                         uint8_t finish, const uint8_t *result, uint32_t len,
                         uint32_t input_tokens, uint32_t output_tokens) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    const dev_completion c = {.status = status, .finish = finish, .result = result, .len = len,
                              .in_tok = input_tokens, .out_tok = output_tokens};
    LOCKED(d->failed ? AOTX_E_DEVICE_STATE : dev_complete_locked(d, op_id, &c));
}

int aotx_device_lease_row(aotx_device *d, const uint8_t op_id[16], uint32_t request_index,
                          aotx_lease_row *out) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_lease_row_locked(d, op_id, request_index, out));
}

int aotx_device_lease(aotx_device *d, uint32_t revision, const aotx_lease_row *rows,
                      uint32_t n) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(d->failed ? AOTX_E_DEVICE_STATE : dev_lease_locked(d, revision, rows, n));
}

int aotx_device_output(aotx_device *d, const uint8_t op_id[16], const uint8_t *data,
                       uint32_t len, uint32_t input_tokens, uint32_t output_tokens) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(d->failed ? AOTX_E_DEVICE_STATE
                     : dev_output_locked(d, op_id, data, len, input_tokens, output_tokens));
}

int aotx_device_receipt(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                        const uint8_t op_id[16], aotx_receipt_view *out) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_receipt_locked(d, grants, actor, op_id, out));
}

int64_t aotx_device_result_read(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                                const uint8_t op_id[16], uint64_t offset, uint8_t *buf,
                                size_t cap, uint32_t *out_total) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_result_read_locked(d, grants, actor, op_id, offset, buf, cap, out_total));
}

int aotx_device_participant(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                            const uint8_t key[16], aotx_participant_view *out) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_participant_locked(d, grants, actor, key, out));
}

int aotx_device_space(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                      const uint8_t space[16], aotx_space_view *out) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_space_locked(d, grants, actor, space, out));
}

int aotx_device_spaces(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       uint64_t cursor, uint32_t limit, aotx_space_view *out,
                       uint32_t *out_n, uint64_t *out_next) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_spaces_locked(d, grants, actor, cursor, limit, out, out_n, out_next));
}

int aotx_device_members(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                        const uint8_t space[16], uint64_t cursor, uint32_t limit,
                        aotx_member_view *out, uint32_t *out_n, uint64_t *out_next) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_members_locked(d, grants, actor, space, cursor, limit, out, out_n, out_next));
}

int aotx_device_conversations(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                              const uint8_t space[16], uint64_t cursor, uint32_t limit,
                              aotx_conversation_view *out, uint32_t *out_n,
                              uint64_t *out_next) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_conversations_locked(d, grants, actor, space, cursor, limit, out, out_n,
                                    out_next));
}

int aotx_device_conversation(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                             const uint8_t conversation[16], aotx_conversation_view *out) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_conversation_locked(d, grants, actor, conversation, out));
}

int aotx_device_conversation_inputs(aotx_device *d, uint32_t grants, const uint8_t *actor,
                                    const uint8_t conversation[16], uint64_t cursor,
                                    uint32_t limit, aotx_receipt_view *out, uint32_t *out_n,
                                    uint64_t *out_next, uint64_t *out_floor) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_conversation_inputs_locked(d, grants, actor, conversation, cursor, limit, out,
                                          out_n, out_next, out_floor));
}

int aotx_device_canonical(aotx_device *d, const uint8_t op_id[16], uint8_t *buf, size_t cap,
                          uint32_t *out_len) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_canonical_locked(d, op_id, buf, cap, out_len));
}

int aotx_device_memory_retain(aotx_device *d, const uint8_t op_id[16], const float *embedding,
                              uint32_t dim, aotx_memory_row *out, uint32_t *out_rows) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(d->failed ? AOTX_E_DEVICE_STATE
                     : dev_memory_retain_locked(d, op_id, AOTX_RETENTION_MODE_1, embedding, dim,
                                                out, out_rows));
}

int aotx_device_memory_retain_mode(aotx_device *d, const uint8_t op_id[16], uint8_t mode,
                                   const float *embedding, uint32_t dim, aotx_memory_row *out,
                                   uint32_t *out_rows) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(d->failed ? AOTX_E_DEVICE_STATE
                     : dev_memory_retain_locked(d, op_id, mode, embedding, dim, out, out_rows));
}

int aotx_device_memory_interpret(aotx_device *d, const uint8_t op_id[16], const uint8_t *text,
                                 uint32_t text_len, const float *embedding, uint32_t dim,
                                 aotx_memory_row *out, uint32_t *out_rows) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(d->failed ? AOTX_E_DEVICE_STATE
                     : dev_memory_interpret_locked(d, op_id, text, text_len, embedding, dim, out,
                                                   out_rows));
}

int aotx_device_memory_list(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                            const uint8_t space[16], uint64_t cursor, uint32_t limit,
                            aotx_memory_row *out, uint32_t *out_n, uint64_t *out_next) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_memory_list_locked(d, grants, actor, space, cursor, limit, out, out_n, out_next));
}

int64_t aotx_device_memory_read(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                                const uint8_t space[16], const uint8_t object[16],
                                uint64_t offset, uint8_t *buf, size_t cap,
                                aotx_memory_row *row) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_memory_read_locked(d, grants, actor, space, object, offset, buf, cap, row));
}

int aotx_device_memory_recall(aotx_device *d, const uint8_t actor[16], const uint8_t space[16],
                              const float *query, uint32_t dim, const uint8_t *exclude,
                              uint32_t limit, aotx_memory_row *out, float *out_score,
                              uint32_t *out_n) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_memory_recall_locked(d, actor, space, query, dim, exclude, limit, out, out_score,
                                    out_n));
}

int aotx_device_recover(aotx_device *d, aotx_journal_reader *r, uint64_t *out_bad_record) {
    if (!d) return AOTX_E_INVALID_ARGUMENT;
    LOCKED(dev_recover_locked(d, r, out_bad_record));
}
