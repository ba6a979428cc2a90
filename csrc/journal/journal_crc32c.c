/* journal_crc32c.c -- CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected
 * 0x82F63B78, init and final xor 0xFFFFFFFF).  Check value of "123456789" is
 * 0xE3069283.  Slicing-by-8 tables built once (thread-safe via pthread_once). */
#include "aotx_journal.h"

#include <pthread.h>

static uint32_t crc_table[8][256]; /* [slice][byte] */
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int s = 1; s < 8; s++) {
            c = crc_table[0][c & 0xFFu] ^ (c >> 8);
            crc_table[s][n] = c;
        }
    }
}

uint32_t aotx_crc32c(uint32_t crc, const uint8_t *data, size_t len) {
    pthread_once(&crc_once, crc_init);
    uint32_t c = ~crc;
    while (len >= 8) {
        uint32_t lo = c ^ ((uint32_t)data[0] | (uint32_t)data[1] << 8 |
                           (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24);
        uint32_t hi = (uint32_t)data[4] | (uint32_t)data[5] << 8 |
                      (uint32_t)data[6] << 16 | (uint32_t)data[7] << 24;
        c = crc_table[7][lo & 0xFFu] ^ crc_table[6][(lo >> 8) & 0xFFu] ^
            crc_table[5][(lo >> 16) & 0xFFu] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFFu] ^ crc_table[2][(hi >> 8) & 0xFFu] ^
            crc_table[1][(hi >> 16) & 0xFFu] ^ crc_table[0][hi >> 24];
        data += 8;
        len -= 8;
    }
    while (len--) c = crc_table[0][(c ^ *data++) & 0xFFu] ^ (c >> 8);
    return ~c;
}
