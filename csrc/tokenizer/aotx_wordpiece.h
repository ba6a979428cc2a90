/* aotx_wordpiece.h -- BERT WordPiece tokenization (the embedding models'
 * tokenizer; docs/embeddings.md, "Tokenization"): BertNormalizer (clean_text,
 * CJK spacing, strip_accents = NFD minus Mn, per-character lowercase),
 * BertPreTokenizer (whitespace, punctuation), greedy longest-match-first
 * WordPiece, and added tokens matched on the raw text first.  The caller
 * (aotx_trio/_wordpiece.py) reads and validates tokenizer.json and hands the
 * vocabulary and flags here; the Unicode data comes from
 * csrc/tokenizer/tokenizer_wordpiece_tables.c (generated).
 */
#ifndef AOTX_WORDPIECE_H
#define AOTX_WORDPIECE_H

#include "aotx.h"

/* CDEF-BEGIN */
typedef struct aotx_wordpiece aotx_wordpiece;

typedef struct aotx_wordpiece_params {
    int32_t n_vocab;
    const char *const *tokens;     /* [n_vocab] UTF-8 pieces, continuations with their prefix */
    const int32_t *token_lens;     /* [n_vocab] bytes */
    const int32_t *ids;            /* [n_vocab] id of each piece (>= 0) */
    const char *prefix;            /* continuing_subword_prefix, e.g. "##" */
    int32_t prefix_len;
    int32_t max_chars;             /* max_input_chars_per_word: a longer word is one unk */
    int32_t unk_id;
    int32_t clean_text, chinese, strip_accents, lowercase;   /* BertNormalizer flags (0/1) */
    int32_t n_added;               /* added tokens matched literally before normalization */
    const char *const *added;      /* [n_added] UTF-8, non-empty */
    const int32_t *added_lens;     /* [n_added] bytes */
    const int32_t *added_ids;      /* [n_added] */
} aotx_wordpiece_params;

/* Copies everything it needs; the caller's arrays may go afterwards. */
int aotx_wordpiece_new(const aotx_wordpiece_params *p, aotx_wordpiece **out);
void aotx_wordpiece_free(aotx_wordpiece *wp);
/* Word-piece ids of UTF-8 `text` (len bytes; no [CLS]/[SEP]): the first `limit`
 * (limit < 0: all) into ids[cap]; *n_ids = their count.  AOTX_E_BUFFER_TOO_SMALL
 * when the count exceeds cap (*n_ids = the count needed, ids holds the first cap).
 * Bytes that are not UTF-8 read as U+FFFD.  The handle is read-only: any number of
 * threads may encode at once; each call allocates its own scratch (tokenization is
 * not on the decode path). */
int aotx_wordpiece_encode(const aotx_wordpiece *wp, const char *text, int64_t len, int64_t limit,
                          int32_t *ids, int64_t cap, int64_t *n_ids);
/* CDEF-END */

#endif
