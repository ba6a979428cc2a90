/* journal.c -- the journal record codec, the bounded pending queue and save
 * acknowledgement (aotx_journal.h; bytes: docs/formats/journal.md). */
#include "journal_internal.h"

#include <errno.h>
#include <pthread.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PENDING_LIMIT (256ull << 20)
#define DEFAULT_PENDING (4ull << 20)

const aotx_code_entry aotx_journal_codes[] = {
    {AOTX_R_JOURNAL_HOLD, "journal_hold",
     "the journal is on hold (file cap, disk pressure, disk error or pending bytes)"},
    {AOTX_R_JOURNAL_NOTHING, "journal_nothing", "the journal has nothing to write"},
    {AOTX_E_JOURNAL_DAMAGE, "journal_damage",
     "the journal is damaged before its tail; refusing to start"},
    {AOTX_E_JOURNAL_FOREIGN, "journal_foreign",
     "the journal file is foreign (magic, version or lineage)"},
    {AOTX_E_JOURNAL_TOO_LARGE, "journal_too_large",
     "the transfer is larger than the journal format or pending bound allows"},
    {AOTX_E_JOURNAL_STATE, "journal_state", "journal call out of order"},
    {0, NULL, NULL},
};

struct aotx_journal {
    pthread_mutex_t mu;
    aotx_journal_params p;
    uint8_t header[AOTX_JOURNAL_FILE_HEADER]; /* the file's header bytes */
    uint8_t *ring;          /* [cap_records][192] encoded records, slot = index % cap */
    uint8_t *ring_digest;   /* [cap_records][32] chained digest after each drained record */
    uint64_t cap_records;   /* max_pending_bytes / 192 */
    uint64_t ring_first;    /* first record index this instance holds (its resume point) */
    uint64_t retain_from;   /* saved records >= this stay in the ring (UINT64_MAX: none) */
    uint64_t next_record;   /* index of the next record to encode */
    uint64_t saved_records; /* [0, saved_records) acked */
    uint64_t in_flight;     /* [saved, saved + in_flight) drained, not acked */
    uint8_t drain_digest[32]; /* digest after record saved_records + in_flight - 1 */
    uint8_t saved_digest[32]; /* digest after record saved_records - 1 */
    uint8_t saved_prev_digest[32]; /* digest after record saved_records - 2 (anchors) */
    uint64_t generation;
    uint64_t boot;          /* boots queued (the last one's number) */
    int boot_queued;        /* this instance queued its boot transfer */
    uint64_t boot_last_record;
    int32_t disk_error;
    uint32_t hold;
    int disk_held;          /* set_hold put HOLD_DISK on (the floor): an ack keeps it */
    /* aotx_journal_run: woken by enqueues while it waits for records, or an interrupt */
    pthread_cond_t run_cv;
    int run_waiting;
    int run_interrupt;
    uint64_t run_last_start_ns;   /* its last tick's start (spacing across calls) */
    uint32_t log_n;               /* tick log: acked ticks' times until taken */
    uint64_t log_tick_ns[AOTX_JOURNAL_TICK_LOG];
    uint64_t log_fsync_ns[AOTX_JOURNAL_TICK_LOG];
};

/* ---- codec ---- */

uint32_t journal_record_crc(const uint8_t *rec) {
    static const uint8_t zero4[4] = {0, 0, 0, 0};
    uint32_t c = aotx_crc32c(0, rec, JP_CRC);
    c = aotx_crc32c(c, zero4, 4);
    return aotx_crc32c(c, rec + AOTX_JOURNAL_PART_HEADER, AOTX_JOURNAL_PART_DATA);
}

uint32_t journal_header_crc(const uint8_t *hdr) { return aotx_crc32c(0, hdr, JH_CRC); }

void journal_chain(const uint8_t prev[32], const uint8_t *rec, uint8_t next[32]) {
    uint8_t buf[32 + AOTX_JOURNAL_RECORD_SIZE];
    memcpy(buf, prev, 32);
    memcpy(buf + 32, rec, AOTX_JOURNAL_RECORD_SIZE);
    aotx_sha256(buf, sizeof buf, next);
}

static void encode_file_header(const aotx_journal_params *p, uint8_t *h) {
    memset(h, 0, AOTX_JOURNAL_FILE_HEADER);
    memcpy(h + JH_MAGIC, JOURNAL_MAGIC, 8);
    put_u32(h + JH_VERSION, AOTX_JOURNAL_FORMAT_VERSION);
    put_u32(h + JH_HEADER_SIZE, AOTX_JOURNAL_FILE_HEADER);
    memcpy(h + JH_LINEAGE, p->lineage, 16);
    put_u64(h + JH_INCARNATION, p->file_incarnation);
    put_u32(h + JH_CREATED_BY, JOURNAL_LIB_VERSION);
    put_u16(h + JH_RECORD_SIZE, AOTX_JOURNAL_RECORD_SIZE);
    h[JH_RECORD_TYPE] = AOTX_JOURNAL_RECORD_TYPE;
    h[JH_RECORD_CLASS] = AOTX_JOURNAL_RECORD_CLASS;
    put_u32(h + JH_CRC, journal_header_crc(h));
}

static void encode_record(uint8_t *rec, uint8_t kind, uint16_t part, uint16_t count,
                          uint64_t index, uint32_t xfer_len, const uint8_t *data,
                          uint16_t dlen) {
    memset(rec, 0, AOTX_JOURNAL_RECORD_SIZE);
    rec[JP_TYPE] = AOTX_JOURNAL_RECORD_TYPE;
    rec[JP_CLASS] = AOTX_JOURNAL_RECORD_CLASS;
    rec[JP_KIND] = kind;
    rec[JP_FLAGS] = (uint8_t)((part == 0 ? AOTX_JOURNAL_FLAG_FIRST : 0) |
                              (part + 1 == count ? AOTX_JOURNAL_FLAG_LAST : 0));
    put_u16(rec + JP_PART, part);
    put_u16(rec + JP_COUNT, count);
    put_u64(rec + JP_INDEX, index);
    put_u32(rec + JP_XFER_LEN, xfer_len);
    put_u16(rec + JP_DATA_LEN, dlen);
    if (dlen) memcpy(rec + AOTX_JOURNAL_PART_HEADER, data, dlen);
    /* the save generation and the CRC are set when the record is drained */
}

/* ---- lifecycle ---- */

void aotx_journal_default_params(aotx_journal_params *p) {
    memset(p, 0, sizeof *p);
    p->max_pending_bytes = DEFAULT_PENDING;
}

int aotx_journal_new(const aotx_journal_params *p, aotx_journal **out) {
    if (!p || !out) return AOTX_E_INVALID_ARGUMENT;
    if (p->max_pending_bytes < AOTX_JOURNAL_RECORD_SIZE || p->max_pending_bytes > MAX_PENDING_LIMIT)
        return AOTX_E_INVALID_ARGUMENT;
    aotx_journal *j = calloc(1, sizeof *j);
    if (!j) return AOTX_E_NOMEM;
    j->cap_records = p->max_pending_bytes / AOTX_JOURNAL_RECORD_SIZE;
    j->ring = malloc(j->cap_records * AOTX_JOURNAL_RECORD_SIZE);
    j->ring_digest = malloc(j->cap_records * 32);
    pthread_condattr_t ca;
    int cv_ok = pthread_condattr_init(&ca) == 0;
    if (cv_ok) {
        cv_ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
                pthread_cond_init(&j->run_cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (!j->ring || !j->ring_digest || !cv_ok || pthread_mutex_init(&j->mu, NULL) != 0) {
        if (cv_ok) pthread_cond_destroy(&j->run_cv);
        free(j->ring);
        free(j->ring_digest);
        free(j);
        return AOTX_E_NOMEM;
    }
    j->p = *p;
    j->retain_from = UINT64_MAX;
    encode_file_header(p, j->header);
    aotx_sha256(j->header, AOTX_JOURNAL_FILE_HEADER, j->saved_digest);
    memcpy(j->drain_digest, j->saved_digest, 32);
    *out = j;
    return AOTX_OK;
}

void aotx_journal_free(aotx_journal *j) {
    if (!j) return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->run_cv);
    free(j->ring);
    free(j->ring_digest);
    free(j);
}

int64_t aotx_journal_header_encode(const aotx_journal *j, uint8_t *buf, size_t cap) {
    if (!j || (!buf && cap)) return AOTX_E_INVALID_ARGUMENT;
    if (cap < AOTX_JOURNAL_FILE_HEADER) return -(int64_t)AOTX_JOURNAL_FILE_HEADER;
    aotx_journal *m = (aotx_journal *)j;
    pthread_mutex_lock(&m->mu);
    memcpy(buf, j->header, AOTX_JOURNAL_FILE_HEADER);
    pthread_mutex_unlock(&m->mu);
    return AOTX_JOURNAL_FILE_HEADER;
}

/* ---- enqueue ---- */

static uint8_t *slot(aotx_journal *j, uint64_t index) {
    return j->ring + (index % j->cap_records) * AOTX_JOURNAL_RECORD_SIZE;
}

/* Refusal checks for n new records; 0 when they may be queued. Sets hold bits. */
static int admit(aotx_journal *j, uint64_t n) {
    if (n * AOTX_JOURNAL_RECORD_SIZE > j->p.max_pending_bytes) return AOTX_E_JOURNAL_TOO_LARGE;
    if (j->hold & (AOTX_JOURNAL_HOLD_FILE_CAP | AOTX_JOURNAL_HOLD_DISK)) return AOTX_R_JOURNAL_HOLD;
    uint64_t end = AOTX_JOURNAL_FILE_HEADER + (j->next_record + n) * AOTX_JOURNAL_RECORD_SIZE;
    if (j->p.file_cap_bytes && end > j->p.file_cap_bytes) {
        j->hold |= AOTX_JOURNAL_HOLD_FILE_CAP;
        return AOTX_R_JOURNAL_HOLD;
    }
    uint64_t kept = j->saved_records;   /* ring slots from here on are not free */
    if (j->retain_from < kept) kept = j->retain_from > j->ring_first ? j->retain_from : j->ring_first;
    if (j->next_record - kept + n > j->cap_records) {
        j->hold |= AOTX_JOURNAL_HOLD_PENDING;
        return AOTX_R_JOURNAL_HOLD;
    }
    return AOTX_OK;
}

/* Encode one admitted transfer's parts into the ring; returns its last index. */
static uint64_t put_transfer(aotx_journal *j, uint8_t kind, const uint8_t *data, uint32_t len) {
    uint64_t count = journal_parts_for(len);
    for (uint64_t part = 0; part < count; part++) {
        uint64_t off = part * AOTX_JOURNAL_PART_DATA;
        uint64_t dlen = len - off < AOTX_JOURNAL_PART_DATA ? len - off : AOTX_JOURNAL_PART_DATA;
        uint64_t index = j->next_record;
        uint8_t *rec = slot(j, index);
        encode_record(rec, kind, (uint16_t)part, (uint16_t)count, index, len,
                      data ? data + off : NULL, (uint16_t)dlen);
        j->next_record++;
    }
    return j->next_record - 1;
}

static void boot_payload(const aotx_journal *j, uint8_t *b) {
    memset(b, 0, AOTX_JOURNAL_BOOT_PAYLOAD);
    put_u64(b + JB_BOOT, j->boot + 1);
    put_u64(b + JB_GENERATION, j->generation);
    put_u64(b + JB_INCARNATION, j->p.file_incarnation);
    put_u32(b + JB_CREATED_BY, JOURNAL_LIB_VERSION);
}

static void put_boot(aotx_journal *j) {
    uint8_t b[AOTX_JOURNAL_BOOT_PAYLOAD];
    boot_payload(j, b);
    j->boot_last_record = put_transfer(j, AOTX_XFER_BOOT, b, sizeof b);
    j->boot++;
    j->boot_queued = 1;
}

int aotx_journal_enqueue(aotx_journal *j, uint8_t kind, const uint8_t *data, uint32_t len,
                         uint64_t *out_last_record) {
    if (!j || (!data && len) || kind <= AOTX_XFER_BOOT || kind > AOTX_XFER_MAX_KIND)
        return AOTX_E_INVALID_ARGUMENT;
    if (len > AOTX_JOURNAL_MAX_TRANSFER) return AOTX_E_JOURNAL_TOO_LARGE;
    pthread_mutex_lock(&j->mu);
    uint64_t n = journal_parts_for(len) + (j->boot_queued ? 0 : 1);
    int rc = admit(j, n);
    if (rc == AOTX_OK) {
        if (!j->boot_queued) put_boot(j);
        uint64_t last = put_transfer(j, kind, data, len);
        j->hold &= ~(uint32_t)AOTX_JOURNAL_HOLD_PENDING;
        if (out_last_record) *out_last_record = last;
        if (j->run_waiting) pthread_cond_signal(&j->run_cv);
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int aotx_journal_begin_boot(aotx_journal *j, uint64_t *out_last_record) {
    if (!j) return AOTX_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&j->mu);
    int rc = AOTX_OK;
    if (!j->boot_queued) rc = admit(j, 1);
    if (rc == AOTX_OK) {
        if (!j->boot_queued) {
            put_boot(j);
            j->hold &= ~(uint32_t)AOTX_JOURNAL_HOLD_PENDING;
            if (j->run_waiting) pthread_cond_signal(&j->run_cv);
        }
        if (out_last_record) *out_last_record = j->boot_last_record;
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

/* ---- emitter side ---- */

int64_t aotx_journal_drain(aotx_journal *j, uint8_t *buf, size_t cap, uint32_t max_records,
                           uint64_t *out_first_record) {
    if (!j || (!buf && cap)) return AOTX_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&j->mu);
    uint64_t first = j->saved_records + j->in_flight;
    uint64_t avail = j->next_record - first;
    uint64_t n = avail < max_records ? avail : max_records;
    int64_t rc;
    if (n * AOTX_JOURNAL_RECORD_SIZE > cap) {
        rc = -(int64_t)(n * AOTX_JOURNAL_RECORD_SIZE);
    } else if (n && j->generation >= JOURNAL_MAX_GENERATION) {
        rc = AOTX_E_JOURNAL_STATE;  /* 2^48 - 1 saves: the stamp field is full */
    } else {
        /* stamp each record with the generation its ack will have, then CRC
         * and chain it (a rewrite after a nack stamps the same value) */
        for (uint64_t i = 0; i < n; i++) {
            uint64_t index = first + i;
            uint8_t *rec = slot(j, index);
            put_u48(rec + JP_GENERATION, j->generation + 1);
            put_u32(rec + JP_CRC, journal_record_crc(rec));
            uint8_t *dig = j->ring_digest + (index % j->cap_records) * 32;
            journal_chain(j->drain_digest, rec, dig);
            memcpy(j->drain_digest, dig, 32);
            memcpy(buf + i * AOTX_JOURNAL_RECORD_SIZE, rec, AOTX_JOURNAL_RECORD_SIZE);
        }
        j->in_flight += n;
        if (out_first_record) *out_first_record = first;
        rc = (int64_t)(n * AOTX_JOURNAL_RECORD_SIZE);
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int aotx_journal_ack(aotx_journal *j) {
    if (!j) return AOTX_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&j->mu);
    int rc = AOTX_OK;
    if (j->in_flight == 0) {
        rc = AOTX_E_JOURNAL_STATE;
    } else {
        if (j->in_flight >= 2)
            memcpy(j->saved_prev_digest,
                   j->ring_digest + ((j->saved_records + j->in_flight - 2) % j->cap_records) * 32, 32);
        else
            memcpy(j->saved_prev_digest, j->saved_digest, 32);
        j->saved_records += j->in_flight;
        j->in_flight = 0;
        memcpy(j->saved_digest, j->ring_digest + ((j->saved_records - 1) % j->cap_records) * 32, 32);
        j->generation++;
        j->disk_error = 0;
        /* a failed write's hold ends with this ack; the floor's (set_hold) only by set_hold:
         * else records admitted between this ack and the caller's next floor check would
         * be written under the floor */
        j->hold &= ~(uint32_t)(AOTX_JOURNAL_HOLD_PENDING |
                               (j->disk_held ? 0 : AOTX_JOURNAL_HOLD_DISK));
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

static uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* drain, pwrite, fsync, ack (aotx_journal_tick's body; arguments checked) */
static int tick_once(aotx_journal *j, int fd, uint8_t *buf, size_t cap, uint32_t max_records,
                     uint64_t *out_first_record, uint32_t *out_records, int *out_errno,
                     uint64_t *out_fsync_ns) {
    *out_records = 0;
    *out_errno = 0;
    *out_fsync_ns = 0;
    int64_t n = aotx_journal_drain(j, buf, cap, max_records, out_first_record);
    if (n < 0) return (int)n;   /* cap fits max_records: only an aotx error */
    if (n == 0) return AOTX_OK;
    *out_records = (uint32_t)(n / AOTX_JOURNAL_RECORD_SIZE);
    off_t at = (off_t)(AOTX_JOURNAL_FILE_HEADER +
                       *out_first_record * (uint64_t)AOTX_JOURNAL_RECORD_SIZE);
    size_t done = 0;
    while (done < (size_t)n) {
        ssize_t w = pwrite(fd, buf + done, (size_t)n - done, at + (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            *out_errno = w < 0 ? errno : EIO;
            return AOTX_OK;
        }
        done += (size_t)w;
    }
    uint64_t t0 = mono_ns();
    int rc = fsync(fd);
    *out_fsync_ns = mono_ns() - t0;
    if (rc != 0) {   /* never retried into "success": the caller nacks, the records are rewritten */
        *out_errno = errno ? errno : EIO;
        return AOTX_OK;
    }
    return aotx_journal_ack(j);
}

int aotx_journal_tick(aotx_journal *j, int fd, uint8_t *buf, size_t cap, uint32_t max_records,
                      uint64_t *out_first_record, uint32_t *out_records, int *out_errno,
                      uint64_t *out_fsync_ns) {
    if (!j || !buf || !out_first_record || !out_records || !out_errno || !out_fsync_ns || fd < 0 ||
        max_records == 0 || max_records > AOTX_JOURNAL_TICK_RECORDS ||
        cap < (size_t)max_records * AOTX_JOURNAL_RECORD_SIZE)
        return AOTX_E_INVALID_ARGUMENT;
    return tick_once(j, fd, buf, cap, max_records, out_first_record, out_records, out_errno,
                     out_fsync_ns);
}

static void abs_time(uint64_t ns, struct timespec *out) {
    out->tv_sec = (time_t)(ns / 1000000000ull);
    out->tv_nsec = (long)(ns % 1000000000ull);
}

/* Wait (mutex held) until records are pending, or an interrupt, or `deadline`
 * (CLOCK_MONOTONIC ns; UINT64_MAX: none).  Returns 0 (pending), INTERRUPTED or IDLE. */
static uint32_t wait_pending(aotx_journal *j, uint64_t deadline) {
    for (;;) {
        if (j->run_interrupt) {
            j->run_interrupt = 0;
            return AOTX_JOURNAL_RUN_INTERRUPTED;
        }
        if (j->next_record > j->saved_records + j->in_flight) return 0;
        j->run_waiting = 1;
        if (deadline == UINT64_MAX) {
            pthread_cond_wait(&j->run_cv, &j->mu);
        } else {
            if (mono_ns() >= deadline) {
                j->run_waiting = 0;
                return AOTX_JOURNAL_RUN_IDLE;
            }
            struct timespec ts;
            abs_time(deadline, &ts);
            pthread_cond_timedwait(&j->run_cv, &j->mu, &ts);
        }
        j->run_waiting = 0;
    }
}

int aotx_journal_run(aotx_journal *j, const aotx_journal_run_params *p,
                     aotx_journal_run_result *out) {
    if (!j || !p || !out || p->fd < 0 || p->max_records == 0 ||
        p->max_records > AOTX_JOURNAL_TICK_RECORDS)
        return AOTX_E_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    uint8_t buf[AOTX_JOURNAL_TICK_RECORDS * AOTX_JOURNAL_RECORD_SIZE];
    uint64_t writing = (uint64_t)p->max_records * AOTX_JOURNAL_RECORD_SIZE;
    uint64_t started = mono_ns();
    uint64_t free_at_stat = 0, stat_at = 0, written = 0;
    int have_stat = 0;
    for (;;) {
        /* back-to-back ticks start spacing_ns apart */
        uint64_t now = mono_ns();
        uint64_t next = j->run_last_start_ns + p->spacing_ns;
        if (j->run_last_start_ns && now < next) {
            struct timespec ts;
            abs_time(next, &ts);
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
        }
        uint64_t deadline;
        if (out->ticks) deadline = out->last_ack_ns + p->idle_ns;
        else deadline = p->wait_ns ? started + p->wait_ns : UINT64_MAX;
        pthread_mutex_lock(&j->mu);
        uint32_t why = wait_pending(j, deadline);
        pthread_mutex_unlock(&j->mu);
        if (why) {
            out->reason = why;
            return AOTX_OK;
        }
        if (p->min_free_bytes) {
            now = mono_ns();
            uint64_t est = free_at_stat > written ? free_at_stat - written : 0;
            if (!have_stat || now - stat_at >= p->stat_every_ns ||
                est < p->min_free_bytes + writing) {
                struct statvfs st;
                if (fstatvfs(p->fd, &st) != 0) {
                    out->reason = AOTX_JOURNAL_RUN_FLOOR;   /* cannot tell: the caller decides */
                    out->free_bytes = 0;
                    return AOTX_OK;
                }
                free_at_stat = (uint64_t)st.f_bavail * (uint64_t)st.f_frsize;
                stat_at = now;
                written = 0;
                have_stat = 1;
                est = free_at_stat;
            }
            if (est < p->min_free_bytes + writing) {
                out->reason = AOTX_JOURNAL_RUN_FLOOR;
                out->free_bytes = est;
                return AOTX_OK;
            }
        }
        uint64_t t0 = mono_ns();
        j->run_last_start_ns = t0;
        uint64_t first = 0, fsync_ns = 0;
        uint32_t records = 0;
        int err = 0;
        int rc = tick_once(j, p->fd, buf, sizeof buf, p->max_records, &first, &records, &err,
                           &fsync_ns);
        if (rc != AOTX_OK) return rc;
        if (err) {
            out->reason = AOTX_JOURNAL_RUN_FAILED;
            out->first_record = first;
            out->records = records;
            out->err = err;
            return AOTX_OK;
        }
        if (!records) continue;
        uint64_t t1 = mono_ns();
        written += (uint64_t)records * AOTX_JOURNAL_RECORD_SIZE;
        out->ticks++;
        out->last_ack_ns = t1;
        pthread_mutex_lock(&j->mu);
        if (j->log_n < AOTX_JOURNAL_TICK_LOG) {
            j->log_tick_ns[j->log_n] = t1 - t0;
            j->log_fsync_ns[j->log_n] = fsync_ns;
            j->log_n++;
        }
        pthread_mutex_unlock(&j->mu);
        if (p->notify_fd >= 0) {
            uint64_t one = 1;
            ssize_t w;
            do w = write(p->notify_fd, &one, sizeof one); while (w < 0 && errno == EINTR);
        }
    }
}

void aotx_journal_interrupt(aotx_journal *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    j->run_interrupt = 1;
    pthread_cond_signal(&j->run_cv);
    pthread_mutex_unlock(&j->mu);
}

uint32_t aotx_journal_take_ticks(aotx_journal *j, uint64_t *tick_ns, uint64_t *fsync_ns,
                                 uint32_t cap, uint64_t *out_saved_records) {
    if (!j) return 0;
    pthread_mutex_lock(&j->mu);
    uint32_t n = (tick_ns && fsync_ns) ? (j->log_n < cap ? j->log_n : cap) : 0;
    if (n) {
        memcpy(tick_ns, j->log_tick_ns, n * sizeof *tick_ns);
        memcpy(fsync_ns, j->log_fsync_ns, n * sizeof *fsync_ns);
        memmove(j->log_tick_ns, j->log_tick_ns + n, (j->log_n - n) * sizeof *tick_ns);
        memmove(j->log_fsync_ns, j->log_fsync_ns + n, (j->log_n - n) * sizeof *fsync_ns);
        j->log_n -= n;
    }
    if (out_saved_records) *out_saved_records = j->saved_records;
    pthread_mutex_unlock(&j->mu);
    return n;
}

int aotx_journal_nack(aotx_journal *j, int err) {
    if (!j || err <= 0) return AOTX_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&j->mu);
    j->in_flight = 0;
    memcpy(j->drain_digest, j->saved_digest, 32);
    j->disk_error = err;
    j->hold |= AOTX_JOURNAL_HOLD_DISK;
    pthread_mutex_unlock(&j->mu);
    return AOTX_OK;
}

void aotx_journal_set_hold(aotx_journal *j, uint32_t reason_bit, int on) {
    if (!j) return;
    uint32_t mask = reason_bit & (AOTX_JOURNAL_HOLD_FILE_CAP | AOTX_JOURNAL_HOLD_DISK |
                                  AOTX_JOURNAL_HOLD_PENDING);
    pthread_mutex_lock(&j->mu);
    if (on) j->hold |= mask;
    else j->hold &= ~mask;
    if (mask & AOTX_JOURNAL_HOLD_DISK) {
        j->disk_held = on != 0;
        if (!on && j->disk_error) j->hold |= AOTX_JOURNAL_HOLD_DISK;  /* a failed write's
                                                                         hold stays */
    }
    pthread_mutex_unlock(&j->mu);
}

void aotx_journal_set_file_cap(aotx_journal *j, uint64_t file_cap_bytes) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    j->p.file_cap_bytes = file_cap_bytes;
    j->hold &= ~(uint32_t)AOTX_JOURNAL_HOLD_FILE_CAP;
    pthread_mutex_unlock(&j->mu);
}

void aotx_journal_retain(aotx_journal *j, uint64_t from_record) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    j->retain_from = from_record;
    pthread_mutex_unlock(&j->mu);
}

int aotx_journal_save_of(const aotx_journal *j, uint64_t record, aotx_save_id *out) {
    if (!j || !out) return AOTX_E_INVALID_ARGUMENT;
    aotx_journal *m = (aotx_journal *)j;
    pthread_mutex_lock(&m->mu);
    int rc = AOTX_OK;
    if (record >= j->saved_records) {
        rc = AOTX_R_JOURNAL_NOTHING;
    } else if (record < j->ring_first || j->next_record - record > j->cap_records) {
        rc = AOTX_E_JOURNAL_STATE;
    } else {
        /* the save's records are every saved record with this stamp; its commit
         * point is the last complete transfer among them */
        uint64_t gen = get_u48(slot(m, record) + JP_GENERATION);
        uint64_t commit = UINT64_MAX;
        for (uint64_t i = record; i < j->saved_records; i++) {
            const uint8_t *rec = slot(m, i);
            if (get_u48(rec + JP_GENERATION) != gen) break;
            if (rec[JP_FLAGS] & AOTX_JOURNAL_FLAG_LAST) commit = i;
        }
        if (commit == UINT64_MAX) {
            rc = AOTX_E_JOURNAL_STATE;
        } else {
            memset(out, 0, sizeof *out);
            out->file_incarnation = j->p.file_incarnation;
            out->generation = gen;
            out->boot = j->boot;
            out->commit_records = commit + 1;
            memcpy(out->commit_digest, j->ring_digest + (commit % j->cap_records) * 32, 32);
        }
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void aotx_journal_save_state(const aotx_journal *j, aotx_save_state *out) {
    if (!j || !out) return;
    aotx_journal *m = (aotx_journal *)j;
    pthread_mutex_lock(&m->mu);
    memset(out, 0, sizeof *out);
    out->next_record = j->next_record;
    out->saved_records = j->saved_records;
    out->in_flight_records = j->in_flight;
    out->pending_bytes = (j->next_record - j->saved_records) * AOTX_JOURNAL_RECORD_SIZE;
    out->file_incarnation = j->p.file_incarnation;
    out->generation = j->generation;
    out->boot = j->boot;
    memcpy(out->commit_digest, j->saved_digest, 32);
    out->disk_error = j->disk_error;
    out->hold = j->hold;
    pthread_mutex_unlock(&m->mu);
}

/* ---- resume (the reader's results; journal_reader.c fills them) ---- */

int aotx_journal_resume(aotx_journal *j, const aotx_journal_reader *r) {
    if (!j || !r) return AOTX_E_INVALID_ARGUMENT;
    journal_resume_point rp;
    int rc = journal_reader_resume_point(r, &rp);
    if (rc != AOTX_OK) return rc;
    pthread_mutex_lock(&j->mu);
    if (j->next_record != 0 || j->boot_queued || j->generation != 0) {
        rc = AOTX_E_JOURNAL_STATE;
    } else {
        memcpy(j->header, rp.header, AOTX_JOURNAL_FILE_HEADER);
        memcpy(j->p.lineage, rp.header + JH_LINEAGE, 16);
        j->p.file_incarnation = get_u64(rp.header + JH_INCARNATION);
        j->next_record = j->saved_records = j->ring_first = rp.records;
        j->in_flight = 0;
        memcpy(j->drain_digest, rp.digest, 32);
        memcpy(j->saved_digest, rp.digest, 32);
        memcpy(j->saved_prev_digest, rp.prev_digest, 32);
        j->boot = rp.boot;
        j->generation = rp.generation;
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int aotx_journal_saved_anchor(const aotx_journal *j, aotx_journal_anchor *out) {
    if (!j || !out) return AOTX_E_INVALID_ARGUMENT;
    aotx_journal *m = (aotx_journal *)j;
    pthread_mutex_lock(&m->mu);
    int rc = AOTX_OK;
    if (j->saved_records == 0 || j->next_record != j->saved_records || j->in_flight) {
        rc = AOTX_E_JOURNAL_STATE;
    } else {
        memset(out, 0, sizeof *out);
        out->file_incarnation = j->p.file_incarnation;
        out->records = j->saved_records;
        out->boot = j->boot;
        out->generation = j->generation;
        memcpy(out->prev_digest, j->saved_prev_digest, 32);
        memcpy(out->digest, j->saved_digest, 32);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}
