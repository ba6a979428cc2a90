/* aotx_device.h -- the durable shared-state device: fixed-capacity tables
 * (participants, spaces, members, conversations, receipts), sequenced
 * mutations with canonical operation bytes, rights, and recovery from the
 * journal.  Byte layouts: docs/formats/device.md.
 *
 * Every call takes the caller's CURRENT grants (AOTX_GRANT_*) and the
 * caller's 16-byte principal key (sha256(principal name)[:16]).  A refused
 * call changes nothing.  Submitting a mutation validates everything, encodes
 * the admission transfer, enqueues it in the journal (which may hold), and
 * only then changes the tables.
 */
#ifndef AOTX_DEVICE_H
#define AOTX_DEVICE_H

#include "aotx.h"
#include "aotx_journal.h"

/* CDEF-BEGIN */
/* (aotx_journal.h's CDEF text comes after this one: name its types as
 * `struct aotx_journal` here.) */
enum {
    /* mutation kinds (canonical byte 1) */
    AOTX_KIND_REGISTER = 1,
    AOTX_KIND_SPACE_CREATE = 2,
    AOTX_KIND_MEMBER_SET = 3,
    AOTX_KIND_CONVERSATION_CREATE = 4,
    AOTX_KIND_INPUT = 5,
    AOTX_KIND_CANCEL = 6,
    AOTX_KIND_RETIRE = 7,
    AOTX_KIND_PUBLISH = 8,     /* copy a retained text memory into another space */

    AOTX_SCOPE_PRIVATE = 0,
    AOTX_SCOPE_ROOM = 1,
    AOTX_SCOPE_INSTANCE = 2,

    /* space rights (member rows) */
    AOTX_RIGHT_READ = 1,
    AOTX_RIGHT_WRITE = 2,
    AOTX_RIGHT_MANAGE = 4,
    /* current principal grants */
    AOTX_GRANT_READ = 1,    /* shared_read */
    AOTX_GRANT_WRITE = 2,   /* shared_write */
    AOTX_GRANT_MANAGE = 4,  /* shared_manage */

    /* receipt status */
    AOTX_STATUS_ADMITTED = 0,
    AOTX_STATUS_RUNNING = 1,
    AOTX_STATUS_SUCCEEDED = 2,
    AOTX_STATUS_FAILED = 3,
    AOTX_STATUS_CANCELLED = 4,
    AOTX_STATUS_INTERRUPTED = 5,
    AOTX_STATUS_DEADLINE_EXCEEDED = 6,

    /* why a succeeded INPUT stopped (completion byte 2); 0 for other statuses */
    AOTX_FINISH_NONE = 0,
    AOTX_FINISH_STOP = 1,       /* end of turn / end of sequence token */
    AOTX_FINISH_LENGTH = 2,     /* max_output_tokens or the context ran out */

    AOTX_MEDIA_IMAGE = 1,
    AOTX_MEDIA_AUDIO = 2,

    AOTX_MAX_MEDIA = 8,
    AOTX_MAX_TEXT_BYTES = 2048,      /* text + media links */
    AOTX_MEDIA_LINK_BYTES = 73,      /* per media row, separator included */
    AOTX_MAX_MODEL_NAME = 128,
    AOTX_CANON_HEADER = 48,
    AOTX_ADMISSION_HEADER = 72,
    AOTX_COMPLETION_HEADER = 32,

    /* memory (docs/formats/device.md, "Memory rows") */
    AOTX_MEMORY_TEXT = 1,            /* an input's retained source text (UTF-8) */
    AOTX_MEMORY_EMBEDDING = 2,       /* its embedding: dim little-endian float32 */
    AOTX_MEMORY_INTERPRETATION = 3,  /* mode 2: the model's interpretation of an input (UTF-8) */
    AOTX_RETENTION_MODE_1 = 1,       /* source text + embedding */
    AOTX_RETENTION_MODE_2 = 2,       /* mode 1 + automatic interpretation (+ its embedding) */
    AOTX_MEMORY_RETAINED = 1,        /* origin: retained from an input (source: its operation) */
    AOTX_MEMORY_PUBLISHED = 2,       /* origin: a publication's copy (source: the object copied) */
    AOTX_MEMORY_ROW_BYTES = 128,
    AOTX_MEMORY_HEADER = 8,          /* memory transfer header */
    AOTX_MEMORY_MAX_DIM = 512,       /* embedding dimensions a row can hold */
    AOTX_MEMORY_PAYLOAD_MAX = 2048,  /* per row: max(text 2048, 512 float32) */

    /* codes: 1xx.  A code >0 is a refusal a later retry of the same call may
     * get past (a table or the receipt table full, a retirement waiting for
     * saves, execution waiting for a saved admission); a code <0 is an error:
     * the request is malformed, invalid, forbidden, names nothing, or
     * conflicts with state that will not change by itself.  Either leaves the
     * device unchanged.  tests/test_native.py checks the sign of every code
     * by its name. */
    AOTX_R_PARTICIPANTS_FULL = 101,
    AOTX_R_SPACES_FULL = 102,
    AOTX_R_CONVERSATIONS_FULL = 103,
    AOTX_R_MEMBERS_FULL = 104,
    AOTX_R_RECEIPT_TABLE_FULL = 105,
    AOTX_R_RETIREMENT_BLOCKED = 106,      /* a receipt below the floor has no saved terminal result yet */
    AOTX_R_ADMISSION_UNSAVED = 107,       /* start before the admission is saved */
    AOTX_R_MEMORY_FULL = 108,             /* the memory table (with rows promised to admitted inputs) is full */
    /* errors (<0) */
    AOTX_E_RECOVERY_DAMAGE = -101,        /* a journal transfer contradicts the replayed state */
    AOTX_E_DEVICE_STATE = -102,           /* call out of order (recover on a used device) */
    /* state conflicts */
    AOTX_E_LINEAGE_MISMATCH = -110,
    AOTX_E_SEQUENCE_CONFLICT = -111,
    AOTX_E_FUTURE_SEQUENCE = -112,
    AOTX_E_BELOW_RETRY_FLOOR = -113,
    AOTX_E_OPERATION_KEY_CONFLICT = -114,
    AOTX_E_REGISTRATION_CONFLICT = -115,
    AOTX_E_SPACE_ID_CONFLICT = -116,
    AOTX_E_CONVERSATION_ID_CONFLICT = -117,
    AOTX_E_ALREADY_TERMINAL = -118,       /* complete/start on a finished receipt */
    AOTX_E_MEMORY_RETAINED = -119,        /* the input's memory is retained already (never twice) */
    /* not found, forbidden */
    AOTX_E_PARTICIPANT_NOT_FOUND = -120,
    AOTX_E_SPACE_NOT_FOUND = -121,
    AOTX_E_CONVERSATION_NOT_FOUND = -122,
    AOTX_E_OPERATION_NOT_FOUND = -123,
    AOTX_E_MEMBER_NOT_FOUND = -124,       /* kept for the ABI: MEMBER_SET accepts unregistered keys */
    AOTX_E_TARGET_NOT_FOUND = -125,       /* CANCEL target sequence has no live receipt */
    AOTX_E_FORBIDDEN = -126,              /* space right missing on a visible resource */
    AOTX_E_GRANT_FORBIDDEN = -127,        /* current principal grant missing */
    AOTX_E_MEMORY_NOT_FOUND = -128,       /* no such saved memory object visible in the space */
    /* malformed or out-of-range fields */
    AOTX_E_KIND_INVALID = -130,
    AOTX_E_OPERATION_KEY_INVALID = -131,  /* all-zero key */
    AOTX_E_SCOPE_INVALID = -132,
    AOTX_E_RIGHTS_INVALID = -133,
    AOTX_E_TEXT_INVALID = -134,           /* not UTF-8, or text + media links > 2048 */
    AOTX_E_MODEL_INVALID = -135,
    AOTX_E_MEDIA_INVALID = -136,
    AOTX_E_SAMPLING_INVALID = -137,       /* temperature / top_p / max_output_tokens */
    AOTX_E_STATUS_INVALID = -138,
    AOTX_E_CURSOR_INVALID = -139,
    AOTX_E_TARGET_SEQUENCE_INVALID = -140,
    AOTX_E_RESERVED_TOKEN_INVALID = -141, /* text holds a reserved media control token */
    AOTX_E_RETRY_FLOOR_INVALID = -142,
    AOTX_E_COMMAND_TOO_LARGE = -143,      /* canonical bytes over the per-receipt command bytes */
    AOTX_E_RESULT_TOO_LARGE = -144,       /* result over the per-receipt result bytes */
    AOTX_E_EMBEDDING_INVALID = -145,      /* embedding dim 0 or over 512, or a non-finite value */
    AOTX_E_VERSION_CONFLICT = -146,       /* PUBLISH: source_version is not the object's current one */
    AOTX_E_PUBLICATION_UNSUPPORTED = -147, /* PUBLISH: the source object's kind cannot be published */
    AOTX_E_RETENTION_MODE_INVALID = -148, /* a mode other than 1 or 2; an interpretation for an
                                           * input whose recorded retention mode is not 2 */
    /* execution leases and output (docs/formats/device.md "Lease transfer") */
    AOTX_E_LEASE_INVALID = -160,          /* a lease row or revision breaks a rule */
    AOTX_E_LEASE_CONFLICT = -161,         /* the input is leased already (never twice) */
    AOTX_E_LEASE_MISSING = -162,          /* output for an input without a lease */
    AOTX_E_OUTPUT_CONFLICT = -163,        /* a completion that does not extend the journaled output */

    AOTX_LEASE_HEADER = 8,           /* row count u32, revision u32 */
    AOTX_LEASE_ROW_BYTES = 40,       /* revisions 2..5 */
    AOTX_LEASE_ROW_V1_BYTES = 32,    /* revisions 0 and 1 (read on recovery only) */
    AOTX_LEASE_MAX_REVISION = 5,
    AOTX_LEASE_MAX_ROWS = 256,       /* rows in one lease transfer */
    AOTX_OUTPUT_HEADER = 32,         /* output transfer header, version 1 (read on recovery) */
    AOTX_OUTPUT_HEADER_V2 = 40       /* version 2: + the input's token counts */
};

typedef struct aotx_device aotx_device;

typedef struct aotx_device_params {
    uint32_t default_pages;     /* page grant used when an input says pages = 0 (recorded later) */
    uint32_t reserved;
} aotx_device_params;

typedef struct aotx_media_ref {
    uint8_t type;               /* AOTX_MEDIA_IMAGE / _AUDIO */
    uint8_t sha256[32];
} aotx_media_ref;

/* One mutation as the gateway parsed it (defaults already applied by the
 * caller: max_output_tokens 256, temperature 0, top_p 1; has_id = 0 means the
 * id is the operation key). */
typedef struct aotx_request {
    uint8_t kind;
    uint8_t lineage[16];
    uint8_t operation_key[16];
    uint64_t sequence;
    /* SPACE_CREATE, CONVERSATION_CREATE */
    uint8_t has_id;
    uint8_t id[16];
    uint8_t scope;
    /* MEMBER_SET, CONVERSATION_CREATE */
    uint8_t space[16];
    /* MEMBER_SET */
    uint8_t participant[16];
    uint8_t rights;
    /* INPUT */
    uint8_t conversation[16];
    uint32_t text_len;
    uint8_t text[2048];
    uint32_t model_len;
    uint8_t model[128];
    uint32_t max_output_tokens;
    uint32_t pages;
    double temperature;
    double top_p;
    uint32_t n_media;
    aotx_media_ref media[8];
    /* CANCEL */
    uint64_t target_sequence;
    /* RETIRE */
    uint64_t retry_floor;
    /* PUBLISH (the destination is `space`) */
    uint8_t object[16];
    uint64_t source_version;
} aotx_request;

typedef struct aotx_receipt_view {
    uint8_t op_id[16];
    uint8_t kind;
    uint8_t status;             /* AOTX_STATUS_* */
    uint8_t foreign;            /* 1: another participant's receipt: sequence/key absent */
    uint8_t retry;              /* 1: this submit was an exact retry */
    uint8_t device_committed;
    uint8_t admission_saved;
    uint8_t terminal_saved;
    uint8_t cancel_requested;
    uint8_t participant[16];
    uint8_t operation_key[16];  /* zero when foreign */
    uint64_t sequence;          /* 0 when foreign */
    uint64_t admission_number;
    uint64_t admission_record;  /* journal record index of the admission's last part */
    uint64_t terminal_record;   /* of the terminal result (== admission_record for immediate kinds) */
    uint8_t resource_id[16];    /* created space / conversation; the input's conversation */
    uint32_t result_len;
    uint32_t input_tokens;
    uint32_t output_tokens;
    uint32_t reserved;
    /* the journal's save state when read (aotx_save_state fields) */
    uint64_t saved_records;
    uint64_t pending_bytes;
    uint64_t file_incarnation;
    uint64_t generation;
    uint64_t boot;
    uint8_t commit_digest[32];
    int32_t disk_error;
    uint32_t hold;
    /* the save that acknowledged the admission, frozen once it is saved and
     * rebuilt alike by recovery (aotx_journal_save_of); zero while
     * admission_save_known is 0 */
    uint8_t admission_save_known;
    uint8_t finish;             /* AOTX_FINISH_* (succeeded INPUTs) */
    uint8_t leased;             /* INPUT: an execution lease names it */
    uint8_t lease_revision;     /* that lease's revision (0..5) */
    uint8_t lease_mode;         /* its row's retention mode */
    uint8_t reserved2[3];
    aotx_save_id admission_save;
    uint64_t input_index;       /* INPUT: 1-based place in its conversation's input order; else 0 */
} aotx_receipt_view;

typedef struct aotx_participant_view {
    uint8_t key[16];
    uint8_t registered;
    uint8_t counters_visible;   /* 0 for a foreign participant: counters absent */
    uint8_t reserved[6];
    uint64_t next_sequence;
    uint64_t retry_floor;
} aotx_participant_view;

typedef struct aotx_space_view {
    uint8_t id[16];
    uint8_t owner[16];
    uint8_t scope;
    uint8_t rights;             /* the caller's effective rights (resolved AND grants) */
    uint8_t reserved[6];
    uint64_t admission_number;
    uint64_t conversations;
} aotx_space_view;

typedef struct aotx_member_view {
    uint8_t participant[16];
    uint8_t rights;
    uint8_t reserved[7];
} aotx_member_view;

typedef struct aotx_conversation_view {
    uint8_t id[16];
    uint8_t space[16];
    uint8_t creator[16];
    uint64_t admission_number;
    uint64_t inputs;
} aotx_conversation_view;

void aotx_device_default_params(aotx_device_params *p);
/* Allocates every table once. The journal is borrowed (must outlive dev). */
int aotx_device_new(const aotx_device_params *p, const uint8_t lineage[16], struct aotx_journal *j,
                    aotx_device **out);
void aotx_device_free(aotx_device *d);
void aotx_device_lineage(const aotx_device *d, uint8_t out[16]);

/* Canonical operation bytes of a request (docs/formats/device.md).
 * Returns 0 and *out_len = the byte count; AOTX_E_BUFFER_TOO_SMALL with
 * *out_len = the size needed (nothing written) when cap is too small (buf may
 * be NULL then); or a negative AOTX_E_*_INVALID code (*out_len untouched)
 * when the request is malformed. */
int aotx_canonical_encode(const aotx_request *req, uint8_t *buf, size_t cap, uint32_t *out_len);
/* Parse canonical bytes back into a request (0 or AOTX_E_*_INVALID / -2). */
int aotx_canonical_decode(const uint8_t *buf, size_t len, aotx_request *out);

/* Submit one sequenced mutation for `actor`. On 0, *out is the receipt
 * (out->retry = 1 for an exact retry, which changes nothing). */
int aotx_device_submit(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       const aotx_request *req, aotx_receipt_view *out);
/* Executor: admitted -> running (needs a saved admission; not journaled). */
int aotx_device_start(aotx_device *d, const uint8_t op_id[16]);
/* Executor: the terminal result of an INPUT (enqueues a COMPLETION transfer).
 * `result` is the whole result; it must begin with the bytes OUTPUT transfers
 * journaled already (output_conflict), and the completion carries the rest. */
int aotx_device_complete(aotx_device *d, const uint8_t op_id[16], uint8_t status,
                         uint8_t finish, const uint8_t *result, uint32_t len,
                         uint32_t input_tokens, uint32_t output_tokens);

/* One execution lease row (40 bytes on disk, docs/formats/device.md "Lease
 * transfer"; static_asserts in csrc/device/device_lease.c). */
typedef struct aotx_lease_row {
    uint32_t request_index;     /* the row's place in its lease (0, 1, ...) */
    uint32_t slot;              /* the receipt's slot */
    uint64_t sequence;          /* the receipt's sequence */
    uint8_t actor[16];          /* the receipt's participant key */
    uint32_t mode;              /* the input's retention mode (0: nothing retained) */
    uint32_t reserved;          /* 0 */
} aotx_lease_row;
/* The executor's own read: the row a lease needs for a live INPUT (its slot,
 * sequence, actor and recorded retention mode) at `request_index`. */
int aotx_device_lease_row(aotx_device *d, const uint8_t op_id[16], uint32_t request_index,
                          aotx_lease_row *out);
/* Apply one execution lease (revision 2..5, 1..AOTX_LEASE_MAX_ROWS rows): every
 * row is checked before anything changes; then one LEASE transfer is
 * enqueued and each receipt becomes running, leased at `revision`. */
int aotx_device_lease(aotx_device *d, uint32_t revision, const aotx_lease_row *rows,
                      uint32_t n);
/* Output bytes of a leased, running INPUT: one OUTPUT transfer, appended to
 * the receipt's result (within AOTX_MAX_RESULT_BYTES), with its token counts so far
 * (input tokens, output tokens generated): the receipt reports them until it is
 * terminal, and an input interrupted by a crash keeps the last ones journaled. */
int aotx_device_output(aotx_device *d, const uint8_t op_id[16], const uint8_t *data,
                       uint32_t len, uint32_t input_tokens, uint32_t output_tokens);

/* Reads (check current grants AND stored rights). */
int aotx_device_receipt(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                        const uint8_t op_id[16], aotx_receipt_view *out);
/* Result bytes from `offset`: copies min(cap, length - offset) bytes and
 * returns that count (0 at or past the end); *out_total = the result length. */
int64_t aotx_device_result_read(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                                const uint8_t op_id[16], uint64_t offset, uint8_t *buf,
                                size_t cap, uint32_t *out_total);
int aotx_device_participant(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                            const uint8_t key[16], aotx_participant_view *out);
int aotx_device_space(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                      const uint8_t space[16], aotx_space_view *out);
/* Spaces visible to the caller from table position `cursor`; *out_n rows,
 * *out_next = cursor for the next page (0 when done). */
int aotx_device_spaces(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       uint64_t cursor, uint32_t limit, aotx_space_view *out,
                       uint32_t *out_n, uint64_t *out_next);
int aotx_device_members(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                        const uint8_t space[16], uint64_t cursor, uint32_t limit,
                        aotx_member_view *out, uint32_t *out_n, uint64_t *out_next);
int aotx_device_conversations(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                              const uint8_t space[16], uint64_t cursor, uint32_t limit,
                              aotx_conversation_view *out, uint32_t *out_n,
                              uint64_t *out_next);
int aotx_device_conversation(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                             const uint8_t conversation[16], aotx_conversation_view *out);

/* A conversation's events: its live INPUT receipts in input order with
 * input_index > cursor, at most `limit`; *out_next = the last row's index
 * (0 when no later input is live); *out_floor = the event floor: every input
 * at or below it is retired (the lowest live index - 1, or the input count
 * when none is live).  A NULL actor is the runtime's own read (no grant or
 * right check: its executor builds contexts from it); others need read on the
 * conversation's space and see other participants' receipts as foreign. */
int aotx_device_conversation_inputs(aotx_device *d, uint32_t grants, const uint8_t *actor,
                                    const uint8_t conversation[16], uint64_t cursor,
                                    uint32_t limit, aotx_receipt_view *out, uint32_t *out_n,
                                    uint64_t *out_next, uint64_t *out_floor);
/* The runtime's own read of a live receipt's canonical operation bytes (no
 * right check): copies min(cap, length) bytes, *out_len = the length. */
int aotx_device_canonical(aotx_device *d, const uint8_t op_id[16], uint8_t *buf, size_t cap,
                          uint32_t *out_len);

/* One memory row as the device stores and journals it (128 bytes on disk,
 * docs/formats/device.md "Memory rows"); ids are raw 16-byte values. */
typedef struct aotx_memory_row {
    uint8_t object[16];
    uint64_t version;
    uint8_t kind;               /* AOTX_MEMORY_TEXT / _EMBEDDING */
    uint8_t scope;              /* the owning space's scope */
    uint8_t mode;               /* retention mode (1) */
    uint8_t origin;             /* AOTX_MEMORY_RETAINED / _PUBLISHED */
    uint32_t byte_length;       /* payload bytes */
    uint8_t owner[16];          /* the memory owner: the owning space's id */
    uint8_t room[16];           /* the room space id (room scope), else zero */
    uint8_t source[16];         /* TEXT: the input's operation id; EMBEDDING: the text object */
    uint8_t actor[16];          /* principal key of the input's participant */
    uint8_t conversation[16];   /* the input's conversation */
    uint64_t admission_number;  /* of the source input */
    uint32_t dim;               /* EMBEDDING: float32 count; TEXT: 0 */
    uint32_t reserved1;
} aotx_memory_row;

/* Executor, before generation: retain the input's source text and its
 * embedding (mode 1) as two memory rows of its conversation's space, in one
 * MEMORY transfer enqueued in the journal (cancellation cannot undo it).  The
 * input must be a live, non-terminal INPUT with saved admission whose memory
 * is not retained yet (memory_retained); text-less inputs retain nothing
 * (returns 0 with *out_rows = 0).  out[2] receives the rows. */
int aotx_device_memory_retain(aotx_device *d, const uint8_t op_id[16], const float *embedding,
                              uint32_t dim, aotx_memory_row *out, uint32_t *out_rows);
/* The same with the retention mode the runtime chose (1, or 2 when the input's
 * model has the automatic-memory capability): recorded in both rows (byte 26)
 * and on the receipt; recovery replays the recorded mode. */
int aotx_device_memory_retain_mode(aotx_device *d, const uint8_t op_id[16], uint8_t mode,
                                   const float *embedding, uint32_t dim, aotx_memory_row *out,
                                   uint32_t *out_rows);
/* Mode 2, once per input: retain the model's interpretation of the input
 * (`text`, 1..2048 UTF-8 bytes) and its embedding as an INTERPRETATION row and
 * an EMBEDDING row in one MEMORY transfer.  The input must be a live,
 * non-terminal INPUT whose retention was recorded with mode 2
 * (retention_mode_invalid otherwise) and not interpreted yet (memory_retained);
 * memory_full when the two rows do not fit next to the rows promised. */
int aotx_device_memory_interpret(aotx_device *d, const uint8_t op_id[16], const uint8_t *text,
                                 uint32_t text_len, const float *embedding, uint32_t dim,
                                 aotx_memory_row *out, uint32_t *out_rows);
/* Saved memory rows of `space` the caller may read (read right on the space),
 * from table position `cursor`; *out_next = the next cursor (0 at the end). */
int aotx_device_memory_list(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                            const uint8_t space[16], uint64_t cursor, uint32_t limit,
                            aotx_memory_row *out, uint32_t *out_n, uint64_t *out_next);
/* One saved memory object of `space`: its row and min(cap, length - offset)
 * payload bytes from `offset` (the count is returned; 0 at or past the end). */
int64_t aotx_device_memory_read(aotx_device *d, uint32_t grants, const uint8_t actor[16],
                                const uint8_t space[16], const uint8_t object[16],
                                uint64_t offset, uint8_t *buf, size_t cap,
                                aotx_memory_row *row);
/* Recall (the runtime's own read): the saved TEXT and INTERPRETATION rows of `space` that
 * participant `actor` may read (resolved read right), ranked by cosine
 * similarity of their embeddings to `query` (dim floats), best first, at most
 * `limit`; rows retained by `exclude` (an operation id, may be NULL) are
 * skipped.  out_score[i] is row i's similarity. */
int aotx_device_memory_recall(aotx_device *d, const uint8_t actor[16], const uint8_t space[16],
                              const float *query, uint32_t dim, const uint8_t *exclude,
                              uint32_t limit, aotx_memory_row *out, float *out_score,
                              uint32_t *out_n);

/* Table usage (tests, capabilities). */
typedef struct aotx_device_usage {
    uint32_t participants;
    uint32_t spaces;
    uint32_t conversations;
    uint32_t members;
    uint32_t receipts;          /* occupied slots, retiring ones included */
    uint32_t memory;            /* memory rows */
    uint64_t admissions;        /* admission counter */
} aotx_device_usage;
void aotx_device_usage_get(aotx_device *d, aotx_device_usage *out);

/* Recovery on a fresh device: apply every transfer of `r` in order, then
 * aotx_journal_resume(), then enqueue an `interrupted` completion for each
 * restored INPUT without a terminal result.  On failure *out_bad_record is
 * the first record index of the offending transfer (or the reader's error
 * offset for journal damage) and the device must be discarded
 * (its tables read empty and every mutation is refused with device_out_of_order). */
int aotx_device_recover(aotx_device *d, struct aotx_journal_reader *r, uint64_t *out_bad_record);
/* Checkpoints (csrc/device/device_checkpoint.c; bytes: docs/formats/checkpoint.md):
 * the state tables as of journal position `a`, one checksummed section.
 * Encode needs a device whose every receipt has its admission save stamped
 * and that holds nothing past a->records (AOTX_E_DEVICE_STATE otherwise);
 * with buf NULL (or cap too small) it only reports the size in *out_len
 * (AOTX_E_BUFFER_TOO_SMALL when buf was given).  Load needs a fresh device;
 * it checks the whole section (SHA-256 trailer, every table, every index)
 * and fills *out_anchor: the caller seeks the reader there
 * (aotx_journal_reader_seek) and calls aotx_device_recover, which replays
 * only the suffix.  A refused load (AOTX_E_RECOVERY_DAMAGE with
 * *out_bad_offset = the byte offset inside the section,
 * AOTX_E_LINEAGE_MISMATCH, AOTX_E_DEVICE_STATE) leaves the device failed. */
int aotx_device_checkpoint_encode(aotx_device *d, const struct aotx_journal_anchor *a,
                                  uint8_t *buf, size_t cap, size_t *out_len);
int aotx_device_checkpoint_load(aotx_device *d, const uint8_t *buf, size_t len,
                                struct aotx_journal_anchor *out_anchor, uint64_t *out_bad_offset);
/* Offline checkpoints (aotx pack --checkpoint): the next aotx_device_recover
 * leaves restored unfinished inputs as they are (no `interrupted`
 * completions are enqueued): the state is the journal's, nothing more. */
void aotx_device_recover_offline(aotx_device *d);
/* CDEF-END */

#endif
