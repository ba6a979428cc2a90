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
 *                        aotx_journal_tick() does drain, write, fsync and ack
 *                        in one call (the emitter's thread, plain files).
 *   recovery             aotx_journal_reader_*() over the whole file, then
 *                        aotx_journal_resume() so new records continue it.
 *
 * Records are fixed-size: record i lives at file offset
 * AOTX_JOURNAL_FILE_HEADER + i * AOTX_JOURNAL_RECORD_SIZE.
 *
 * Boot: the first transfer of every journal instance (new or resumed) is its
 * boot transfer.  aotx_journal_begin_boot() queues it explicitly; if the
 * first enqueue comes before it, the journal queues the boot transfer in
 * front of that transfer by itself (same hold/cap rules, all or nothing),
 * and a later begin_boot() just reports the boot record already queued.
 *
 * Thread safety: an aotx_journal has its own mutex; enqueue (device thread)
 * and drain/ack/nack (emitter) may run on different threads.  A reader is
 * single-threaded.
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
    AOTX_JOURNAL_FORMAT_VERSION = 2,     /* 2: records carry their save generation */
    AOTX_JOURNAL_MAX_PARTS = 65535,      /* part count is a u16 */
    AOTX_JOURNAL_MAX_TRANSFER = 10485600,/* 65535 * 160 */
    AOTX_JOURNAL_BOOT_PAYLOAD = 32,      /* bytes of a boot transfer */

    /* transfer kinds (the part header's kind byte) */
    AOTX_XFER_BOOT = 1,          /* journal-owned: boot number, written first at every boot */
    AOTX_XFER_ADMISSION = 2,     /* device: one admitted mutation (canonical bytes + device fields) */
    AOTX_XFER_LEASE = 3,         /* device: execution lease (later: execution issue) */
    AOTX_XFER_OUTPUT = 4,        /* device: output bytes of an execution */
    AOTX_XFER_COMPLETION = 5,    /* device: terminal result of an operation */
    AOTX_XFER_RETIREMENT = 6,    /* device: retry-floor advance and freed receipts */
    AOTX_XFER_MEMORY = 7,        /* device: memory rows retained by an input (docs/formats/device.md) */
    AOTX_XFER_MAX_KIND = 7,

    /* part header flag bits */
    AOTX_JOURNAL_FLAG_FIRST = 1, /* part index 0 */
    AOTX_JOURNAL_FLAG_LAST = 2,  /* part index == part count - 1 */

    /* hold reason bits (aotx_save_state.hold, aotx_journal_set_hold) */
    AOTX_JOURNAL_HOLD_FILE_CAP = 1,  /* bit 0: the file cap would be passed; sticky until
                                        aotx_journal_set_file_cap() or set_hold(.., 0) */
    AOTX_JOURNAL_HOLD_DISK = 2,      /* bit 1: a write/fsync failed (nack): cleared by the
                                        next successful ack; or disk pressure (set_hold):
                                        cleared only by set_hold(.., 0) */
    AOTX_JOURNAL_HOLD_PENDING = 4,   /* bit 2: an enqueue was refused for max_pending_bytes;
                                        informational, cleared by an ack or an accepted
                                        enqueue (does not by itself refuse) */

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
    uint64_t max_pending_bytes;  /* bound on encoded-but-unsaved bytes (hold past it);
                                    192 .. 256 MiB, allocated once by aotx_journal_new */
    uint64_t file_incarnation;   /* random id of the journal file, from its header */
    uint8_t lineage[16];         /* runtime lineage, from the runtime file */
} aotx_journal_params;

/* The identity of one save (ack): what a receipt keeps of the save that
 * acknowledged its admission (frozen from then on, and rebuilt identically by
 * recovery: docs/formats/journal.md, "Save identity"). */
typedef struct aotx_save_id {
    uint64_t file_incarnation;
    uint64_t generation;         /* the ack's generation (the records' stamp) */
    uint64_t boot;               /* boot number of the process that made the save */
    uint64_t commit_records;     /* records covered by commit_digest: the end of the last
                                    complete transfer that save wrote */
    uint8_t commit_digest[32];   /* chained digest after record commit_records - 1 */
} aotx_save_id;

typedef struct aotx_save_state {
    uint64_t next_record;        /* index the next enqueued record gets */
    uint64_t saved_records;      /* records [0, saved_records) are fsynced */
    uint64_t in_flight_records;  /* drained, not yet acked */
    uint64_t pending_bytes;      /* encoded bytes not yet saved (incl. in flight) */
    uint64_t file_incarnation;
    uint64_t generation;         /* save generation: +1 at every successful ack; continued
                                    across boots (docs/formats/journal.md, "Generation") */
    uint64_t boot;               /* boot number (count of boot transfers) */
    uint8_t commit_digest[32];   /* chained SHA-256 over every saved record */
    int32_t disk_error;          /* errno of the last failed write/fsync, 0 if none since */
    uint32_t hold;               /* bit 0: file cap, bit 1: disk pressure/error, bit 2: pending cap */
} aotx_save_state;

void aotx_journal_default_params(aotx_journal_params *p);
int aotx_journal_new(const aotx_journal_params *p, aotx_journal **out);
void aotx_journal_free(aotx_journal *j);

/* The 64-byte file header for a new journal file (after resume: the resumed
 * file's own header). Returns bytes written (64) or -needed. */
int64_t aotx_journal_header_encode(const aotx_journal *j, uint8_t *buf, size_t cap);

/* Queue one whole transfer (split into parts). On refusal nothing is queued.
 * kind is 2..6 (the boot kind is journal-owned). Refusal AOTX_R_JOURNAL_HOLD
 * while hold bit 0 or 1 is set, when the file cap would be passed (sets bit
 * 0) or when max_pending_bytes would be passed (sets bit 2).
 * *out_last_record = index of its last part (saved when saved_records > it). */
int aotx_journal_enqueue(aotx_journal *j, uint8_t kind, const uint8_t *data, uint32_t len,
                         uint64_t *out_last_record);
/* Queue the boot transfer for this boot (boot number = previous + 1); if it
 * is already queued, report its record and return 0. */
int aotx_journal_begin_boot(aotx_journal *j, uint64_t *out_last_record);

/* Emitter: copy up to max_records queued records not yet in flight into buf,
 * marking them in flight. Returns bytes copied (0 when none) or -needed
 * (192 * the records it would copy). Holds do not stop a drain.
 * *out_first_record = index of the first (its file offset follows from it). */
int64_t aotx_journal_drain(aotx_journal *j, uint8_t *buf, size_t cap, uint32_t max_records,
                           uint64_t *out_first_record);
/* The in-flight records are written and fsynced: saved_records advances,
 * generation++, disk_error and hold bits 1 and 2 clear. */
int aotx_journal_ack(aotx_journal *j);
/* Writing or fsyncing the in-flight records failed with errno `err` (> 0):
 * they go back to the queue (to be rewritten), disk_error is set, hold bit 1
 * is set. Also valid with nothing in flight (a failed truncate or directory
 * fsync). */
int aotx_journal_nack(aotx_journal *j, int err);
/* One whole tick on a plain file descriptor, for an emitter thread that should not
 * come back between its steps: drain up to max_records (<= 16) into buf (cap bytes),
 * pwrite them at their offset (a short write continues, EINTR retries), fsync, ack.
 * Returns AOTX_OK or an aotx error (a failed drain); *out_records = records saved
 * (0: nothing was pending), *out_first_record = the first one's index,
 * *out_fsync_ns = the fsync's duration.  A failed pwrite or fsync sets *out_errno
 * (> 0; else 0) and leaves the records in flight: the caller nacks them, exactly
 * as after its own failed write. */
int aotx_journal_tick(aotx_journal *j, int fd, uint8_t *buf, size_t cap, uint32_t max_records,
                      uint64_t *out_first_record, uint32_t *out_records, int *out_errno,
                      uint64_t *out_fsync_ns);
/* The emitter's whole loop in one native call (the GIL, or whatever the caller
 * holds, is given up for as long as it runs): tick after tick while records are
 * pending, each one as aotx_journal_tick does (drain <= max_records, pwrite, fsync,
 * ack), back-to-back ticks starting at least spacing_ns apart.  After each ack the
 * tick's times go to the journal's tick log (aotx_journal_take_ticks) and, when
 * notify_fd >= 0, 8 bytes (a uint64 1, as an eventfd takes them) are written to it.
 * With min_free_bytes > 0 the free space of fd's file system (fstatvfs, f_bavail *
 * f_frsize) is checked before every tick: less the bytes written since the last
 * fstatvfs, it must leave min_free_bytes after max_records more records; fstatvfs
 * runs again at least every stat_every_ns, and always before that check fails.
 * Returns AOTX_OK (or an aotx error of a drain) with out->reason:
 *   INTERRUPTED  aotx_journal_interrupt() was called (since the last return);
 *   IDLE         nothing pending for idle_ns after this call's last ack, or for
 *                wait_ns in a call without any ack (wait_ns 0: only an interrupt
 *                or records end the wait);
 *   FAILED       a pwrite or fsync failed with out->err: out->records records from
 *                out->first_record stay in flight, for the caller to nack;
 *   FLOOR        the free space (estimate in out->free_bytes) is under the floor;
 *                nothing was drained.
 * out->ticks = ticks acked in this call, out->last_ack_ns = CLOCK_MONOTONIC of the
 * last one. */
typedef struct aotx_journal_run_params {
    int fd;
    int notify_fd;               /* -1: none */
    uint32_t max_records;        /* 1..16 */
    uint64_t spacing_ns;
    uint64_t idle_ns;
    uint64_t wait_ns;
    uint64_t min_free_bytes;     /* 0: no floor */
    uint64_t stat_every_ns;
} aotx_journal_run_params;

typedef struct aotx_journal_run_result {
    uint32_t reason;
    uint32_t ticks;
    uint64_t last_ack_ns;
    uint64_t first_record;
    uint32_t records;
    int32_t err;
    uint64_t free_bytes;
} aotx_journal_run_result;

enum {
    AOTX_JOURNAL_RUN_INTERRUPTED = 1,
    AOTX_JOURNAL_RUN_IDLE = 2,
    AOTX_JOURNAL_RUN_FAILED = 3,
    AOTX_JOURNAL_RUN_FLOOR = 4,
    AOTX_JOURNAL_TICK_LOG = 1024   /* ticks the log keeps until taken (older ones dropped) */
};

int aotx_journal_run(aotx_journal *j, const aotx_journal_run_params *p,
                     aotx_journal_run_result *out);
/* End the wait of a running aotx_journal_run (or the next call's, if none runs):
 * it returns AOTX_JOURNAL_RUN_INTERRUPTED before its next tick. */
void aotx_journal_interrupt(aotx_journal *j);
/* The times of the ticks aotx_journal_run acked since the last call (oldest first,
 * at most cap; the rest stay for the next call): returns how many, and
 * *out_saved_records = the journal's saved records now. */
uint32_t aotx_journal_take_ticks(aotx_journal *j, uint64_t *tick_ns, uint64_t *fsync_ns,
                                 uint32_t cap, uint64_t *out_saved_records);
/* Set or clear hold reason bits (a mask of AOTX_JOURNAL_HOLD_*).  HOLD_DISK set here (the
 * disk floor) survives acks until cleared here; clearing it here keeps the hold of a
 * failed write (nack) that no ack has ended yet. */
void aotx_journal_set_hold(aotx_journal *j, uint32_t reason_bit, int on);
/* Change the file cap (0 = none); clears hold bit 0. */
void aotx_journal_set_file_cap(aotx_journal *j, uint64_t file_cap_bytes);
void aotx_journal_save_state(const aotx_journal *j, aotx_save_state *out);
/* The save that wrote `record` (a transfer's last part), from the pending
 * ring: 0 and *out; AOTX_R_JOURNAL_NOTHING while it is not saved;
 * AOTX_E_JOURNAL_STATE when the ring no longer holds it (before this
 * instance's resume point, or released and overwritten). */
int aotx_journal_save_of(const aotx_journal *j, uint64_t record, aotx_save_id *out);
/* Keep saved records from `from_record` on in the ring (their save identity
 * stays readable) until the next call; they count against max_pending_bytes.
 * The device calls it once it has copied every identity it needs.  Never
 * called: saved records are released at once. */
void aotx_journal_retain(aotx_journal *j, uint64_t from_record);

/* Recovery over the whole file (header included); buf must outlive the reader.
 * reader_new fails only for bad arguments or memory: a bad file header is
 * reported by the first reader_next (and reader_header_status). */
int aotx_journal_reader_new(const uint8_t *buf, size_t len, aotx_journal_reader **out);
void aotx_journal_reader_free(aotx_journal_reader *r);
/* 0 when the header is good, else AOTX_E_JOURNAL_FOREIGN / _DAMAGE (offset
 * in reader_error_offset). */
int aotx_journal_reader_header_status(const aotx_journal_reader *r);
/* Refuse (AOTX_E_JOURNAL_FOREIGN, offset 16) a file of another lineage.
 * Call before the first reader_next; returns the header status. */
int aotx_journal_reader_expect_lineage(aotx_journal_reader *r, const uint8_t lineage[16]);
/* The next complete transfer: 1 and its kind/data/len/first record index (data
 * points into reader-owned memory valid until the next call); 0 at the end
 * (a torn tail ends it too); AOTX_E_JOURNAL_DAMAGE / _FOREIGN with
 * aotx_journal_reader_error_offset() naming the byte offset. */
int aotx_journal_reader_next(aotx_journal_reader *r, uint8_t *kind, const uint8_t **data,
                             uint32_t *len, uint64_t *first_record);
uint64_t aotx_journal_reader_valid_end(const aotx_journal_reader *r);    /* truncate here */
uint64_t aotx_journal_reader_error_offset(const aotx_journal_reader *r);
/* The file's incarnation and lineage (zero unless the header is good). */
uint64_t aotx_journal_reader_incarnation(const aotx_journal_reader *r);
void aotx_journal_reader_lineage(const aotx_journal_reader *r, uint8_t out[16]);
/* Boot transfers read so far. */
uint64_t aotx_journal_reader_boot(const aotx_journal_reader *r);
/* After reader_next returned a transfer: the save generation stamped on its
 * last part, and the chained digest after it. */
uint64_t aotx_journal_reader_generation(const aotx_journal_reader *r);
void aotx_journal_reader_digest(const aotx_journal_reader *r, uint8_t out[32]);
/* Continue the file: header, incarnation, lineage, next record index,
 * digest, generation and boot count from a reader that returned 0 (end), on
 * a journal nothing was enqueued in yet (else AOTX_E_JOURNAL_STATE). */
int aotx_journal_resume(aotx_journal *j, const aotx_journal_reader *r);

/* A journal position a checkpoint is tied to (docs/formats/checkpoint.md):
 * the first `records` records (whole transfers), the chained digest before
 * and after the last of them, the boot transfers among them and the save
 * generation stamped on the last one. */
typedef struct aotx_journal_anchor {
    uint64_t file_incarnation;
    uint64_t records;            /* >= 1: a boot transfer always comes first */
    uint64_t boot;
    uint64_t generation;
    uint8_t prev_digest[32];     /* chained digest after record records - 2 (the header's for 1) */
    uint8_t digest[32];          /* after record records - 1 */
} aotx_journal_anchor;

/* The live journal's saved position: AOTX_E_JOURNAL_STATE while any
 * enqueued record is not saved yet (or none is saved). */
int aotx_journal_saved_anchor(const aotx_journal *j, aotx_journal_anchor *out);
/* The reader's position after the transfers read so far (records 0 before any). */
int aotx_journal_reader_anchor(const aotx_journal_reader *r, aotx_journal_anchor *out);
/* Before the first reader_next: continue reading after `a->records` records
 * without replaying them (a checkpoint holds their state).  Checks that the
 * file has them, that the incarnation matches (AOTX_E_JOURNAL_FOREIGN,
 * offset 32), with check_prefix that every one of them has its CRC-32C and
 * index (AOTX_E_JOURNAL_DAMAGE at the first that does not), and that record
 * records-1 ends a transfer, carries a->generation and chains a->prev_digest
 * to a->digest (AOTX_E_JOURNAL_DAMAGE at that record); AOTX_E_JOURNAL_STATE
 * when the file is shorter or the reader already read. */
int aotx_journal_reader_seek(aotx_journal_reader *r, const aotx_journal_anchor *a,
                             int check_prefix);

/* Checksums (journal_crc32c.c, journal_sha256.c). */
/* CRC-32C (Castagnoli), reflected; pass 0 to start, the previous result to continue. */
uint32_t aotx_crc32c(uint32_t crc, const uint8_t *data, size_t len);
/* SHA-256 (FIPS 180-4) of data. */
void aotx_sha256(const uint8_t *data, size_t len, uint8_t out[32]);
/* CDEF-END */

#endif
