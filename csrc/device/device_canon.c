/* device_canon.c -- the lower layer's byte side (device_internal.h): little-endian
 * and hex helpers, request validation, the canonical operation bytes
 * (docs/formats/device.md, "Canonical operation bytes") and the 128-byte memory row. */
#include "device_internal.h"

#include <math.h>

void dev_le16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
void dev_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
void dev_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
uint16_t dev_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
uint32_t dev_rd32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
uint64_t dev_rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
void dev_hex(const uint8_t *b, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

static uint64_t f64_bits(double v) {
    uint64_t u;
    if (v == 0.0) v = 0.0; /* -0 and +0 encode alike */
    memcpy(&u, &v, 8);
    return u;
}
static double bits_f64(uint64_t u) {
    double v;
    memcpy(&v, &u, 8);
    return v;
}

/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
static bool utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; min = 0x10000; }
        else return false;
        if (n - i < k + 1) return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k + 1;
    }
    return true;
}

bool dev_utf8_valid(const uint8_t *s, size_t n) { return utf8_valid(s, n); }

/* Media control text the device and the model reserve (docs/formats/device.md):
 * the device's media links `<image:HEX>` / `<audio:HEX>` and the Gemma 3
 * media control tokens.  Submitted text holding any of them is refused. */
static const char *const reserved_tokens[] = {
    "<image:", "<audio:", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
    "<start_of_audio>", "<end_of_audio>", "<audio_soft_token>", NULL,
};

static bool holds_reserved_token(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '<') continue;
        for (const char *const *t = reserved_tokens; *t; t++) {
            size_t k = strlen(*t);
            if (k <= n - i && memcmp(s + i, *t, k) == 0) return true;
        }
    }
    return false;
}

int dev_validate_request(const aotx_request *req) {
    if (req->kind < AOTX_KIND_REGISTER || req->kind > AOTX_KIND_PUBLISH) return AOTX_E_KIND_INVALID;
    if (dev_is_zero(req->operation_key, 16)) return AOTX_E_OPERATION_KEY_INVALID;
    switch (req->kind) {
    case AOTX_KIND_SPACE_CREATE:
        if (req->scope > AOTX_SCOPE_INSTANCE) return AOTX_E_SCOPE_INVALID;
        break;
    case AOTX_KIND_MEMBER_SET:
        if (req->rights > 7) return AOTX_E_RIGHTS_INVALID;
        break;
    case AOTX_KIND_INPUT: {
        if (req->n_media > AOTX_MAX_MEDIA) return AOTX_E_MEDIA_INVALID;
        for (uint32_t i = 0; i < req->n_media; i++)
            if (req->media[i].type != AOTX_MEDIA_IMAGE && req->media[i].type != AOTX_MEDIA_AUDIO)
                return AOTX_E_MEDIA_INVALID;
        if (req->text_len > AOTX_MAX_TEXT_BYTES) return AOTX_E_TEXT_INVALID;
        if ((uint64_t)req->text_len + (uint64_t)AOTX_MEDIA_LINK_BYTES * req->n_media >
            AOTX_MAX_TEXT_BYTES)
            return AOTX_E_TEXT_INVALID;
        if (req->text_len == 0 && req->n_media == 0) return AOTX_E_TEXT_INVALID;
        if (!utf8_valid(req->text, req->text_len)) return AOTX_E_TEXT_INVALID;
        if (holds_reserved_token(req->text, req->text_len)) return AOTX_E_RESERVED_TOKEN_INVALID;
        if (req->model_len == 0 || req->model_len > AOTX_MAX_MODEL_NAME) return AOTX_E_MODEL_INVALID;
        for (uint32_t i = 0; i < req->model_len; i++)
            if (req->model[i] < 0x21 || req->model[i] > 0x7E) return AOTX_E_MODEL_INVALID;
        if (req->max_output_tokens == 0 || req->max_output_tokens > 65536)
            return AOTX_E_SAMPLING_INVALID;
        if (!isfinite(req->temperature) || req->temperature < 0.0 || req->temperature > 2.0)
            return AOTX_E_SAMPLING_INVALID;
        if (!isfinite(req->top_p) || !(req->top_p > 0.0) || req->top_p > 1.0)
            return AOTX_E_SAMPLING_INVALID;
        break;
    }
    case AOTX_KIND_CANCEL:
        if (req->target_sequence == 0) return AOTX_E_TARGET_SEQUENCE_INVALID;
        break;
    case AOTX_KIND_RETIRE:
        if (req->retry_floor == 0) return AOTX_E_RETRY_FLOOR_INVALID;
        break;
    case AOTX_KIND_PUBLISH:
        if (req->source_version == 0) return AOTX_E_VERSION_CONFLICT;
        break;
    default:
        break;
    }
    return AOTX_OK;
}

static uint32_t body_len(const aotx_request *req) {
    switch (req->kind) {
    case AOTX_KIND_SPACE_CREATE: return 24;
    case AOTX_KIND_MEMBER_SET: return 40;
    case AOTX_KIND_CONVERSATION_CREATE: return 32;
    case AOTX_KIND_INPUT: return 48 + 33 * req->n_media + req->model_len + req->text_len;
    case AOTX_KIND_CANCEL:
    case AOTX_KIND_RETIRE: return 8;
    case AOTX_KIND_PUBLISH: return 40;
    default: return 0;
    }
}

int aotx_canonical_encode(const aotx_request *req, uint8_t *buf, size_t cap, uint32_t *out_len) {
    if (!req || !out_len) return AOTX_E_INVALID_ARGUMENT;
    int rc = dev_validate_request(req);
    if (rc != AOTX_OK) return rc;
    uint32_t blen = body_len(req);
    uint32_t need = AOTX_CANON_HEADER + blen;
    *out_len = need;
    if (!buf || cap < need) return AOTX_E_BUFFER_TOO_SMALL;
    memset(buf, 0, need);
    buf[0] = 1;
    buf[1] = req->kind;
    dev_le16(buf + 2, (uint16_t)blen);
    memcpy(buf + 8, req->lineage, 16);
    memcpy(buf + 24, req->operation_key, 16);
    dev_le64(buf + 40, req->sequence);
    uint8_t *b = buf + AOTX_CANON_HEADER;
    const uint8_t *id = req->has_id ? req->id : req->operation_key;
    switch (req->kind) {
    case AOTX_KIND_SPACE_CREATE:
        memcpy(b, id, 16);
        b[16] = req->scope;
        break;
    case AOTX_KIND_MEMBER_SET:
        memcpy(b, req->space, 16);
        memcpy(b + 16, req->participant, 16);
        b[32] = req->rights;
        break;
    case AOTX_KIND_CONVERSATION_CREATE:
        memcpy(b, req->space, 16);
        memcpy(b + 16, id, 16);
        break;
    case AOTX_KIND_INPUT: {
        memcpy(b, req->conversation, 16);
        dev_le32(b + 16, req->max_output_tokens);
        dev_le32(b + 20, req->pages);
        dev_le64(b + 24, f64_bits(req->temperature));
        dev_le64(b + 32, f64_bits(req->top_p));
        dev_le16(b + 40, (uint16_t)req->text_len);
        b[42] = (uint8_t)req->model_len;
        b[43] = (uint8_t)req->n_media;
        uint8_t *p = b + 48;
        for (uint32_t i = 0; i < req->n_media; i++, p += 33) {
            p[0] = req->media[i].type;
            memcpy(p + 1, req->media[i].sha256, 32);
        }
        memcpy(p, req->model, req->model_len);
        p += req->model_len;
        memcpy(p, req->text, req->text_len);
        break;
    }
    case AOTX_KIND_CANCEL:
        dev_le64(b, req->target_sequence);
        break;
    case AOTX_KIND_RETIRE:
        dev_le64(b, req->retry_floor);
        break;
    case AOTX_KIND_PUBLISH:
        memcpy(b, req->space, 16);
        memcpy(b + 16, req->object, 16);
        dev_le64(b + 32, req->source_version);
        break;
    default:
        break;
    }
    return AOTX_OK;
}

int aotx_canonical_decode(const uint8_t *buf, size_t len, aotx_request *out) {
    if (!buf || !out || len < AOTX_CANON_HEADER) return AOTX_E_INVALID_ARGUMENT;
    if (buf[0] != 1 || dev_rd32(buf + 4) != 0) return AOTX_E_INVALID_ARGUMENT;
    uint32_t blen = dev_rd16(buf + 2);
    if (AOTX_CANON_HEADER + (size_t)blen != len) return AOTX_E_INVALID_ARGUMENT;
    aotx_request r;
    memset(&r, 0, sizeof r);
    r.kind = buf[1];
    memcpy(r.lineage, buf + 8, 16);
    memcpy(r.operation_key, buf + 24, 16);
    r.sequence = dev_rd64(buf + 40);
    const uint8_t *b = buf + AOTX_CANON_HEADER;
    switch (r.kind) {
    case AOTX_KIND_REGISTER:
        if (blen != 0) return AOTX_E_INVALID_ARGUMENT;
        break;
    case AOTX_KIND_SPACE_CREATE:
        if (blen != 24) return AOTX_E_INVALID_ARGUMENT;
        r.has_id = 1;
        memcpy(r.id, b, 16);
        r.scope = b[16];
        break;
    case AOTX_KIND_MEMBER_SET:
        if (blen != 40) return AOTX_E_INVALID_ARGUMENT;
        memcpy(r.space, b, 16);
        memcpy(r.participant, b + 16, 16);
        r.rights = b[32];
        break;
    case AOTX_KIND_CONVERSATION_CREATE:
        if (blen != 32) return AOTX_E_INVALID_ARGUMENT;
        memcpy(r.space, b, 16);
        r.has_id = 1;
        memcpy(r.id, b + 16, 16);
        break;
    case AOTX_KIND_INPUT: {
        if (blen < 48) return AOTX_E_INVALID_ARGUMENT;
        memcpy(r.conversation, b, 16);
        r.max_output_tokens = dev_rd32(b + 16);
        r.pages = dev_rd32(b + 20);
        r.temperature = bits_f64(dev_rd64(b + 24));
        r.top_p = bits_f64(dev_rd64(b + 32));
        r.text_len = dev_rd16(b + 40);
        r.model_len = b[42];
        r.n_media = b[43];
        if (dev_rd32(b + 44) != 0 || r.n_media > AOTX_MAX_MEDIA ||
            r.text_len > AOTX_MAX_TEXT_BYTES || r.model_len > AOTX_MAX_MODEL_NAME)
            return AOTX_E_INVALID_ARGUMENT;
        if (blen != 48 + 33 * r.n_media + r.model_len + r.text_len) return AOTX_E_INVALID_ARGUMENT;
        const uint8_t *p = b + 48;
        for (uint32_t i = 0; i < r.n_media; i++, p += 33) {
            r.media[i].type = p[0];
            memcpy(r.media[i].sha256, p + 1, 32);
        }
        memcpy(r.model, p, r.model_len);
        p += r.model_len;
        memcpy(r.text, p, r.text_len);
        break;
    }
    case AOTX_KIND_CANCEL:
        if (blen != 8) return AOTX_E_INVALID_ARGUMENT;
        r.target_sequence = dev_rd64(b);
        break;
    case AOTX_KIND_RETIRE:
        if (blen != 8) return AOTX_E_INVALID_ARGUMENT;
        r.retry_floor = dev_rd64(b);
        break;
    case AOTX_KIND_PUBLISH:
        if (blen != 40) return AOTX_E_INVALID_ARGUMENT;
        memcpy(r.space, b, 16);
        memcpy(r.object, b + 16, 16);
        r.source_version = dev_rd64(b + 32);
        break;
    default:
        return AOTX_E_KIND_INVALID;
    }
    int rc = dev_validate_request(&r);
    if (rc != AOTX_OK) return rc;
    /* Reserved bytes must be zero: re-encoding must give the same bytes. */
    uint8_t again[DEV_CANON_MAX];
    uint32_t n = 0;
    if (aotx_canonical_encode(&r, again, sizeof again, &n) != AOTX_OK || n != len ||
        memcmp(again, buf, len) != 0)
        return AOTX_E_INVALID_ARGUMENT;
    *out = r;
    return AOTX_OK;
}

bool dev_is_zero(const uint8_t *b, size_t n) {
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++) acc |= b[i];
    return acc == 0;
}

/* The 128-byte memory row as docs/formats/device.md lays it out (the MEMORY
 * transfer's rows and the checkpoint's, device_checkpoint.c). */
void dev_memory_row_encode(const aotx_memory_row *r, uint8_t *b) {
    memset(b, 0, AOTX_MEMORY_ROW_BYTES);
    memcpy(b, r->object, 16);
    dev_le64(b + 16, r->version);
    b[24] = r->kind;
    b[25] = r->scope;
    b[26] = r->mode;
    b[27] = r->origin;
    dev_le32(b + 28, r->byte_length);
    memcpy(b + 32, r->owner, 16);
    memcpy(b + 48, r->room, 16);
    memcpy(b + 64, r->source, 16);
    memcpy(b + 80, r->actor, 16);
    memcpy(b + 96, r->conversation, 16);
    dev_le64(b + 112, r->admission_number);
    dev_le32(b + 120, r->dim);
}
