/* aotx_tokenizer.h -- SentencePiece-style tokenizer built from a GGUF vocabulary
 * (tokenizer.ggml.tokens / scores / token_type, byte fallback <0xNN>, the
 * U+2581 space marker), and an incremental detokenizer that emits exact bytes.
 * The model loader hands it the arrays; it owns copies.
 */
#ifndef AOTX_TOKENIZER_H
#define AOTX_TOKENIZER_H

#include "aotx.h"

/* CDEF-BEGIN */
enum {
    /* token_type values as GGUF stores them */
    AOTX_TOK_NORMAL = 1, AOTX_TOK_UNKNOWN = 2, AOTX_TOK_CONTROL = 3,
    AOTX_TOK_USER_DEFINED = 4, AOTX_TOK_UNUSED = 5, AOTX_TOK_BYTE = 6,

    AOTX_E_TOKENIZER_VOCAB = -601,   /* vocabulary malformed */
    AOTX_E_TOKENIZER_TOKEN = -602    /* token id out of range */
};

typedef struct aotx_tokenizer aotx_tokenizer;

typedef struct aotx_tokenizer_params {
    int32_t bos_id, eos_id, unk_id, pad_id;   /* -1 if absent */
    int32_t add_bos;                          /* tokenizer.ggml.add_bos_token */
    int32_t add_space_prefix;                 /* tokenizer.ggml.add_space_prefix */
} aotx_tokenizer_params;

/* tokens: n_vocab UTF-8 strings (lengths in token_lens); scores and types may be NULL. */
int aotx_tokenizer_new(const aotx_tokenizer_params *p, int32_t n_vocab, const char *const *tokens,
                       const int32_t *token_lens, const float *scores, const int32_t *types,
                       aotx_tokenizer **out);
void aotx_tokenizer_free(aotx_tokenizer *t);
int32_t aotx_tokenizer_n_vocab(const aotx_tokenizer *t);
/* Encode UTF-8 text; parse_special: control/user-defined token texts in the
 * input become their ids. Returns the token count, or -needed if cap is too small. */
int64_t aotx_tokenize(const aotx_tokenizer *t, const char *text, int64_t len, int add_bos,
                      int parse_special, int32_t *out, int64_t cap);
/* The bytes one token stands for (byte tokens give their byte, the space marker a space). */
int64_t aotx_token_bytes(const aotx_tokenizer *t, int32_t id, uint8_t *out, int64_t cap);

/* Incremental detokenizer: push one token, get the bytes that are now complete
 * UTF-8 (an incomplete multi-byte character is held until it completes). */
typedef struct aotx_detok { uint8_t held[8]; int32_t n_held; int32_t started; } aotx_detok;
void aotx_detok_init(aotx_detok *d);
int64_t aotx_detok_push(const aotx_tokenizer *t, aotx_detok *d, int32_t id, uint8_t *out, int64_t cap);
/* Whatever is still held (invalid UTF-8 at end of stream comes out as is). */
int64_t aotx_detok_flush(aotx_detok *d, uint8_t *out, int64_t cap);
/* CDEF-END */

#endif
