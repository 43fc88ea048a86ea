/* schema_match.c: the recogniser of documents valid for a compiled schema
 * (schema.h), fed byte by byte.
 *
 * A pushdown automaton: each thread is a stack of frames, one per value
 * being read (an object, an array, a string, a number, a literal), the top
 * one consuming the byte. anyOf is followed by splitting a thread into one
 * per alternative when the value starts (those its first byte fits, at most
 * Q35_SCHEMA_THREADS in all: alternatives past that are dropped, which only
 * narrows what is accepted).
 * Every prefix accepted can be completed, so a constrained generation
 * never gets stuck; the compiler refuses schemas with no valid value. */
#include "text/schema_impl.h"

#include <string.h>

enum { V_START = 0 };
enum { OB_OPEN = 1, OB_KEY, OB_COLON, OB_VALUE, OB_AFTER, OB_NEXT };
enum { AR_OPEN = 1, AR_VALUE, AR_AFTER };
enum { ST_IN = 1, ST_ESC };
enum { NU_IN = 1 };
enum { LI_IN = 1 };
enum { DEAD = 2 };

void q35_schema_start(const q35_schema *s, q35_schema_state *st) {
    st->n = 1;
    st->t[0].depth = 1;
    st->t[0].done = 0;
    st->t[0].f[0] = (q35_schema_frame){.node = s->root, .phase = V_START};
}

void q35_schema_copy(q35_schema_state *dst, const q35_schema_state *src) {
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) {
        const q35_schema_thread *a = &src->t[i];
        q35_schema_thread *b = &dst->t[i];
        b->depth = a->depth;
        b->done = a->done;
        memcpy(b->f, a->f, sizeof a->f[0] * a->depth);
    }
}

static bool step(const q35_schema *s, q35_schema_state *st, q35_schema_thread *th, int c);

/* The top value ended: its container goes on. */
static void pop(const q35_schema *s, q35_schema_thread *th) {
    if (--th->depth == 0) { th->done = 1; return; }
    q35_schema_frame *p = &th->f[th->depth - 1];
    const q35_schema_node *d = &s->node[p->node];
    if (d->kind == SK_SEQ) { /* the next part, or the sequence ends too */
        if (++p->a < d->n) th->f[th->depth++] = (q35_schema_frame){.node = d->child[p->a], .phase = V_START};
        else pop(s, th);
        return;
    }
    if (d->kind == SK_OBJECT) { p->phase = OB_AFTER; p->a++; }
    else { p->phase = AR_AFTER; p->b++; }
}

static bool raw_byte(const q35_schema *s, q35_schema_state *st, q35_schema_thread *th, q35_schema_frame *f,
                     const q35_schema_node *d, int c);

static bool push(q35_schema_thread *th, uint16_t node, int space) {
    if (th->depth >= Q35_SCHEMA_DEPTH) return false;
    th->f[th->depth++] = (q35_schema_frame){.node = node, .phase = V_START, .x = (uint8_t)space};
    return true;
}

/* Does some entry in [from, to] of d's strings continue the prefix of
 * entry `cand` (pos bytes) with byte c (c < 0: end there)? Its index, or -1. */
static int match(const q35_schema_node *d, int from, int to, int cand, int pos, int c) {
    const char *pre = d->str[cand];
    for (int j = from; j <= to; j++) {
        if (d->len[j] < (size_t)pos || memcmp(d->str[j], pre, (size_t)pos)) continue;
        if (c < 0 ? d->len[j] == (size_t)pos : d->len[j] > (size_t)pos && (unsigned char)d->str[j][pos] == c) return j;
    }
    return -1;
}

/* A literal frame matched a byte: it ends now when nothing longer can follow. */
static bool literal_advanced(const q35_schema *s, q35_schema_thread *th) {
    q35_schema_frame *f = &th->f[th->depth - 1];
    const q35_schema_node *d = &s->node[f->node];
    bool longer = false;
    for (int j = f->c; j < d->n && !longer; j++)
        longer = d->len[j] > f->b && !memcmp(d->str[j], d->str[f->c], f->b);
    if (!longer) pop(s, th);
    return true;
}

/* The first byte of a value. */
static bool start(const q35_schema *s, q35_schema_state *st, q35_schema_thread *th, int c) {
    q35_schema_frame *f = &th->f[th->depth - 1];
    const q35_schema_node *d = &s->node[f->node];
    switch (d->kind) {
    case SK_OBJECT:
        if (c != '{') return false;
        f->phase = OB_OPEN; f->a = 0;
        return true;
    case SK_ARRAY:
        if (c != '[') return false;
        f->phase = AR_OPEN; f->b = 0;
        return true;
    case SK_STRING:
        if (c != '"') return false;
        f->phase = ST_IN; f->a = 0; f->x = 0; f->b = 0;
        return true;
    case SK_NUMBER:
    case SK_INTEGER:
        if (d->dfa >= 0) { /* bounds: the DFA of the allowed numbers' text */
            uint16_t nx = c < 0x80 ? s->dfa[d->dfa].next[0][c] : Q35_DFA_DEAD;
            if (nx == Q35_DFA_DEAD) return false;
            f->phase = NU_IN; f->b = nx;
            return true;
        }
        if (c != '-' && !(c >= '0' && c <= '9')) return false;
        f->phase = NU_IN;
        f->x = c == '-' ? 0 : c == '0' ? 2 : 1;
        f->a = c != '-';
        return true;
    case SK_LITERAL: {
        int j = match(d, 0, d->n - 1, 0, 0, c);
        if (j < 0) return false;
        f->phase = LI_IN; f->c = (uint16_t)j; f->b = 1;
        return literal_advanced(s, th);
    }
    case SK_SEQ:
        f->phase = 1; f->a = 0;
        return push(th, d->child[0], 0) && step(s, st, th, c);
    case SK_RAW:
        f->phase = 1; f->a = 0; f->b = 0; f->x = 0;
        return raw_byte(s, st, th, f, d, c);
    case SK_ANYOF: {
        q35_schema_thread base = *th;
        for (int k = 1; k < d->n && st->n < Q35_SCHEMA_THREADS; k++) {
            int idx = st->n++;
            q35_schema_thread *nt = &st->t[idx];
            *nt = base;
            nt->f[nt->depth - 1].node = d->child[k];
            if (start(s, st, nt, c)) continue;
            if (st->n == idx + 1) st->n--; /* the slot goes to the next alternative */
            else nt->done = DEAD;
        }
        f->node = d->child[0];
        return start(s, st, th, c);
    }
    }
    return false;
}

/* The UTF-8 lead byte c: how many continuation bytes, and the range of the first. */
static int utf8_lead(int c, int *lo, int *hi) {
    *lo = 0x80; *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 1;
    if (c == 0xE0) { *lo = 0xA0; return 2; }
    if (c == 0xED) { *hi = 0x9F; return 2; }
    if (c >= 0xE1 && c <= 0xEF) return 2;
    if (c == 0xF0) { *lo = 0x90; return 3; }
    if (c == 0xF4) { *hi = 0x8F; return 3; }
    if (c >= 0xF1 && c <= 0xF3) return 3;
    return 0;
}

static bool string_byte(const q35_schema *s, q35_schema_thread *th, q35_schema_frame *f, const q35_schema_node *d, int c) {
    if (f->phase == ST_ESC) {
        if (!c || !strchr("\"\\/bfnrt", c)) return false;
        f->phase = ST_IN;
        f->a++;
        return true;
    }
    if (f->x) { /* inside a multi-byte character */
        if (c < (f->c & 0xFF) || c > (f->c >> 8)) return false;
        f->x--;
        f->c = 0x80 | 0xBF << 8;
        return true;
    }
    bool full = d->hi >= 0 && f->a >= d->hi;
    if (c == '"') {
        if (f->a < d->lo || (d->dfa >= 0 && !s->dfa[d->dfa].accept[f->b])) return false;
        pop(s, th);
        return true;
    }
    if (full || c < 0x20) return false;
    if (d->dfa >= 0) { /* a pattern: no escapes, each character a step of its DFA that can still end within maxLength */
        const q35_schema_dfa *D = &s->dfa[d->dfa];
        uint16_t nx = D->next[f->b][c < 0x80 ? c : Q35_SYM_WIDE];
        if (nx == Q35_DFA_DEAD || (d->hi >= 0 && f->a + 1 + D->dist[nx] > d->hi)) return false;
        if (c >= 0x80) {
            int lo, hi, n = utf8_lead(c, &lo, &hi);
            if (!n) return false;
            f->x = (uint8_t)n;
            f->c = (uint16_t)(lo | hi << 8);
        }
        f->b = nx;
        f->a++;
        return true;
    }
    if (c == '\\') { f->phase = ST_ESC; return true; }
    if (c >= 0x80) {
        int lo, hi, n = utf8_lead(c, &lo, &hi);
        if (!n) return false;
        f->x = (uint8_t)n;
        f->c = (uint16_t)(lo | hi << 8);
    }
    f->a++;
    return true;
}

/* A tool call's string parameter: text up to the "\n" of "\n</parameter>",
 * without '<' or control bytes, whole UTF-8 characters, never "null" in any
 * case (the tool-call parser reads that as null). b: how much of "null" the
 * text is, 5: none of it. */
static bool raw_byte(const q35_schema *s, q35_schema_state *st, q35_schema_thread *th, q35_schema_frame *f,
                     const q35_schema_node *d, int c) {
    if (f->x) {
        if (c < (f->c & 0xFF) || c > (f->c >> 8)) return false;
        f->x--;
        f->c = 0x80 | 0xBF << 8;
        return true;
    }
    if (c == '\n') {
        if (f->a < d->lo || f->b == 4) return false;
        pop(s, th);
        return step(s, st, th, c);
    }
    if (c < 0x20 || c == '<' || (d->hi >= 0 && f->a >= d->hi)) return false;
    if (c >= 0x80) {
        int lo, hi, n = utf8_lead(c, &lo, &hi);
        if (!n) return false;
        f->x = (uint8_t)n;
        f->c = (uint16_t)(lo | hi << 8);
    }
    f->b = f->b < 4 && (c | 0x20) == "null"[f->b] ? f->b + 1 : 5;
    f->a++;
    return true;
}

/* x: 0 after '-', 1 integer digits, 2 after a leading 0, 3 after '.', 4
 * fraction digits, 5 after e, 6 after the exponent's sign, 7 its digits;
 * a: digits in the current part. */
static bool number_byte(const q35_schema *s, q35_schema_state *st, q35_schema_thread *th, q35_schema_frame *f,
                        const q35_schema_node *d, int c) {
    bool digit = c >= '0' && c <= '9', integer = d->kind == SK_INTEGER;
    if (d->dfa >= 0) {
        const q35_schema_dfa *D = &s->dfa[d->dfa];
        uint16_t nx = c >= 0 && c < 0x80 ? D->next[f->b][c] : Q35_DFA_DEAD;
        if (nx != Q35_DFA_DEAD) { f->b = nx; return true; }
        if (!D->accept[f->b]) return false;
        pop(s, th); /* the number ended; c belongs to what follows */
        return step(s, st, th, c);
    }
    switch (f->x) {
    case 0: if (!digit) return false; f->x = c == '0' ? 2 : 1; f->a = 1; return true;
    case 1: if (digit) { if (f->a >= Q35_SCHEMA_INT_DIGITS) return false; f->a++; return true; } break;
    case 2: if (digit) return false; break;
    case 3: if (!digit) return false; f->x = 4; f->a = 1; return true;
    case 4: if (digit) { if (f->a >= Q35_SCHEMA_FRAC_DIGITS) return false; f->a++; return true; } break;
    case 5: if (c == '+' || c == '-') { f->x = 6; return true; } /* fall through */
    case 6: if (!digit) return false; f->x = 7; f->a = 1; return true;
    case 7: if (digit) { if (f->a >= Q35_SCHEMA_EXP_DIGITS) return false; f->a++; return true; } break;
    }
    if (!integer && (f->x == 1 || f->x == 2) && c == '.') { f->x = 3; return true; }
    if (!integer && (f->x == 1 || f->x == 2 || f->x == 4) && (c == 'e' || c == 'E')) { f->x = 5; return true; }
    if (f->x != 1 && f->x != 2 && f->x != 4 && f->x != 7) return false;
    pop(s, th); /* the number ended; c belongs to what follows */
    return step(s, st, th, c);
}

static bool object_byte(const q35_schema *s, q35_schema_thread *th, q35_schema_frame *f, const q35_schema_node *d, int c) {
    switch (f->phase) {
    case OB_OPEN:
        if (c == '}' && d->next_req[0] == d->n) { pop(s, th); return true; }
        if (c != '"' || !d->n) return false;
        f->phase = OB_KEY; f->c = 0; f->b = 0;
        return true;
    case OB_NEXT:
        if (c == ' ' && f->x) { f->x = 0; return true; }
        if (c != '"') return false;
        f->phase = OB_KEY; f->c = f->a; f->b = 0;
        return true;
    case OB_KEY: {
        int lim = d->next_req[f->a] < d->n ? d->next_req[f->a] : d->n - 1;
        /* a '"' inside a key is escaped, so it continues the key after a backslash and ends it otherwise */
        int j = match(d, f->c, lim, f->c, f->b, c);
        if (j < 0 && c == '"' && (j = match(d, f->c, lim, f->c, f->b, -1)) >= 0) {
            f->phase = OB_COLON;
            f->a = (uint16_t)j;
            return true;
        }
        if (j < 0) return false;
        f->c = (uint16_t)j;
        f->b++;
        return true;
    }
    case OB_COLON:
        if (c != ':') return false;
        f->phase = OB_VALUE;
        return push(th, d->child[f->a], 1);
    case OB_AFTER:
        if (c == ',' && f->a < d->n) { f->phase = OB_NEXT; f->x = 1; return true; }
        if (c == '}' && d->next_req[f->a] == d->n) { pop(s, th); return true; }
        return false;
    }
    return false;
}

static bool step(const q35_schema *s, q35_schema_state *st, q35_schema_thread *th, int c) {
    if (th->done) return false;
    q35_schema_frame *f = &th->f[th->depth - 1];
    const q35_schema_node *d = &s->node[f->node];
    if (f->phase == V_START) {
        if (c == ' ' && f->x) { f->x = 0; return true; }
        return start(s, st, th, c);
    }
    switch (d->kind) {
    case SK_OBJECT: return object_byte(s, th, f, d, c);
    case SK_ARRAY:
        if (f->phase == AR_OPEN) {
            if (c == ']' && d->lo == 0) { pop(s, th); return true; }
            if (d->hi == 0) return false;
            f->phase = AR_VALUE;
            return push(th, d->n ? d->child[0] : d->item, 0) && step(s, st, th, c);
        }
        if (f->phase != AR_AFTER) return false;
        if (c == ',' && (d->hi < 0 || f->b < d->hi)) { f->phase = AR_VALUE; return push(th, f->b < d->n ? d->child[f->b] : d->item, 1); }
        if (c == ']' && f->b >= d->lo) { pop(s, th); return true; }
        return false;
    case SK_STRING: return string_byte(s, th, f, d, c);
    case SK_RAW: return raw_byte(s, st, th, f, d, c);
    case SK_NUMBER:
    case SK_INTEGER: return number_byte(s, st, th, f, d, c);
    case SK_LITERAL: {
        int j = match(d, f->c, d->n - 1, f->c, f->b, c);
        if (j >= 0) { f->c = (uint16_t)j; f->b++; return literal_advanced(s, th); }
        if (match(d, f->c, d->n - 1, f->c, f->b, -1) < 0) return false;
        pop(s, th);
        return step(s, st, th, c);
    }
    }
    return false;
}

bool q35_schema_byte(const q35_schema *s, q35_schema_state *st, unsigned char c) {
    int n0 = st->n;
    for (int i = 0; i < n0; i++)
        if (!step(s, st, &st->t[i], c)) st->t[i].done = DEAD;
    int k = 0;
    for (int i = 0; i < st->n; i++) {
        if (st->t[i].done == DEAD) continue;
        if (k != i) {
            st->t[k].depth = st->t[i].depth;
            st->t[k].done = st->t[i].done;
            memcpy(st->t[k].f, st->t[i].f, sizeof st->t[i].f[0] * st->t[i].depth);
        }
        k++;
    }
    st->n = k;
    return k > 0;
}

bool q35_schema_feed(const q35_schema *s, q35_schema_state *st, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!q35_schema_byte(s, st, (unsigned char)p[i])) return false;
    return true;
}

static bool thread_complete(const q35_schema *s, const q35_schema_thread *th) {
    if (th->done == 1) return true;
    if (th->depth != 1) return false;
    const q35_schema_frame *f = &th->f[0];
    const q35_schema_node *d = &s->node[f->node];
    if (f->phase == V_START) return false;
    if ((d->kind == SK_NUMBER || d->kind == SK_INTEGER) && d->dfa >= 0) return s->dfa[d->dfa].accept[f->b];
    if (d->kind == SK_NUMBER || d->kind == SK_INTEGER) return f->x == 1 || f->x == 2 || f->x == 4 || f->x == 7;
    if (d->kind == SK_LITERAL) return match(d, f->c, d->n - 1, f->c, f->b, -1) >= 0;
    return false;
}

bool q35_schema_complete(const q35_schema *s, const q35_schema_state *st) {
    for (int i = 0; i < st->n; i++)
        if (thread_complete(s, &st->t[i])) return true;
    return false;
}

bool q35_schema_closed(const q35_schema *s, const q35_schema_state *st) {
    (void)s;
    for (int i = 0; i < st->n; i++)
        if (st->t[i].done != 1) return false;
    return st->n > 0;
}

int32_t q35_schema_string_room(const q35_schema *s, const q35_schema_state *st, bool *raw) {
    int32_t room = -1;
    for (int i = 0; i < st->n; i++) {
        const q35_schema_thread *th = &st->t[i];
        if (th->done) return -1;
        const q35_schema_frame *f = &th->f[th->depth - 1];
        const q35_schema_node *d = &s->node[f->node];
        bool is_raw = d->kind == SK_RAW;
        if (i == 0) *raw = is_raw;
        if (is_raw != *raw || f->phase == V_START || f->x) return -1;
        if (is_raw ? f->b != 5 : d->kind != SK_STRING || f->phase != ST_IN || d->dfa >= 0) return -1;
        int32_t r = d->hi < 0 ? INT32_MAX : d->hi - f->a;
        if (r > room) room = r;
    }
    return room;
}

bool q35_schema_dfa_string(const q35_schema *s, const q35_schema_state *st, const q35_schema_dfa **dfa, uint16_t *q, int32_t *room) {
    if (st->n != 1 || st->t[0].done) return false;
    const q35_schema_frame *f = &st->t[0].f[st->t[0].depth - 1];
    const q35_schema_node *d = &s->node[f->node];
    if (d->kind != SK_STRING || d->dfa < 0 || f->phase != ST_IN || f->x) return false;
    *dfa = &s->dfa[d->dfa];
    *q = f->b;
    *room = d->hi < 0 ? INT32_MAX : d->hi - f->a;
    return true;
}
