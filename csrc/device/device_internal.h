/* device_internal.h -- the device's tables, shared by the .c files of csrc/device/ only.
 *
 * The files are layers; a call points down (or sideways inside the lower layer,
 * rights -> tables -> canon), never up:
 *
 *   device_api.c          the public calls: the mutex, dev_stamp_saves, one *_locked body
 *        |
 *   device_recover.c      replay: admissions, leases, outputs, memory transfers
 *        |
 *   device.c              admission (prepare -> enqueue -> apply), start/complete
 *        |
 *   device_lease.c  device_memory.c  device_read.c  device_checkpoint.c   the other kinds
 *        |                (PUBLISH's plan lives in device_memory.c, called by admission)
 *   ------------------------------------------------------------------- lower layer
 *   device_rights.c       the rights rule: resolved rights, the space access check
 *   device_tables.c       lookups, ids (op, object, resource), views, save bookkeeping
 *   device_canon.c        bytes: little-endian, hex, UTF-8, canonical form, memory rows
 *
 * A higher file may skip layers (device_api.c calls every kind; recovery calls
 * the lease and memory replays); no lower file includes a higher one's names. */
#ifndef AOTX_DEVICE_INTERNAL_H
#define AOTX_DEVICE_INTERNAL_H

#include "aotx_device.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#define DEV_NONE UINT32_MAX
/* Physical receipt slots: one reserve slot lets a RETIRE that frees at least
 * one receipt enter a full table (docs/formats/device.md, "Receipts"). */
#define DEV_RECEIPT_SLOTS (AOTX_MAX_RECEIPTS + 1)
/* Largest canonical form: header 48 + input body 48 + 8 media rows of 33 +
 * model 128 + text 2048. */
#define DEV_CANON_MAX (48 + 48 + 8 * 33 + 128 + 2048)
#define DEV_CANON_STRIDE \
    (AOTX_MAX_COMMAND_BYTES < DEV_CANON_MAX ? AOTX_MAX_COMMAND_BYTES : DEV_CANON_MAX)
#define DEV_RESULT_JSON_MAX 512
/* Per-slot result storage: AOTX_MAX_RESULT_BYTES, but never below what an
 * immediate kind's JSON result needs. */
#define DEV_RESULT_STRIDE \
    (AOTX_MAX_RESULT_BYTES > DEV_RESULT_JSON_MAX ? AOTX_MAX_RESULT_BYTES : DEV_RESULT_JSON_MAX)
#define DEV_ALL_GRANTS 7u

typedef struct dev_participant {
    uint8_t key[16];
    uint64_t next_sequence;
    uint64_t retry_floor;
    uint64_t admission_number;  /* of its registration */
} dev_participant;

typedef struct dev_space {
    uint8_t id[16];
    uint32_t owner;             /* participant index */
    uint8_t scope;
    uint64_t admission_number;
    uint64_t conversations;
} dev_space;

typedef struct dev_member {
    uint32_t space;             /* space index */
    uint8_t key[16];            /* the member's principal key (registered or not yet) */
    uint8_t rights;
} dev_member;

typedef struct dev_conversation {
    uint8_t id[16];
    uint32_t space;             /* space index */
    uint32_t creator;           /* participant index */
    uint64_t admission_number;
    uint64_t inputs;
} dev_conversation;

typedef struct dev_receipt {
    uint8_t used;
    uint8_t retiring;           /* under the actor's floor; freed once retire_record is saved */
    uint8_t kind;
    uint8_t status;
    uint8_t cancel_requested;
    uint8_t has_terminal_record;
    uint32_t actor;             /* participant index */
    uint64_t sequence;
    uint8_t op_key[16];
    uint8_t op_id[16];
    uint8_t resource_id[16];
    uint64_t admission_number;
    uint64_t admission_record;  /* last record of the admission transfer */
    uint64_t terminal_record;   /* last record of the terminal result */
    uint64_t retire_record;     /* last record of the retirement (when retiring) */
    uint8_t save_known;         /* `save` holds the admission's save */
    aotx_save_id save;          /* the save that acknowledged the admission (frozen) */
    uint32_t input_tokens, output_tokens;
    uint8_t finish;             /* AOTX_FINISH_* */
    uint64_t input_index;       /* INPUT: 1-based place in its conversation's input order */
    uint8_t retains;            /* INPUT with text: two memory rows are promised to it */
    uint8_t retained;           /* its memory rows are retained (never again) */
    uint8_t mode;               /* the retention mode recorded with them (1 or 2) */
    uint8_t interpreted;        /* mode 2: its interpretation rows are retained (never again) */
    uint8_t leased;             /* an execution lease names it (never twice) */
    uint8_t lease_revision;
    uint8_t lease_mode;
    uint64_t lease_record;      /* last record of its lease transfer */
    uint64_t output_record;     /* last record of its newest OUTPUT transfer (when has_output) */
    uint8_t has_output;
    uint32_t output_visible;    /* result bytes known saved when output_record is not */
    uint32_t canon_len;
    uint32_t result_len;
    uint8_t *canon;             /* [DEV_CANON_STRIDE] */
    uint8_t *result;            /* [DEV_RESULT_STRIDE] */
} dev_receipt;

typedef struct dev_memory {
    aotx_memory_row row;
    uint64_t record;            /* last record of its MEMORY transfer: saved once below saved_records */
    uint8_t *payload;           /* [AOTX_MEMORY_PAYLOAD_MAX] */
} dev_memory;

struct aotx_device {
    aotx_device_params params;
    uint8_t lineage[16];
    aotx_journal *journal;      /* borrowed */
    uint64_t admissions;        /* admission counter (last assigned number) */
    bool replaying;             /* recovery: every record counts as saved */
    bool used;                  /* anything admitted or recovered */
    bool failed;                /* recovery refused: tables wiped, mutations refused */
    uint64_t stamped_saved;     /* saved_records when receipts last took their save ids */
    /* recovery: receipts whose save (generation replay_gen) is not closed yet */
    uint32_t *replay_pending;          /* [DEV_RECEIPT_SLOTS] slots */
    uint64_t *replay_pending_adm;      /* [DEV_RECEIPT_SLOTS] their admission numbers */
    uint32_t n_replay_pending;
    uint64_t replay_gen, replay_boot;
    uint32_t n_participants, n_spaces, n_conversations, n_members;
    uint32_t n_receipts;        /* occupied slots */
    dev_participant *participants;     /* [AOTX_MAX_PARTICIPANTS] */
    dev_space *spaces;                 /* [AOTX_MAX_SPACES] */
    dev_member *members;               /* [AOTX_MAX_MEMBERS] */
    dev_conversation *conversations;   /* [AOTX_MAX_CONVERSATIONS] */
    dev_receipt *receipts;             /* [DEV_RECEIPT_SLOTS] */
    uint32_t n_memory;
    dev_memory *memory;                /* [AOTX_MAX_MEMORY] rows, appended in retention order */
    uint8_t *memory_store;             /* [AOTX_MAX_MEMORY][AOTX_MEMORY_PAYLOAD_MAX] */
    uint8_t *canon_store;              /* [DEV_RECEIPT_SLOTS][DEV_CANON_STRIDE] */
    uint8_t *result_store;             /* [DEV_RECEIPT_SLOTS][DEV_RESULT_STRIDE] */
    uint8_t *scratch;                  /* [scratch_cap] admission/completion encode buffer */
    size_t scratch_cap;
    struct dev_plan *plan;             /* [1] the admission being prepared */
    /* checkpoints (device_checkpoint.c) */
    bool ck_loaded;                    /* tables came from a checkpoint at ck_records */
    bool ck_offline;                   /* recovery for an offline checkpoint: no interrupt pass */
    uint64_t ck_records;
    pthread_mutex_t mu;                /* every public call holds it (device_api.c) */
    bool mu_ready;
};

/* What a validated admission will do; filled by dev_prepare, applied by dev_apply. */
typedef struct dev_plan {
    const aotx_request *req;
    uint8_t actor_key[16];
    uint32_t actor;             /* participant index, DEV_NONE for REGISTER */
    uint32_t space;             /* target space index */
    uint32_t conversation;      /* target conversation index */
    uint32_t member_row;        /* existing row or DEV_NONE */
    uint32_t target_receipt;    /* CANCEL */
    uint32_t memory_src;        /* PUBLISH: the source text row */
    uint32_t slot;              /* receipt slot for the new receipt */
    uint64_t admission_number;
    uint8_t op_id[16];
    uint8_t resource_id[16];
    uint8_t status;             /* status after admission */
    uint32_t canon_len;
    uint8_t canon[DEV_CANON_MAX];
    uint32_t result_len;
    uint8_t result[DEV_RESULT_JSON_MAX]; /* immediate-kind result JSON */
} dev_plan;

/* ---- lower layer ----------------------------------------------------- */

/* device_canon.c */
int dev_validate_request(const aotx_request *req);
bool dev_utf8_valid(const uint8_t *s, size_t n);
bool dev_is_zero(const uint8_t *b, size_t n);
void dev_memory_row_encode(const aotx_memory_row *r, uint8_t *b);   /* 128 bytes */
void dev_le16(uint8_t *p, uint16_t v);
void dev_le32(uint8_t *p, uint32_t v);
void dev_le64(uint8_t *p, uint64_t v);
uint16_t dev_rd16(const uint8_t *p);
uint32_t dev_rd32(const uint8_t *p);
uint64_t dev_rd64(const uint8_t *p);
void dev_hex(const uint8_t *b, size_t n, char *out);

/* device_tables.c */
uint32_t dev_find_participant(const aotx_device *d, const uint8_t key[16]);
uint32_t dev_find_space(const aotx_device *d, const uint8_t id[16]);
uint32_t dev_find_conversation(const aotx_device *d, const uint8_t id[16]);
uint32_t dev_find_member_row(const aotx_device *d, uint32_t space, const uint8_t key[16]);
uint32_t dev_find_receipt_seq(const aotx_device *d, uint32_t actor, uint64_t sequence);
uint32_t dev_find_receipt_by_op(const aotx_device *d, const uint8_t op_id[16]);
uint64_t dev_saved_records(const aotx_device *d);
void dev_stamp_saves(aotx_device *d);
void dev_reclaim(aotx_device *d);
bool dev_terminal(uint8_t status);   /* AOTX_STATUS_SUCCEEDED .. DEADLINE_EXCEEDED */
uint32_t dev_memory_promised(const aotx_device *d);
uint32_t dev_result_visible(const aotx_device *d, uint32_t slot);
void dev_op_id(const aotx_device *d, uint64_t n, uint8_t out[16]);
void dev_memory_id(const aotx_device *d, uint64_t m, uint8_t out[16]);
/* "<prefix>-<lineage hex>-<id hex>" into out[80] (the results' resource ids). */
void dev_res_id(const aotx_device *d, const char *prefix, const uint8_t id[16], char *out);
void dev_receipt_view(aotx_device *d, uint32_t slot, bool foreign, aotx_receipt_view *out);

/* device_rights.c */
uint8_t dev_resolved_rights(const aotx_device *d, uint32_t space, uint32_t participant);
int dev_space_access(const aotx_device *d, uint32_t grants, uint32_t actor, uint32_t space,
                     uint8_t need, int not_found);
int dev_space_for_read(const aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       const uint8_t space[16], uint32_t *out);

/* ---- operation kinds -------------------------------------------------- */

/* device.c: admission */
int dev_prepare(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                const aotx_request *req, dev_plan *plan, uint32_t *retry_slot);
size_t dev_admission_encode(const dev_plan *plan, uint8_t *buf);
void dev_apply(aotx_device *d, const dev_plan *plan, uint64_t record);
/* The terminal result of an INPUT: what a COMPLETION transfer carries. */
typedef struct dev_completion {
    uint8_t status;             /* AOTX_STATUS_* (terminal) */
    uint8_t finish;             /* AOTX_FINISH_*: STOP/LENGTH only with SUCCEEDED */
    const uint8_t *result;      /* [len] */
    uint32_t len;
    uint32_t in_tok, out_tok;
} dev_completion;

int dev_complete_check(const aotx_device *d, uint32_t slot, const dev_completion *c);
void dev_complete_apply(aotx_device *d, uint32_t slot, const dev_completion *c, uint64_t record);
size_t dev_completion_encode(const uint8_t op_id[16], const dev_completion *c, uint8_t *buf);

/* device_lease.c */
uint32_t dev_retention_mode(const aotx_device *d, uint32_t slot);
int dev_lease_locked(aotx_device *d, uint32_t revision, const aotx_lease_row *rows, uint32_t n);
int dev_lease_row_locked(aotx_device *d, const uint8_t op_id[16], uint32_t request_index,
                         aotx_lease_row *out);
int dev_output_locked(aotx_device *d, const uint8_t op_id[16], const uint8_t *data, uint32_t len,
                      uint32_t input_tokens, uint32_t output_tokens);
int dev_lease_replay(aotx_device *d, const uint8_t *data, uint32_t len, uint64_t record);
int dev_output_replay(aotx_device *d, const uint8_t *data, uint32_t len, uint64_t record);

/* device_memory.c */
int dev_publish_prepare(const aotx_device *d, uint32_t grants, dev_plan *pl);
void dev_publish_apply(aotx_device *d, const dev_plan *pl, uint64_t record);
int dev_memory_replay(aotx_device *d, const uint8_t *data, uint32_t len, uint64_t record);
int dev_memory_retain_locked(aotx_device *d, const uint8_t op_id[16], uint8_t mode,
                             const float *embedding, uint32_t dim, aotx_memory_row *out,
                             uint32_t *out_rows);
int dev_memory_interpret_locked(aotx_device *d, const uint8_t op_id[16], const uint8_t *text,
                                uint32_t text_len, const float *embedding, uint32_t dim,
                                aotx_memory_row *out, uint32_t *out_rows);
int dev_memory_list_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                           const uint8_t space[16], uint64_t cursor, uint32_t limit,
                           aotx_memory_row *out, uint32_t *out_n, uint64_t *out_next);
int64_t dev_memory_read_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                               const uint8_t space[16], const uint8_t object[16],
                               uint64_t offset, uint8_t *buf, size_t cap, aotx_memory_row *row);
int dev_memory_recall_locked(aotx_device *d, const uint8_t actor[16], const uint8_t space[16],
                             const float *query, uint32_t dim, const uint8_t *exclude,
                             uint32_t limit, aotx_memory_row *out, float *out_score,
                             uint32_t *out_n);

/* The bodies of the public calls (device_api.c takes the mutex around them):
 * device.c, device_read.c, device_recover.c. */
void dev_usage_get_locked(aotx_device *d, aotx_device_usage *out);
int dev_submit_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                      const aotx_request *req, aotx_receipt_view *out);
int dev_start_locked(aotx_device *d, const uint8_t op_id[16]);
int dev_complete_locked(aotx_device *d, const uint8_t op_id[16], const dev_completion *c);
int dev_receipt_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       const uint8_t op_id[16], aotx_receipt_view *out);
int64_t dev_result_read_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                               const uint8_t op_id[16], uint64_t offset, uint8_t *buf,
                               size_t cap, uint32_t *out_total);
int dev_participant_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                           const uint8_t key[16], aotx_participant_view *out);
int dev_space_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                     const uint8_t space[16], aotx_space_view *out);
int dev_spaces_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16], uint64_t cursor,
                      uint32_t limit, aotx_space_view *out, uint32_t *out_n,
                      uint64_t *out_next);
int dev_members_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       const uint8_t space[16], uint64_t cursor, uint32_t limit,
                       aotx_member_view *out, uint32_t *out_n, uint64_t *out_next);
int dev_conversations_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                             const uint8_t space[16], uint64_t cursor, uint32_t limit,
                             aotx_conversation_view *out, uint32_t *out_n,
                             uint64_t *out_next);
int dev_conversation_locked(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                            const uint8_t conversation[16], aotx_conversation_view *out);
int dev_conversation_inputs_locked(aotx_device *d, uint32_t grants, const uint8_t *actor,
                                   const uint8_t conversation[16], uint64_t cursor,
                                   uint32_t limit, aotx_receipt_view *out, uint32_t *out_n,
                                   uint64_t *out_next, uint64_t *out_floor);
int dev_canonical_locked(aotx_device *d, const uint8_t op_id[16], uint8_t *buf, size_t cap,
                         uint32_t *out_len);
int dev_recover_locked(aotx_device *d, aotx_journal_reader *r, uint64_t *out_bad_record);

#endif
