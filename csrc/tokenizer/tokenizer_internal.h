/* tokenizer_internal.h -- the tokenizer's private layout, shared by
 * tokenizer.c (vocabulary, lookups), tokenizer_bpe.c (byte-level map, merge
 * table), tokenizer_pretok.c (byte-level pre-tokenizers), tokenizer_unicode.c
 * (generated Unicode classes) and tokenizer_encode.c (BPE). */
#ifndef AOTX_TOKENIZER_INTERNAL_H
#define AOTX_TOKENIZER_INTERNAL_H

#include "aotx_tokenizer.h"

/* One token's place in the two byte arenas. */
typedef struct tok_entry {
    int64_t piece_off;   /* into pieces[] */
    int64_t bytes_off;   /* into bytes[] */
    int32_t piece_len;
    int32_t bytes_len;
    float score;
    int32_t type;        /* AOTX_TOK_* (0 read as NORMAL) */
} tok_entry;

/* A hash table slot: the id and its piece's hash side by side (one cache line). */
typedef struct tok_slot {
    int32_t id;          /* -1: empty */
    uint32_t hash;
} tok_slot;

/* A piece matched whole before BPE, with its text at hand for the scan. */
typedef struct tok_special {
    const uint8_t *s;    /* into pieces[] */
    int32_t len;
    int32_t id;
    int32_t type;
} tok_special;

/* A merge of the byte-level BPE: pair (left id, right id) -> rank, result. */
typedef struct tok_merge {
    uint64_t key;        /* (uint64_t)left << 32 | right */
    int32_t rank;        /* position in tokenizer.ggml.merges */
    int32_t id;          /* the joined piece; -1: empty slot */
} tok_merge;

/* One code point of a fragment being pre-tokenized. */
typedef struct tok_cp {
    int32_t off;         /* byte offset in the fragment */
    uint32_t cp;         /* code point; 0x110000 + b for a byte b outside valid UTF-8 */
    int32_t cls;         /* AOTX_UNI_* bits (0: none of L, N, S) */
} tok_cp;

enum { AOTX_UNI_L = 1, AOTX_UNI_N = 2, AOTX_UNI_S = 4 };

struct aotx_tokenizer {
    aotx_tokenizer_params p;
    int32_t model;              /* AOTX_TOK_MODEL_* */
    int32_t pre;                /* AOTX_TOK_PRE_* (BPE) */
    int32_t ignore_merges;      /* BPE: a pre-token that is a piece whole is taken as is */
    int32_t n_vocab;
    int32_t max_bytes;          /* largest bytes_len */
    tok_entry *tok;             /* [n_vocab] */
    uint8_t *pieces;            /* [sum piece_len] the vocabulary text, as given */
    uint8_t *bytes;             /* [sum bytes_len] what each token decodes to */
    /* Piece -> id for pieces BPE may produce (normal, user-defined);
     * open addressing, linear probing, -1 empty. */
    tok_slot *table;            /* [table_mask + 1] */
    uint32_t table_mask;
    int32_t byte_id[256];       /* <0xNN> token of each byte, -1 if none */
    /* glue[b]: some BPE-producible piece has byte b right before an inner
     * U+2581, so BPE may merge across a space marker that follows byte b.
     * Everywhere else a space marker starts a word BPE can treat alone. */
    uint8_t glue[256];
    /* Whole-piece matches before BPE (user-defined, control, unknown-type):
     * ids grouped by first byte, longest first within a group. */
    tok_special *special;       /* [n_special] */
    int32_t special_start[257]; /* group of byte b: special[special_start[b] .. special_start[b+1]) */
    /* BPE only.  byte_id[] then holds the token of each byte's byte-level character. */
    tok_merge *merges;          /* [merge_mask + 1] open addressing over key; NULL in SPM mode */
    uint32_t merge_mask;
    int32_t n_merges;
    uint16_t byte_cp[256];      /* BPE: GPT-2's code point of each byte */
};

/* GPT-2's bytes-to-unicode map: byte b <-> code point (b itself for the
 * printable ones, U+0100 + k for the k-th other byte); cp_byte is -1 off the map. */
#define AOTX_BYTE_CP_END 0x144
void aotx_tok_byte_map(uint16_t byte_cp[256], int16_t cp_byte[AOTX_BYTE_CP_END]);

/* The Unicode class of a code point: AOTX_UNI_L, _N, _S or 0 (tokenizer_unicode.c). */
int aotx_uni_class(uint32_t cp);
/* Length of the valid UTF-8 character at s[0..n) (RFC 3629), or 1 for a byte
 * that does not start one. */
int aotx_tok_utf8_len(const uint8_t *s, int64_t n);
/* Code points of s[0..n) into cps[0..count) (cps[count].off = n); returns count. */
int32_t aotx_pretok_decode(const uint8_t *s, int64_t n, tok_cp *cps);
/* End (exclusive, in code points) of the pre-token that starts at k < n. */
int32_t aotx_pretok_next(int32_t pre, const tok_cp *c, int32_t k, int32_t n);
/* The merge of pair (left, right): result id (rank in *rank), or -1. */
int32_t aotx_tok_merge_find(const aotx_tokenizer *t, int32_t left, int32_t right, int32_t *rank);
/* Byte-level setup after the piece table: byte_id[] and the merge table. */
int aotx_tok_bpe_init(aotx_tokenizer *t, int32_t n_merges, const char *const *merges,
                      const int32_t *merge_lens);

uint32_t aotx_tok_hash(const uint8_t *s, int64_t n);
/* Id of a BPE-producible piece spelled s[0..n), or -1. */
int32_t aotx_tok_lookup(const aotx_tokenizer *t, const uint8_t *s, int64_t n, uint32_t h);

#endif
