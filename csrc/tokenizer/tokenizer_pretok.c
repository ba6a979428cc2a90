/* tokenizer_pretok.c -- the byte-level BPE pre-tokenizers: the text of a
 * fragment cut into pre-tokens exactly as the split regexes of GPT-2,
 * Llama-3 / Qwen2 and SmolLM (digits apart, then GPT-2's) do (leftmost alternative, greedy, with the backtracking
 * of \s+(?!\S) and \s*[\r\n]+ worked out by hand).  docs/tokenizer.md lists
 * the patterns. */
#include "tokenizer_internal.h"

int32_t aotx_pretok_decode(const uint8_t *s, int64_t n, tok_cp *cps) {
    int32_t k = 0;
    for (int64_t i = 0; i < n;) {
        int len = aotx_tok_utf8_len(s + i, n - i);
        uint32_t cp;
        if (len == 1) cp = s[i] < 0x80 ? s[i] : 0x110000u + s[i];
        else if (len == 2) cp = (s[i] & 0x1Fu) << 6 | (s[i + 1] & 0x3Fu);
        else if (len == 3) cp = (s[i] & 0x0Fu) << 12 | (s[i + 1] & 0x3Fu) << 6 | (s[i + 2] & 0x3Fu);
        else
            cp = (s[i] & 0x07u) << 18 | (s[i + 1] & 0x3Fu) << 12 | (s[i + 2] & 0x3Fu) << 6 |
                 (s[i + 3] & 0x3Fu);
        cps[k++] = (tok_cp){(int32_t)i, cp, cp < 0x110000u ? aotx_uni_class(cp) : 0};
        i += len;
    }
    cps[k] = (tok_cp){(int32_t)n, 0, 0};
    return k;
}

/* Scanning helpers: c[k] with k past the end is none of these. */
static uint32_t cp_at(const tok_cp *c, int32_t k, int32_t n) { return k < n ? c[k].cp : 0; }
static int is_cls(const tok_cp *c, int32_t k, int32_t n, int cls) {
    return k < n && (c[k].cls & cls);
}
/* [^\s\p{L}\p{N}] */
static int is_other(const tok_cp *c, int32_t k, int32_t n) { return k < n && c[k].cls == 0; }
static int is_crlf(const tok_cp *c, int32_t k, int32_t n) {
    return k < n && (c[k].cp == '\r' || c[k].cp == '\n');
}
static int32_t run_cls(const tok_cp *c, int32_t k, int32_t n, int cls) {
    while (is_cls(c, k, n, cls)) k++;
    return k;
}
static int32_t run_other(const tok_cp *c, int32_t k, int32_t n) {
    while (is_other(c, k, n)) k++;
    return k;
}

/* 's|'t|'re|'ve|'m|'ll|'d at k (fold: case-insensitive, with U+017F long s
 * folding to s as the regex engines do): its length in code points, or 0. */
static int32_t contraction(const tok_cp *c, int32_t k, int32_t n, int fold) {
    if (cp_at(c, k, n) != '\'') return 0;
    uint32_t a = cp_at(c, k + 1, n), b = cp_at(c, k + 2, n);
    if (fold) {
        if (a >= 'A' && a <= 'Z') a += 32;
        if (b >= 'A' && b <= 'Z') b += 32;
        if (a == 0x17F) a = 's';
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at k (c[k] is whitespace): a run followed by a non-space gives
 * that non-space its last whitespace character, unless the run is one long. */
static int32_t spaces(const tok_cp *c, int32_t k, int32_t n) {
    int32_t e = run_cls(c, k, n, AOTX_UNI_S);
    return (e < n && e - k >= 2) ? e - 1 : e;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int32_t next_gpt2(const tok_cp *c, int32_t k, int32_t n) {
    int32_t m = contraction(c, k, n, 0);
    if (m) return k + m;
    int32_t j = cp_at(c, k, n) == ' ' ? k + 1 : k;
    if (is_cls(c, j, n, AOTX_UNI_L)) return run_cls(c, j, n, AOTX_UNI_L);
    if (is_cls(c, j, n, AOTX_UNI_N)) return run_cls(c, j, n, AOTX_UNI_N);
    if (is_other(c, j, n)) return run_other(c, j, n);
    if (is_cls(c, k, n, AOTX_UNI_S)) return spaces(c, k, n);
    return k + 1;   /* not reached: every code point is L, N, S or other */
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (D: 3 Llama-3, 1 Qwen2) */
static int32_t next_llama3(const tok_cp *c, int32_t k, int32_t n, int32_t digits) {
    int32_t m = contraction(c, k, n, 1);
    if (m) return k + m;
    if (is_cls(c, k, n, AOTX_UNI_L)) return run_cls(c, k, n, AOTX_UNI_L);
    if (!is_crlf(c, k, n) && !is_cls(c, k, n, AOTX_UNI_L | AOTX_UNI_N) &&
        is_cls(c, k + 1, n, AOTX_UNI_L))
        return run_cls(c, k + 1, n, AOTX_UNI_L);
    if (is_cls(c, k, n, AOTX_UNI_N)) {
        int32_t e = k;
        while (e - k < digits && is_cls(c, e, n, AOTX_UNI_N)) e++;
        return e;
    }
    int32_t j = (cp_at(c, k, n) == ' ' && is_other(c, k + 1, n)) ? k + 1 : k;
    if (is_other(c, j, n)) {
        int32_t e = run_other(c, j, n);
        while (is_crlf(c, e, n)) e++;
        return e;
    }
    if (is_cls(c, k, n, AOTX_UNI_S)) {
        int32_t e = run_cls(c, k, n, AOTX_UNI_S);
        for (int32_t p = e - 1; p >= k; p--)   /* \s*[\r\n]+: up to the last \r or \n */
            if (is_crlf(c, p, n)) return p + 1;
        return spaces(c, k, n);
    }
    return k + 1;
}

/* SmolLM's: every \p{N} its own pre-token (a Digits split with individual digits),
 * then the GPT-2 pattern inside the pieces between them.  Scanned in place: GPT-2's
 * pre-token at k, cut before a digit it would take ( ?\p{N}+), and a whitespace run
 * whose last character GPT-2 left for what follows keeps it when a digit follows (at
 * the end of a piece \s+(?!\S) takes the whole run). */
static int32_t next_smollm(const tok_cp *c, int32_t k, int32_t n) {
    if (is_cls(c, k, n, AOTX_UNI_N)) return k + 1;
    int32_t e = next_gpt2(c, k, n);
    for (int32_t p = k + 1; p < e; p++)
        if (is_cls(c, p, n, AOTX_UNI_N)) return p;
    if (run_cls(c, k, n, AOTX_UNI_S) == e + 1 && is_cls(c, e + 1, n, AOTX_UNI_N)) return e + 1;
    return e;
}

int32_t aotx_pretok_next(int32_t pre, const tok_cp *c, int32_t k, int32_t n) {
    if (pre == AOTX_TOK_PRE_LLAMA3) return next_llama3(c, k, n, 3);
    if (pre == AOTX_TOK_PRE_QWEN2) return next_llama3(c, k, n, 1);
    if (pre == AOTX_TOK_PRE_SMOLLM) return next_smollm(c, k, n);
    return next_gpt2(c, k, n);
}
