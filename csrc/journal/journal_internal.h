/* journal_internal.h -- codec helpers shared by journal.c and journal_reader.c.
 * Byte layout: docs/formats/journal.md. */
#ifndef AOTX_JOURNAL_INTERNAL_H
#define AOTX_JOURNAL_INTERNAL_H

#include "aotx_journal.h"

/* File header field offsets */
enum {
    JH_MAGIC = 0,          /* 8 bytes "AOTXJRNL" */
    JH_VERSION = 8,        /* u32 format version */
    JH_HEADER_SIZE = 12,   /* u32 64 */
    JH_LINEAGE = 16,       /* 16 bytes */
    JH_INCARNATION = 32,   /* u64 */
    JH_CREATED_BY = 40,    /* u32 library version major<<16 | minor<<8 | patch */
    JH_RECORD_SIZE = 44,   /* u16 192 */
    JH_RECORD_TYPE = 46,   /* u8 37 */
    JH_RECORD_CLASS = 47,  /* u8 'A' */
    JH_RESERVED = 48,      /* 12 zero bytes */
    JH_CRC = 60,           /* u32 CRC-32C of bytes 0..59 */
};

/* Part header field offsets */
enum {
    JP_TYPE = 0,           /* u8 37 */
    JP_CLASS = 1,          /* u8 'A' */
    JP_KIND = 2,           /* u8 transfer kind */
    JP_FLAGS = 3,          /* u8 FIRST | LAST */
    JP_PART = 4,           /* u16 part index */
    JP_COUNT = 6,          /* u16 part count */
    JP_INDEX = 8,          /* u64 record index */
    JP_XFER_LEN = 16,      /* u32 transfer length */
    JP_DATA_LEN = 20,      /* u16 data bytes in this part */
    JP_GENERATION = 22,    /* u48 save generation: the ack that writes this record (stamped
                              at drain; 1 for the first save of the file) */
    JP_CRC = 28,           /* u32 CRC-32C of header (crc zeroed) + 160 data bytes */
};

/* Boot payload field offsets (32 bytes) */
enum {
    JB_BOOT = 0,           /* u64 boot number */
    JB_GENERATION = 8,     /* u64 generation when the boot was queued */
    JB_INCARNATION = 16,   /* u64 file incarnation */
    JB_CREATED_BY = 24,    /* u32 library version of this boot */
    JB_RESERVED = 28,      /* u32 zero */
};

static const uint8_t JOURNAL_MAGIC[8] = {'A', 'O', 'T', 'X', 'J', 'R', 'N', 'L'};

#define JOURNAL_MAX_GENERATION ((1ull << 48) - 1)
#define JOURNAL_LIB_VERSION ((0u << 16) | (1u << 8) | 0u)

typedef struct journal_file_header {
    uint8_t bytes[AOTX_JOURNAL_FILE_HEADER];
} journal_file_header;
AOTX_STATIC_ASSERT(sizeof(journal_file_header) == 64, "file header is 64 bytes");

typedef struct journal_record {
    uint8_t header[AOTX_JOURNAL_PART_HEADER];
    uint8_t data[AOTX_JOURNAL_PART_DATA];
} journal_record;
AOTX_STATIC_ASSERT(sizeof(journal_record) == 192, "a record is 192 bytes");
AOTX_STATIC_ASSERT(JP_CRC + 4 == AOTX_JOURNAL_PART_HEADER, "crc ends the part header");
AOTX_STATIC_ASSERT(JH_CRC + 4 == AOTX_JOURNAL_FILE_HEADER, "crc ends the file header");

static inline void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u48(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 6; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t get_u48(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 5; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t get_u64(const uint8_t *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* Parts a transfer of len bytes needs: max(1, ceil(len / 160)). */
static inline uint64_t journal_parts_for(uint64_t len) {
    return len == 0 ? 1 : (len + AOTX_JOURNAL_PART_DATA - 1) / AOTX_JOURNAL_PART_DATA;
}

/* CRC of a 192-byte record as stored in its crc field. */
uint32_t journal_record_crc(const uint8_t *rec);
/* The CRC of a 64-byte file header (bytes 0..59). */
uint32_t journal_header_crc(const uint8_t *hdr);
/* next = SHA-256(prev || rec) */
void journal_chain(const uint8_t prev[32], const uint8_t *rec, uint8_t next[32]);

/* What aotx_journal_resume() takes from a reader that reached its end. */
typedef struct journal_resume_point {
    uint8_t header[AOTX_JOURNAL_FILE_HEADER];
    uint64_t records;       /* valid records (truncate to these) */
    uint8_t digest[32];     /* digest after them */
    uint8_t prev_digest[32];/* digest before the last of them (checkpoint anchors) */
    uint64_t boot;          /* boot transfers among them */
    uint64_t generation;    /* save generation of the last verified record */
} journal_resume_point;

int journal_reader_resume_point(const aotx_journal_reader *r, journal_resume_point *out);

#endif
