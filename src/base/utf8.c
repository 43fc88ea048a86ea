/* utf8.c: UTF-8 repair, Python whitespace and the growable buffer (utf8.h). */
#include "base/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Table 3-7 of the Unicode standard: the second byte's range depends on the
 * lead byte; that is what makes overlongs and surrogates invalid early. */
static bool utf8_start(q35_utf8_state *s, uint8_t c) {
    s->lo = 0x80; s->hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) s->need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        s->need = 3;
        if (c == 0xE0) s->lo = 0xA0;
        if (c == 0xED) s->hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        s->need = 4;
        if (c == 0xF0) s->lo = 0x90;
        if (c == 0xF4) s->hi = 0x8F;
    } else return false;
    s->buf[0] = c;
    s->have = 1;
    return true;
}

size_t q35_utf8_push(q35_utf8_state *s, uint8_t c, char *out) {
    size_t n = 0;
    if (s->have) {
        if (c >= s->lo && c <= s->hi) {
            s->buf[s->have++] = c;
            s->lo = 0x80; s->hi = 0xBF;
            if (s->have < s->need) return 0;
            memcpy(out, s->buf, s->need);
            s->have = 0;
            return s->need;
        }
        /* The held bytes are a maximal subpart: one U+FFFD, then c starts afresh. */
        memcpy(out, REPLACEMENT, 3);
        n = 3;
        s->have = 0;
    }
    if (c < 0x80) {
        out[n] = (char)c;
        return n + 1;
    }
    if (utf8_start(s, c)) return n;
    memcpy(out + n, REPLACEMENT, 3);
    return n + 3;
}

size_t q35_utf8_flush(q35_utf8_state *s, char *out) {
    if (!s->have) return 0;
    s->have = 0;
    memcpy(out, REPLACEMENT, 3);
    return 3;
}

bool q35_utf8_valid(const char *s, size_t n) {
    q35_utf8_state st = {0};
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (st.have) {
            if (c < st.lo || c > st.hi) return false;
            st.have++;
            st.lo = 0x80; st.hi = 0xBF;
            if (st.have == st.need) st.have = 0;
        } else if (c >= 0x80 && !utf8_start(&st, c)) return false;
    }
    return st.have == 0;
}

char *q35_utf8_repair(const char *s, size_t n, size_t *out_len) {
    /* Each input byte yields at most 3 output bytes. */
    char *out = malloc(3 * n + 4);
    if (!out) return NULL;
    q35_utf8_state st = {0};
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c < 0x80 && !st.have) out[k++] = (char)c;
        else k += q35_utf8_push(&st, c, out + k);
    }
    k += q35_utf8_flush(&st, out + k);
    out[k] = 0;
    if (out_len) *out_len = k;
    return out;
}

size_t q35_utf8_next(const char *s, size_t n, uint32_t *cp) {
    const uint8_t *u = (const uint8_t *)s;
    if (u[0] < 0x80 || n < 2) { *cp = u[0]; return 1; }
    if (u[0] < 0xE0) { *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F); return 2; }
    if (u[0] < 0xF0 || n < 4) {
        if (n < 3) { *cp = u[0]; return 1; }
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

size_t q35_utf8_encode(uint32_t cp, char *out) {
    return (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)out);
}

bool q35_py_isspace(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
    return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

static bool buf_reserve(q35_buf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) { b->oom = true; return false; }
    b->data = p;
    b->cap = cap;
    return true;
}

void q35_buf_append(q35_buf *b, const char *s, size_t n) {
    if (!buf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void q35_buf_puts(q35_buf *b, const char *s) { q35_buf_append(b, s, strlen(s)); }
void q35_buf_putc(q35_buf *b, char c) { q35_buf_append(b, &c, 1); }

void q35_buf_printf(q35_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { q35_buf_append(b, tmp, (size_t)n); return; }
    if (!buf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void q35_buf_free(q35_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

char *q35_buf_take(q35_buf *b, size_t *len) {
    if (b->oom) { q35_buf_free(b); return NULL; }
    if (!b->data) q35_buf_append(b, "", 0);
    char *p = b->data;
    if (len) *len = b->len;
    memset(b, 0, sizeof *b);
    return p;
}
