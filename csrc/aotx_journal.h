/* aotx_journal.h -- the shared-state journal: record codec, pending queue,
 * save acknowledgement, and the recovery reader.  Byte layout:
 * docs/formats/journal.md.
 *
 * Roles:
 *   device.c (producer)  aotx_journal_enqueue() one whole transfer at a time;
 *                        reads aotx_journal_save_state() for receipts.
 *   emitter (Python)     aotx_journal_drain() <= 16 records per tick, writes
 *                        them at their offsets, fsyncs, then
 *                        aotx_journal_ack(); on a failed write or fsync,
 *                        aotx_journal_nack(errno): the same records are
 *                        drained again and REWRITTEN before the next fsync
 *                        (an fsync is never retried into "success").
 *   recovery             aotx_journal_reader_*() over the whole file, then
 *                        aotx_journal_resume() so new records continue it.
 *
 * Records are fixed-size: record i lives at file offset
 * AOTX_JOURNAL_FILE_HEADER + i * AOTX_JOURNAL_RECORD_SIZE.
 */
#ifndef AOTX_JOURNAL_H
#define AOTX_JOURNAL_H

#include "aotx.h"

/* CDEF-BEGIN */
enum {
    AOTX_JOURNAL_RECORD_TYPE = 37,
    AOTX_JOURNAL_RECORD_CLASS = 65,      /* 'A' */
    AOTX_JOURNAL_PART_HEADER = 32,
    AOTX_JOURNAL_PART_DATA = 160,
    AOTX_JOURNAL_RECORD_SIZE = 192,      /* header + data, data zero-padded */
    AOTX_JOURNAL_FILE_HEADER = 64,
    AOTX_JOURNAL_TICK_RECORDS = 16,      /* the emitter writes at most this many per tick */

    /* transfer kinds (the part header's kind byte) */
    AOTX_XFER_BOOT = 1,          /* journal-owned: boot number, written first at every boot */
    AOTX_XFER_ADMISSION = 2,     /* device: one admitted mutation (canonical bytes + device fields) */
    AOTX_XFER_LEASE = 3,         /* device: execution lease (later: execution issue) */
    AOTX_XFER_OUTPUT = 4,        /* device: output bytes of an execution */
    AOTX_XFER_COMPLETION = 5,    /* device: terminal result of an operation */
    AOTX_XFER_RETIREMENT = 6,    /* device: retry-floor advance and freed receipts */

    /* codes: 2xx */
    AOTX_R_JOURNAL_HOLD = 201,          /* journal on hold (file cap, disk pressure, disk error) */
    AOTX_R_JOURNAL_NOTHING = 202,       /* drain: nothing to write */
    AOTX_E_JOURNAL_DAMAGE = -201,       /* damage before the tail: refuse to start */
    AOTX_E_JOURNAL_FOREIGN = -202,      /* bad magic / other lineage / unknown version */
    AOTX_E_JOURNAL_TOO_LARGE = -203,    /* transfer larger than the format allows */
    AOTX_E_JOURNAL_STATE = -204         /* call out of order (ack with nothing in flight, ...) */
};

typedef struct aotx_journal aotx_journal;
typedef struct aotx_journal_reader aotx_journal_reader;

typedef struct aotx_journal_params {
    uint64_t file_cap_bytes;     /* 0 = none; an enqueue that would pass it holds */
    uint64_t max_pending_bytes;  /* bound on encoded-but-unsaved bytes (hold past it) */
    uint64_t file_incarnation;   /* random id of the journal file, from its header */
    uint8_t lineage[16];         /* runtime lineage, from the runtime file */
} aotx_journal_params;

typedef struct aotx_save_state {
    uint64_t next_record;        /* index the next enqueued record gets */
    uint64_t saved_records;      /* records [0, saved_records) are fsynced */
    uint64_t in_flight_records;  /* drained, not yet acked */
    uint64_t pending_bytes;      /* encoded bytes not yet saved (incl. in flight) */
    uint64_t file_incarnation;
    uint64_t generation;         /* number of successful acks since the file was made */
    uint64_t boot;               /* boot number (count of boot transfers) */
    uint8_t commit_digest[32];   /* chained SHA-256 over every saved record */
    int32_t disk_error;          /* errno of the last failed write/fsync, 0 if none since */
    uint32_t hold;               /* bit 0: file cap, bit 1: disk pressure/error, bit 2: pending cap */
} aotx_save_state;

void aotx_journal_default_params(aotx_journal_params *p);
int aotx_journal_new(const aotx_journal_params *p, aotx_journal **out);
void aotx_journal_free(aotx_journal *j);

/* The 64-byte file header for a new journal file. Returns bytes written or -needed. */
int64_t aotx_journal_header_encode(const aotx_journal *j, uint8_t *buf, size_t cap);

/* Queue one whole transfer (split into parts). On refusal nothing is queued.
 * *out_last_record = index of its last part (saved when saved_records > it). */
int aotx_journal_enqueue(aotx_journal *j, uint8_t kind, const uint8_t *data, uint32_t len,
                         uint64_t *out_last_record);
/* Queue the boot transfer for this boot (boot number = previous + 1). */
int aotx_journal_begin_boot(aotx_journal *j, uint64_t *out_last_record);

/* Emitter: copy up to max_records queued records into buf (cap >= 192*max_records),
 * marking them in flight. Returns bytes copied (0 when none) or -needed.
 * *out_first_record = index of the first (its file offset follows from it). */
int64_t aotx_journal_drain(aotx_journal *j, uint8_t *buf, size_t cap, uint32_t max_records,
                           uint64_t *out_first_record);
/* The in-flight records are written and fsynced. */
int aotx_journal_ack(aotx_journal *j);
/* Writing or fsyncing the in-flight records failed with errno `err`: they go
 * back to the queue (to be rewritten), disk_error is set, the journal holds. */
int aotx_journal_nack(aotx_journal *j, int err);
/* Set or clear a hold reason bit (the emitter reports ENOSPC / file cap). */
void aotx_journal_set_hold(aotx_journal *j, uint32_t reason_bit, int on);
void aotx_journal_save_state(const aotx_journal *j, aotx_save_state *out);

/* Recovery over the whole file (header included); buf must outlive the reader. */
int aotx_journal_reader_new(const uint8_t *buf, size_t len, aotx_journal_reader **out);
void aotx_journal_reader_free(aotx_journal_reader *r);
/* The next complete transfer: 1 and its kind/data/len/first record index (data
 * points into reader-owned memory valid until the next call); 0 at the end
 * (a torn tail ends it too); AOTX_E_JOURNAL_DAMAGE / _FOREIGN with
 * aotx_journal_reader_error_offset() naming the byte offset. */
int aotx_journal_reader_next(aotx_journal_reader *r, uint8_t *kind, const uint8_t **data,
                             uint32_t *len, uint64_t *first_record);
uint64_t aotx_journal_reader_valid_end(const aotx_journal_reader *r);    /* truncate here */
uint64_t aotx_journal_reader_error_offset(const aotx_journal_reader *r);
/* The file's incarnation and lineage (valid once reader_new succeeded). */
uint64_t aotx_journal_reader_incarnation(const aotx_journal_reader *r);
void aotx_journal_reader_lineage(const aotx_journal_reader *r, uint8_t out[16]);
/* Continue the file: next record index, digest, generation and boot count
 * from a reader that returned 0 (end). */
int aotx_journal_resume(aotx_journal *j, const aotx_journal_reader *r);
/* CDEF-END */

#endif
