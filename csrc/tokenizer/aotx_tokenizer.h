/* aotx_tokenizer.h -- the tokenizer built from a GGUF vocabulary, in one of two
 * modes chosen by tokenizer.ggml.model: "llama" (SentencePiece-style BPE by
 * score: tokenizer.ggml.tokens / scores / token_type, byte fallback <0xNN>,
 * the U+2581 space marker) or "gpt2" (byte-level BPE by merge rank:
 * tokenizer.ggml.merges, pre-tokenization by tokenizer.ggml.pre), and an
 * incremental detokenizer that emits exact bytes.
 * The model loader hands it the arrays; it owns copies.  docs/tokenizer.md
 * describes the algorithm and every decision (control tokens decode to
 * nothing, which pieces BPE may produce, add_space_prefix).
 *
 * A tokenizer is immutable after aotx_tokenizer_new(): any number of threads
 * may tokenize and detokenize with one handle at once (each with its own
 * aotx_detok).  aotx_tokenize allocates working memory per call (prompt
 * time); aotx_token_piece, aotx_token_bytes and the detokenizer never allocate.
 *
 * Return conventions.  Code-returning calls (int) follow aotx.h.  The
 * int64_t-returning buffer fillers return the count written, or -needed when
 * cap is too small (nothing written); on any other failure (NULL handle, id
 * out of range, out of memory) they return AOTX_TOK_FAILED (INT64_MIN) and
 * their *_ex twin gives the code.
 */
#ifndef AOTX_TOKENIZER_H
#define AOTX_TOKENIZER_H

#include "aotx.h"

#define AOTX_TOK_FAILED INT64_MIN

/* CDEF-BEGIN */
enum {
    /* token_type values as GGUF stores them (0, "undefined", is read as normal) */
    AOTX_TOK_NORMAL = 1, AOTX_TOK_UNKNOWN = 2, AOTX_TOK_CONTROL = 3,
    AOTX_TOK_USER_DEFINED = 4, AOTX_TOK_UNUSED = 5, AOTX_TOK_BYTE = 6,

    AOTX_E_TOKENIZER_VOCAB = -601,   /* vocabulary malformed (a NULL piece, a bad byte piece) */
    AOTX_E_TOKENIZER_TOKEN = -602,   /* token id out of range */
    AOTX_E_TOKENIZER_TYPE = -603,    /* a token_type value outside 0..6 */
    AOTX_E_TOKENIZER_SPECIAL = -604, /* bos/eos/unk/pad id outside the vocabulary */
    AOTX_E_TOKENIZER_NO_BOS = -605,  /* add_bos asked for but the vocabulary has no bos id */
    AOTX_E_TOKENIZER_NO_FALLBACK = -606, /* a byte has no <0xNN> token and there is no unk id */
    AOTX_E_TOKENIZER_MODEL = -607,   /* tokenizer.ggml.model is neither "llama" nor "gpt2" */
    AOTX_E_TOKENIZER_PRE = -608,     /* tokenizer.ggml.pre names no pre-tokenizer we have */
    AOTX_E_TOKENIZER_MERGES = -609,  /* a merge is not "left right" over vocabulary pieces */

    /* tokenizer modes (tokenizer.ggml.model) */
    AOTX_TOK_MODEL_SPM = 0,          /* "llama": SentencePiece-style, scores */
    AOTX_TOK_MODEL_BPE = 1,          /* "gpt2": byte-level BPE, merge ranks */
    /* byte-level pre-tokenizers (tokenizer.ggml.pre) */
    AOTX_TOK_PRE_GPT2 = 0,           /* "gpt2", "default": GPT-2's split pattern */
    AOTX_TOK_PRE_LLAMA3 = 1,         /* "llama-bpe", "llama3": Llama-3's, \p{N}{1,3}, ignore_merges */
    AOTX_TOK_PRE_QWEN2 = 2,          /* "qwen2": Llama-3's with single digits */
    AOTX_TOK_PRE_SMOLLM = 3          /* "smollm": every digit alone, then GPT-2's */
};

typedef struct aotx_tokenizer aotx_tokenizer;

typedef struct aotx_tokenizer_params {
    int32_t bos_id, eos_id, unk_id, pad_id;   /* -1 if absent */
    int32_t add_bos;                          /* tokenizer.ggml.add_bos_token */
    int32_t add_space_prefix;                 /* tokenizer.ggml.add_space_prefix */
} aotx_tokenizer_params;

/* tokens: n_vocab UTF-8 strings (lengths in token_lens; token_lens NULL: each
 * is NUL-terminated); scores and types may be NULL (scores 0; types: a piece
 * spelled <0xNN> is a byte token, every other piece normal). */
int aotx_tokenizer_new(const aotx_tokenizer_params *p, int32_t n_vocab, const char *const *tokens,
                       const int32_t *token_lens, const float *scores, const int32_t *types,
                       aotx_tokenizer **out);
/* The same from one blob: piece i is blob[offsets[i] .. offsets[i+1]) (n_vocab+1 offsets). */
int aotx_tokenizer_new_packed(const aotx_tokenizer_params *p, int32_t n_vocab,
                              const uint8_t *blob, const int64_t *offsets, const float *scores,
                              const int32_t *types, aotx_tokenizer **out);
/* Byte-level BPE ("gpt2" vocabularies).  pre: an AOTX_TOK_PRE_* value (see
 * aotx_tokenizer_pre_parse); tokens as for aotx_tokenizer_new (byte-level
 * strings; types NULL: all normal); merges: n_merges strings "left right"
 * (merge_lens NULL: NUL-terminated), rank = position, each half and their
 * join a vocabulary piece (else AOTX_E_TOKENIZER_MERGES).  add_space_prefix
 * puts a space before the text that starts the input, as in SPM mode. */
int aotx_tokenizer_new_bpe(const aotx_tokenizer_params *p, int32_t pre, int32_t n_vocab,
                           const char *const *tokens, const int32_t *token_lens,
                           const int32_t *types, int32_t n_merges, const char *const *merges,
                           const int32_t *merge_lens, aotx_tokenizer **out);
/* The same from blobs: piece i is blob[offsets[i] .. offsets[i+1]), merge j is
 * merge_blob[merge_offsets[j] .. merge_offsets[j+1]). */
int aotx_tokenizer_new_bpe_packed(const aotx_tokenizer_params *p, int32_t pre, int32_t n_vocab,
                                  const uint8_t *blob, const int64_t *offsets,
                                  const int32_t *types, int32_t n_merges,
                                  const uint8_t *merge_blob, const int64_t *merge_offsets,
                                  aotx_tokenizer **out);
/* tokenizer.ggml.model name -> AOTX_TOK_MODEL_* ("llama", "gpt2"; name NULL
 * means "llama"), else AOTX_E_TOKENIZER_MODEL. */
int aotx_tokenizer_model_parse(const char *name, int64_t len, int32_t *model);
/* tokenizer.ggml.pre name -> AOTX_TOK_PRE_* ("default", "gpt2", "llama-bpe",
 * "llama3", "qwen2", "smollm"; name NULL means "default"), else AOTX_E_TOKENIZER_PRE. */
int aotx_tokenizer_pre_parse(const char *name, int64_t len, int32_t *pre);
/* The mode (AOTX_TOK_MODEL_*) and pre-tokenizer (AOTX_TOK_PRE_*, BPE only) of t. */
int32_t aotx_tokenizer_model(const aotx_tokenizer *t);
int32_t aotx_tokenizer_pre(const aotx_tokenizer *t);
void aotx_tokenizer_free(aotx_tokenizer *t);
int32_t aotx_tokenizer_n_vocab(const aotx_tokenizer *t);
/* The parameters the tokenizer was built with. */
void aotx_tokenizer_params_get(const aotx_tokenizer *t, aotx_tokenizer_params *out);
/* The largest aotx_token_bytes length of any token (size detokenizer buffers
 * as this + 4 and aotx_detok_push never answers -needed). */
int32_t aotx_tokenizer_max_token_bytes(const aotx_tokenizer *t);
/* token_type of id, or AOTX_E_TOKENIZER_TOKEN. */
int aotx_token_type(const aotx_tokenizer *t, int32_t id);

/* Encode UTF-8 text (any bytes: invalid UTF-8 goes to byte tokens);
 * parse_special: control (and unknown-type) token texts in the input become
 * their ids; user-defined token texts always do.  Returns the token count, or
 * -needed if cap is too small, or AOTX_TOK_FAILED. */
int64_t aotx_tokenize(const aotx_tokenizer *t, const char *text, int64_t len, int add_bos,
                      int parse_special, int32_t *out, int64_t cap);
/* The same returning a code: 0 (*n_out = count), AOTX_E_BUFFER_TOO_SMALL
 * (*n_out = needed, nothing written), AOTX_E_TOKENIZER_NO_BOS,
 * AOTX_E_INVALID_ARGUMENT, AOTX_E_NOMEM. */
int aotx_tokenize_ex(const aotx_tokenizer *t, const char *text, int64_t len, int add_bos,
                     int parse_special, int32_t *out, int64_t cap, int64_t *n_out);

/* The bytes one token stands for (byte tokens give their byte, the space
 * marker a space, control tokens nothing, unknown-type tokens their text). */
int64_t aotx_token_bytes(const aotx_tokenizer *t, int32_t id, uint8_t *out, int64_t cap);
/* Zero-copy: *bytes points at those bytes inside the tokenizer (valid until
 * free); 0 or AOTX_E_TOKENIZER_TOKEN. */
int aotx_token_bytes_ref(const aotx_tokenizer *t, int32_t id, const uint8_t **bytes, int32_t *len);
/* The raw vocabulary piece (as GGUF spells it: "▁the", "<0x0A>", "<bos>"). */
int aotx_token_piece(const aotx_tokenizer *t, int32_t id, const uint8_t **bytes, int32_t *len);

/* Incremental detokenizer: push one token, get the bytes that are now complete
 * UTF-8 (an incomplete multi-byte character is held until it completes; a byte
 * that can never start or continue a valid character is passed through at
 * once, so the concatenation of all outputs is always exact). */
typedef struct aotx_detok { uint8_t held[8]; int32_t n_held; int32_t started; } aotx_detok;
void aotx_detok_init(aotx_detok *d);
int64_t aotx_detok_push(const aotx_tokenizer *t, aotx_detok *d, int32_t id, uint8_t *out, int64_t cap);
/* The same returning a code: 0 (*n_out = count), AOTX_E_BUFFER_TOO_SMALL
 * (*n_out = needed, d unchanged), AOTX_E_TOKENIZER_TOKEN, AOTX_E_INVALID_ARGUMENT. */
int aotx_detok_push_ex(const aotx_tokenizer *t, aotx_detok *d, int32_t id, uint8_t *out,
                       int64_t cap, int64_t *n_out);
/* Whatever is still held (invalid UTF-8 at end of stream comes out as is);
 * d is reset for a new stream.  At most 3 bytes. */
int64_t aotx_detok_flush(aotx_detok *d, uint8_t *out, int64_t cap);
/* CDEF-END */

#endif
