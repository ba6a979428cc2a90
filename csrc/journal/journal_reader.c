/* journal_reader.c -- recovery: verify every record of a journal file,
 * publish complete transfers, end cleanly at a torn tail, fail closed on
 * damage anywhere else (docs/formats/journal.md, "Recovery"). */
#include "journal_internal.h"

#include <stdlib.h>
#include <string.h>

struct aotx_journal_reader {
    const uint8_t *buf;     /* [len] the whole file, caller-owned */
    size_t len;
    uint64_t n_records;     /* whole 192-byte records after the header */
    int header_rc;          /* 0, or FOREIGN / DAMAGE */
    uint8_t header[AOTX_JOURNAL_FILE_HEADER];
    uint64_t pos;           /* next record index to read */
    int done;               /* 1 after the end (clean or torn) */
    int err;                /* sticky error code */
    uint64_t err_off;       /* byte offset of the error */
    uint64_t valid_records; /* records in complete transfers */
    uint64_t verified_end;  /* records verified at the end (incl. a dropped incomplete tail) */
    uint8_t digest[32];     /* chained digest after valid_records */
    uint8_t prev_digest[32];/* chained digest before the last valid record */
    uint64_t boot;          /* boot transfers read */
    uint8_t *xfer;          /* [xfer_cap] assembled transfer bytes */
    size_t xfer_cap;
};

static int fail(aotx_journal_reader *r, int code, uint64_t off) {
    r->err = code;
    r->err_off = off;
    return code;
}

static int check_header(aotx_journal_reader *r) {
    const uint8_t *h = r->buf;
    if (r->len < AOTX_JOURNAL_FILE_HEADER || memcmp(h + JH_MAGIC, JOURNAL_MAGIC, 8) != 0)
        return fail(r, AOTX_E_JOURNAL_FOREIGN, JH_MAGIC);
    if (get_u32(h + JH_CRC) != journal_header_crc(h)) return fail(r, AOTX_E_JOURNAL_DAMAGE, JH_CRC);
    if (get_u32(h + JH_VERSION) != AOTX_JOURNAL_FORMAT_VERSION)
        return fail(r, AOTX_E_JOURNAL_FOREIGN, JH_VERSION);
    if (get_u32(h + JH_HEADER_SIZE) != AOTX_JOURNAL_FILE_HEADER)
        return fail(r, AOTX_E_JOURNAL_FOREIGN, JH_HEADER_SIZE);
    if (get_u16(h + JH_RECORD_SIZE) != AOTX_JOURNAL_RECORD_SIZE)
        return fail(r, AOTX_E_JOURNAL_FOREIGN, JH_RECORD_SIZE);
    if (h[JH_RECORD_TYPE] != AOTX_JOURNAL_RECORD_TYPE)
        return fail(r, AOTX_E_JOURNAL_FOREIGN, JH_RECORD_TYPE);
    if (h[JH_RECORD_CLASS] != AOTX_JOURNAL_RECORD_CLASS)
        return fail(r, AOTX_E_JOURNAL_FOREIGN, JH_RECORD_CLASS);
    for (int i = JH_RESERVED; i < JH_CRC; i++)
        if (h[i]) return fail(r, AOTX_E_JOURNAL_DAMAGE, (uint64_t)i);
    return AOTX_OK;
}

int aotx_journal_reader_new(const uint8_t *buf, size_t len, aotx_journal_reader **out) {
    if (!out || (!buf && len)) return AOTX_E_INVALID_ARGUMENT;
    aotx_journal_reader *r = calloc(1, sizeof *r);
    if (!r) return AOTX_E_NOMEM;
    r->buf = buf;
    r->len = len;
    r->header_rc = check_header(r);
    if (r->header_rc == AOTX_OK) {
        memcpy(r->header, buf, AOTX_JOURNAL_FILE_HEADER);
        r->n_records = (len - AOTX_JOURNAL_FILE_HEADER) / AOTX_JOURNAL_RECORD_SIZE;
        aotx_sha256(r->header, AOTX_JOURNAL_FILE_HEADER, r->digest);
        memcpy(r->prev_digest, r->digest, 32);
    }
    *out = r;
    return AOTX_OK;
}

void aotx_journal_reader_free(aotx_journal_reader *r) {
    if (!r) return;
    free(r->xfer);
    free(r);
}

int aotx_journal_reader_header_status(const aotx_journal_reader *r) {
    return r ? r->header_rc : AOTX_E_INVALID_ARGUMENT;
}

int aotx_journal_reader_expect_lineage(aotx_journal_reader *r, const uint8_t lineage[16]) {
    if (!r || !lineage) return AOTX_E_INVALID_ARGUMENT;
    if (r->header_rc == AOTX_OK && memcmp(r->header + JH_LINEAGE, lineage, 16) != 0)
        r->header_rc = fail(r, AOTX_E_JOURNAL_FOREIGN, JH_LINEAGE);
    return r->header_rc;
}

static uint64_t rec_off(uint64_t index) {
    return AOTX_JOURNAL_FILE_HEADER + index * AOTX_JOURNAL_RECORD_SIZE;
}

/* A record is intact when it carries our type and class and its CRC matches. */
static int intact(const uint8_t *rec) {
    return rec[JP_TYPE] == AOTX_JOURNAL_RECORD_TYPE && rec[JP_CLASS] == AOTX_JOURNAL_RECORD_CLASS &&
           get_u32(rec + JP_CRC) == journal_record_crc(rec);
}

/* Save generation stamped on record i (already verified when i < pos). */
static uint64_t stamp_at(const aotx_journal_reader *r, uint64_t i) {
    return get_u48(r->buf + rec_off(i) + JP_GENERATION);
}

/* A record at `index` failed its checks.  It held acknowledged data when an
 * intact record after it was written by a later save than the record before
 * it (docs/formats/journal.md, "Recovery"); otherwise every intact record
 * after it belongs to the same, unconfirmed last save: a torn tail. */
static int confirmed_after(const aotx_journal_reader *r, uint64_t index) {
    uint64_t gen = index ? stamp_at(r, index - 1) : 0;
    for (uint64_t i = index + 1; i < r->n_records; i++) {
        const uint8_t *rec = r->buf + rec_off(i);
        if (intact(rec) && get_u48(rec + JP_GENERATION) != gen) return 1;
    }
    return 0;
}

/* Field checks of an intact record at position pos, part of a transfer that
 * started at `start` (first part `first`, NULL when pos == start); prev_gen is
 * the previous record's save generation (0 before the first).  Returns the
 * offset of the bad field inside the record, or -1 when it is fine. */
static int bad_field(const uint8_t *rec, uint64_t pos, uint64_t start, const uint8_t *first,
                     uint64_t prev_gen) {
    uint8_t kind = rec[JP_KIND];
    uint8_t flags = rec[JP_FLAGS];
    uint16_t part = get_u16(rec + JP_PART), count = get_u16(rec + JP_COUNT);
    uint32_t xlen = get_u32(rec + JP_XFER_LEN);
    uint16_t dlen = get_u16(rec + JP_DATA_LEN);
    if (get_u64(rec + JP_INDEX) != pos) return JP_INDEX;
    if (kind < AOTX_XFER_BOOT || kind > AOTX_XFER_MAX_KIND) return JP_KIND;
    if (xlen > AOTX_JOURNAL_MAX_TRANSFER) return JP_XFER_LEN;
    if (count == 0 || count != journal_parts_for(xlen)) return JP_COUNT;
    if (part != pos - start || part >= count) return JP_PART;
    uint8_t want_flags = (uint8_t)((part == 0 ? AOTX_JOURNAL_FLAG_FIRST : 0) |
                                   (part + 1 == count ? AOTX_JOURNAL_FLAG_LAST : 0));
    if (flags != want_flags) return JP_FLAGS;
    uint64_t want_dlen = part + 1 < count ? AOTX_JOURNAL_PART_DATA
                                          : xlen - (uint64_t)part * AOTX_JOURNAL_PART_DATA;
    if (dlen != want_dlen) return JP_DATA_LEN;
    /* generations never go down (they may jump: a restart continues after the
     * generation of a truncated tail) */
    uint64_t gen = get_u48(rec + JP_GENERATION);
    if (gen < prev_gen || gen == 0) return JP_GENERATION;
    for (int i = AOTX_JOURNAL_PART_HEADER + dlen; i < AOTX_JOURNAL_RECORD_SIZE; i++)
        if (rec[i]) return i;
    if (first) {
        if (kind != first[JP_KIND]) return JP_KIND;
        if (count != get_u16(first + JP_COUNT)) return JP_COUNT;
        if (xlen != get_u32(first + JP_XFER_LEN)) return JP_XFER_LEN;
    }
    return -1;
}

/* Boot payload checks; offset of the bad field inside the payload or -1. */
static int bad_boot(const aotx_journal_reader *r, const uint8_t *b, uint32_t len) {
    if (len != AOTX_JOURNAL_BOOT_PAYLOAD) return 0;
    if (get_u64(b + JB_BOOT) != r->boot + 1) return JB_BOOT;
    if (get_u64(b + JB_INCARNATION) != get_u64(r->header + JH_INCARNATION)) return JB_INCARNATION;
    if (get_u32(b + JB_RESERVED) != 0) return JB_RESERVED;
    return -1;
}

static int ensure_xfer(aotx_journal_reader *r, size_t need) {
    if (need <= r->xfer_cap) return AOTX_OK;
    size_t cap = r->xfer_cap ? r->xfer_cap : 4096;
    while (cap < need) cap *= 2;
    uint8_t *p = realloc(r->xfer, cap);
    if (!p) return AOTX_E_NOMEM;
    r->xfer = p;
    r->xfer_cap = cap;
    return AOTX_OK;
}

int aotx_journal_reader_next(aotx_journal_reader *r, uint8_t *kind, const uint8_t **data,
                             uint32_t *len, uint64_t *first_record) {
    if (!r) return AOTX_E_INVALID_ARGUMENT;
    if (r->header_rc != AOTX_OK) return r->header_rc;
    if (r->err) return r->err;
    if (r->done) return 0;
    uint64_t start = r->pos;
    uint8_t d[32], before_last[32];
    memcpy(d, r->digest, 32);
    const uint8_t *first = NULL;
    for (;;) {
        uint64_t pos = r->pos;
        if (pos >= r->n_records) { /* end of file: clean, or an incomplete transfer */
            r->verified_end = pos;
            r->pos = start;
            r->done = 1;
            return 0;
        }
        const uint8_t *rec = r->buf + rec_off(pos);
        if (!intact(rec)) {
            if (confirmed_after(r, pos)) return fail(r, AOTX_E_JOURNAL_DAMAGE, rec_off(pos));
            r->verified_end = pos;
            r->pos = start; /* torn tail: drop the incomplete transfer */
            r->done = 1;
            return 0;
        }
        int bf = bad_field(rec, pos, start, first, pos ? stamp_at(r, pos - 1) : 0);
        if (bf >= 0) return fail(r, AOTX_E_JOURNAL_DAMAGE, rec_off(pos) + (uint64_t)bf);
        if (!first) first = rec;
        uint32_t xlen = get_u32(rec + JP_XFER_LEN);
        uint16_t part = get_u16(rec + JP_PART), count = get_u16(rec + JP_COUNT);
        int rc = ensure_xfer(r, xlen ? xlen : 1);
        if (rc != AOTX_OK) return rc;
        memcpy(r->xfer + (size_t)part * AOTX_JOURNAL_PART_DATA, rec + AOTX_JOURNAL_PART_HEADER,
               get_u16(rec + JP_DATA_LEN));
        memcpy(before_last, d, 32);
        journal_chain(d, rec, d);
        r->pos = pos + 1;
        if (part + 1 < count) continue;
        uint8_t k = first[JP_KIND];
        if (k == AOTX_XFER_BOOT) {
            int bb = bad_boot(r, r->xfer, xlen);
            if (bb >= 0) {
                r->pos = start;
                return fail(r, AOTX_E_JOURNAL_DAMAGE,
                            rec_off(start) + AOTX_JOURNAL_PART_HEADER + (uint64_t)bb);
            }
            r->boot++;
        }
        r->valid_records = r->pos;
        memcpy(r->digest, d, 32);
        memcpy(r->prev_digest, before_last, 32);
        if (kind) *kind = k;
        if (data) *data = r->xfer;
        if (len) *len = xlen;
        if (first_record) *first_record = start;
        return 1;
    }
}

uint64_t aotx_journal_reader_valid_end(const aotx_journal_reader *r) {
    if (!r || r->header_rc != AOTX_OK) return 0;
    return rec_off(r->valid_records);
}

uint64_t aotx_journal_reader_error_offset(const aotx_journal_reader *r) {
    return r ? r->err_off : 0;
}

uint64_t aotx_journal_reader_incarnation(const aotx_journal_reader *r) {
    if (!r || r->header_rc != AOTX_OK) return 0;
    return get_u64(r->header + JH_INCARNATION);
}

void aotx_journal_reader_lineage(const aotx_journal_reader *r, uint8_t out[16]) {
    if (!out) return;
    if (!r || r->header_rc != AOTX_OK) {
        memset(out, 0, 16);
        return;
    }
    memcpy(out, r->header + JH_LINEAGE, 16);
}

uint64_t aotx_journal_reader_boot(const aotx_journal_reader *r) { return r ? r->boot : 0; }

uint64_t aotx_journal_reader_generation(const aotx_journal_reader *r) {
    if (!r || r->header_rc != AOTX_OK || r->valid_records == 0) return 0;
    return stamp_at(r, r->valid_records - 1);
}

void aotx_journal_reader_digest(const aotx_journal_reader *r, uint8_t out[32]) {
    if (!out) return;
    if (!r) {
        memset(out, 0, 32);
        return;
    }
    memcpy(out, r->digest, 32);
}

int journal_reader_resume_point(const aotx_journal_reader *r, journal_resume_point *out) {
    if (r->header_rc != AOTX_OK || r->err || !r->done) return AOTX_E_JOURNAL_STATE;
    memcpy(out->header, r->header, AOTX_JOURNAL_FILE_HEADER);
    out->records = r->valid_records;
    memcpy(out->digest, r->digest, 32);
    memcpy(out->prev_digest, r->prev_digest, 32);
    out->boot = r->boot;
    /* the generation of the last verified record (an incomplete tail transfer's
     * parts included: their save may have been acked), so none is handed out twice */
    out->generation = r->verified_end ? stamp_at(r, r->verified_end - 1) : 0;
    return AOTX_OK;
}

int aotx_journal_reader_anchor(const aotx_journal_reader *r, aotx_journal_anchor *out) {
    if (!r || !out) return AOTX_E_INVALID_ARGUMENT;
    if (r->header_rc != AOTX_OK) return r->header_rc;
    if (r->err) return r->err;
    memset(out, 0, sizeof *out);
    out->file_incarnation = get_u64(r->header + JH_INCARNATION);
    out->records = r->valid_records;
    out->boot = r->boot;
    out->generation = r->valid_records ? stamp_at(r, r->valid_records - 1) : 0;
    memcpy(out->prev_digest, r->prev_digest, 32);
    memcpy(out->digest, r->digest, 32);
    return AOTX_OK;
}

/* The prefix check of a seek: each record's CRC-32C, with the SSE4.2 instruction
 * where the CPU has it (the same CRC as journal_record_crc; a seek over 100k
 * admissions' records is then about as fast as reading them). */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
                                                        size_t n) {
    uint64_t c = (uint32_t)~crc;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
static int have_hw_crc(void) { return __builtin_cpu_supports("sse4.2"); }
/* Three records' CRCs in lockstep (three independent chains hide the instruction's
 * latency): a record's CRC covers its 192 bytes with the CRC field (bytes 28..31,
 * the high half of word 3) read as zero. */
__attribute__((target("sse4.2"))) static void crc_hw3(const uint8_t *a, const uint8_t *b,
                                                     const uint8_t *c, uint32_t out[3]) {
    uint64_t x = 0xFFFFFFFFu, y = 0xFFFFFFFFu, z = 0xFFFFFFFFu;
    for (int k = 0; k < AOTX_JOURNAL_RECORD_SIZE / 8; k++) {
        uint64_t va, vb, vc;
        memcpy(&va, a + 8 * k, 8);
        memcpy(&vb, b + 8 * k, 8);
        memcpy(&vc, c + 8 * k, 8);
        if (k == JP_CRC / 8) {
            va &= 0xFFFFFFFFu;
            vb &= 0xFFFFFFFFu;
            vc &= 0xFFFFFFFFu;
        }
        x = __builtin_ia32_crc32di(x, va);
        y = __builtin_ia32_crc32di(y, vb);
        z = __builtin_ia32_crc32di(z, vc);
    }
    out[0] = ~(uint32_t)x;
    out[1] = ~(uint32_t)y;
    out[2] = ~(uint32_t)z;
}
#define AOTX_HAVE_CRC_HW3 1
#else
static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) { return aotx_crc32c(crc, p, n); }
static int have_hw_crc(void) { return 0; }
#endif

/* A record's type and class are ours and its CRC field holds ``crc`` (computed). */
static int fields_intact(const uint8_t *rec, uint32_t crc) {
    return rec[JP_TYPE] == AOTX_JOURNAL_RECORD_TYPE &&
           rec[JP_CLASS] == AOTX_JOURNAL_RECORD_CLASS && get_u32(rec + JP_CRC) == crc;
}

static int prefix_intact(const uint8_t *rec, int hw) {
    if (!hw) return intact(rec);
    static const uint8_t zero4[4] = {0, 0, 0, 0};
    uint32_t c = crc_hw(0, rec, JP_CRC);
    c = crc_hw(c, zero4, 4);
    c = crc_hw(c, rec + AOTX_JOURNAL_PART_HEADER, AOTX_JOURNAL_PART_DATA);
    return fields_intact(rec, c);
}

int aotx_journal_reader_seek(aotx_journal_reader *r, const aotx_journal_anchor *a,
                             int check_prefix) {
    if (!r || !a) return AOTX_E_INVALID_ARGUMENT;
    if (r->header_rc != AOTX_OK) return r->header_rc;
    if (r->err) return r->err;
    if (r->pos != 0 || r->done || a->records == 0 || a->records > r->n_records)
        return AOTX_E_JOURNAL_STATE;
    if (a->file_incarnation != get_u64(r->header + JH_INCARNATION))
        return fail(r, AOTX_E_JOURNAL_FOREIGN, JH_INCARNATION);
    /* every record of the prefix still carries its own CRC-32C and index (cheap: no
     * chain, no replay), so damage there fails closed as a full read would */
    int hw = have_hw_crc();
    uint64_t i = 0;
#ifdef AOTX_HAVE_CRC_HW3
    AOTX_STATIC_ASSERT(JP_CRC % 8 == 4 && AOTX_JOURNAL_RECORD_SIZE % 8 == 0,
                       "crc_hw3 masks the high half of the word holding the CRC");
    for (; check_prefix && hw && i + 3 <= a->records; i += 3) {
        const uint8_t *p = r->buf + rec_off(i);
        uint32_t c[3];
        crc_hw3(p, p + AOTX_JOURNAL_RECORD_SIZE, p + 2 * AOTX_JOURNAL_RECORD_SIZE, c);
        for (int k = 0; k < 3; k++) {
            const uint8_t *q = p + (size_t)k * AOTX_JOURNAL_RECORD_SIZE;
            if (!fields_intact(q, c[k]) || get_u64(q + JP_INDEX) != i + (uint64_t)k)
                return fail(r, AOTX_E_JOURNAL_DAMAGE, rec_off(i + (uint64_t)k));
        }
    }
#endif
    for (; check_prefix && i < a->records; i++) {
        const uint8_t *p = r->buf + rec_off(i);
        if (!prefix_intact(p, hw) || get_u64(p + JP_INDEX) != i)
            return fail(r, AOTX_E_JOURNAL_DAMAGE, rec_off(i));
    }
    uint64_t last = a->records - 1;
    const uint8_t *rec = r->buf + rec_off(last);
    uint8_t d[32];
    journal_chain(a->prev_digest, rec, d);
    if (!intact(rec) || get_u64(rec + JP_INDEX) != last ||
        !(rec[JP_FLAGS] & AOTX_JOURNAL_FLAG_LAST) ||
        get_u48(rec + JP_GENERATION) != a->generation || memcmp(d, a->digest, 32) != 0)
        return fail(r, AOTX_E_JOURNAL_DAMAGE, rec_off(last));
    r->pos = r->valid_records = a->records;
    r->boot = a->boot;
    memcpy(r->digest, a->digest, 32);
    memcpy(r->prev_digest, a->prev_digest, 32);
    return AOTX_OK;
}
