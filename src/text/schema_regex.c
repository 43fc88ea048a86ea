/* schema_regex.c: the regular expressions of a schema (`pattern`, `format`,
 * and the numeric ranges of minimum / maximum) compiled into DFAs over the
 * characters of a JSON string (schema_impl.h), which schema_match.c runs
 * byte by byte.
 *
 * The subset of ECMA-262 accepted: literal ASCII characters; `.`; classes
 * [...] and [^...] with ranges; \d \w \s \D \W \S; escaped punctuation and
 * \t \n \r \f \v \uXXXX (ASCII); groups ( ) and (?: ); alternation |;
 * quantifiers * + ? {n} {n,} {n,m} (n, m <= 64; lazy forms read the same,
 * as they match the same strings); ^ only at the start and $ only at the
 * end. Without ^ (or $) any text may come before (or after) a match, as
 * JSON Schema's unanchored patterns allow. Refused with a message: back
 * references, lookaround, \b, \p, named groups, anchors elsewhere, literal
 * non-ASCII characters, and patterns over NFA_MAX NFA or DFA_MAX DFA states.
 *
 * The alphabet is the 128 ASCII bytes and one symbol (SYM_WIDE) for any
 * multi-byte UTF-8 character, which `.` includes and negated classes leave
 * out (so every string produced matches under ECMA-262 and Python's re
 * alike). The characters a JSON string would have to escape ('"', '\' and
 * the control bytes) are never produced: they are removed from every edge.
 * States that cannot reach an accepting one are removed (DEAD), so every
 * prefix the DFA accepts can be completed; dist[] is each state's shortest
 * way to acceptance, for maxLength. */
#include "text/schema_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NFA_MAX 4096
#define DFA_MAX 2048
#define REP_MAX 64
#define REGEX_WORK (1 << 24) /* NFA states visited building all of a schema's DFAs */
#define SET_WORDS 3 /* 129 symbols */
#define NFA_WORDS (NFA_MAX / 64)

typedef struct nstate {
    uint64_t set[SET_WORDS]; /* the symbols of the edge to `to`, when to >= 0 */
    int32_t to;
    int32_t eps[2];
} nstate;

typedef struct rx {
    const char *p;           /* the pattern */
    size_t i, n;
    nstate *st;
    int32_t n_st;
    char *msg;
    size_t msg_size;
    int depth;
    uint64_t spare[NFA_WORDS];
} rx;

typedef struct frag { int32_t s, e; } frag;

static int rx_fail(rx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rx_fail(rx *r, const char *fmt, ...) {
    if (!r->msg[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, r->msg_size, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int32_t nstate_new(rx *r) {
    if (r->n_st >= NFA_MAX) return rx_fail(r, "the pattern needs more than %d automaton states", NFA_MAX);
    nstate *s = &r->st[r->n_st];
    memset(s, 0, sizeof *s);
    s->to = s->eps[0] = s->eps[1] = -1;
    return r->n_st++;
}

static void eps(rx *r, int32_t from, int32_t to) {
    nstate *s = &r->st[from];
    s->eps[s->eps[0] < 0 ? 0 : 1] = to;
}

static void set_add(uint64_t *set, int c) { set[c >> 6] |= 1ull << (c & 63); }
static bool set_has(const uint64_t *set, int c) { return set[c >> 6] >> (c & 63) & 1; }

/* The characters a produced string may hold: printable ASCII but '"' and '\', DEL, and wide ones. */
static void set_writable(uint64_t *set) {
    for (int c = 0; c <= Q35_SYM_WIDE; c++)
        if (!(c < 0x20 || c == '"' || c == '\\')) set_add(set, c);
}

/* Two new states, start and end, for a construct to join. */
static frag frag_new(rx *r) {
    frag f = {nstate_new(r), -1};
    if (f.s >= 0) f.e = nstate_new(r);
    return f.e >= 0 ? f : (frag){-1, -1};
}

static frag frag_set(rx *r, const uint64_t *set) {
    frag f = frag_new(r);
    if (f.s < 0) return f;
    uint64_t w[SET_WORDS] = {0};
    set_writable(w);
    for (int k = 0; k < SET_WORDS; k++) r->st[f.s].set[k] = set[k] & w[k];
    r->st[f.s].to = f.e;
    return f;
}

static frag frag_empty(rx *r) {
    frag f = frag_new(r);
    if (f.s >= 0) eps(r, f.s, f.e);
    return f;
}

static frag frag_cat(rx *r, frag a, frag b) {
    if (a.s < 0 || b.s < 0) return (frag){-1, -1};
    eps(r, a.e, b.s);
    return (frag){a.s, b.e};
}

/* a | b */
static frag frag_alt(rx *r, frag a, frag b) {
    frag f = a.s >= 0 && b.s >= 0 ? frag_new(r) : (frag){-1, -1};
    if (f.s < 0) return f;
    eps(r, f.s, a.s), eps(r, f.s, b.s);
    eps(r, a.e, f.e), eps(r, b.e, f.e);
    return f;
}

/* a* : a, or nothing, or a again */
static frag frag_star(rx *r, frag a) {
    frag f = a.s >= 0 ? frag_new(r) : a;
    if (f.s < 0) return f;
    eps(r, f.s, a.s), eps(r, f.s, f.e);
    eps(r, a.e, a.s), eps(r, a.e, f.e);
    return f;
}

/* \d \w \s and their negations into set; false when c is not one of them. */
static bool class_escape(int c, uint64_t *set) {
    uint64_t t[SET_WORDS] = {0};
    int lc = c | 0x20;
    if (lc == 'd') for (int x = '0'; x <= '9'; x++) set_add(t, x);
    else if (lc == 'w') {
        for (int x = 0; x < 128; x++)
            if ((x >= '0' && x <= '9') || (x >= 'a' && x <= 'z') || (x >= 'A' && x <= 'Z') || x == '_') set_add(t, x);
    } else if (lc == 's') { const char *sp = " \t\n\r\f\v"; for (; *sp; sp++) set_add(t, *sp); }
    else return false;
    bool neg = c != lc; /* \D \W \S: ASCII only, see the header */
    for (int x = 0; x < 128; x++)
        if (set_has(t, x) != neg) set_add(set, x);
    return true;
}

static int hexval(int c) { return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1; }

/* One escaped character after '\' (the class escapes handled by the caller): its code, or -1. */
static int escaped_char(rx *r) {
    if (r->i >= r->n) return rx_fail(r, "the pattern ends with a lone backslash");
    int c = (unsigned char)r->p[r->i++];
    switch (c) {
    case 't': return '\t';
    case 'n': return '\n';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'u': {
        int v = 0;
        for (int k = 0; k < 4; k++) {
            int h = r->i < r->n ? hexval((unsigned char)r->p[r->i++]) : -1;
            if (h < 0) return rx_fail(r, "'\\u' needs four hex digits");
            v = v * 16 + h;
        }
        if (v >= 0x80) return rx_fail(r, "non-ASCII characters in a pattern are not supported");
        return v;
    }
    }
    if (c < 0x80 && strchr("^$\\.*+?()[]{}|/-,:=!<>#&~'\"@%;_ `", c)) return c;
    return rx_fail(r, "the escape '\\%c' is not supported in a pattern", c);
}

static int literal_byte(rx *r, int c) {
    if (c >= 0x80) return rx_fail(r, "non-ASCII characters in a pattern are not supported");
    return c;
}

static frag parse_class(rx *r) {
    uint64_t set[SET_WORDS] = {0};
    bool neg = r->i < r->n && r->p[r->i] == '^';
    if (neg) r->i++;
    bool first = true;
    for (;;) {
        if (r->i >= r->n) return rx_fail(r, "a '[' is not closed"), (frag){-1, -1};
        int c = (unsigned char)r->p[r->i++];
        if (c == ']' && !first) break;
        first = false;
        if (c == '\\' && r->i < r->n && class_escape((unsigned char)r->p[r->i], set)) { r->i++; continue; }
        int lo = c == '\\' ? escaped_char(r) : literal_byte(r, c);
        if (lo < 0) return (frag){-1, -1};
        int hi = lo;
        if (r->i + 1 < r->n && r->p[r->i] == '-' && r->p[r->i + 1] != ']') {
            r->i++;
            int d = (unsigned char)r->p[r->i++];
            if (d == '\\' && r->i < r->n && strchr("dwsDWS", r->p[r->i])) return rx_fail(r, "a range ends with a class"), (frag){-1, -1};
            hi = d == '\\' ? escaped_char(r) : literal_byte(r, d);
            if (hi < 0) return (frag){-1, -1};
            if (hi < lo) return rx_fail(r, "the range '%c-%c' is out of order", lo, hi), (frag){-1, -1};
        }
        for (int x = lo; x <= hi; x++) set_add(set, x);
    }
    if (neg) { /* ASCII only: see the header */
        uint64_t t[SET_WORDS] = {0};
        for (int x = 0; x < 128; x++)
            if (!set_has(set, x)) set_add(t, x);
        memcpy(set, t, sizeof t);
    }
    return frag_set(r, set);
}

static frag parse_alt(rx *r);

static frag parse_atom(rx *r) {
    uint64_t set[SET_WORDS] = {0};
    int c = (unsigned char)r->p[r->i++];
    switch (c) {
    case '(':
        if (r->i < r->n && r->p[r->i] == '?') {
            if (r->i + 1 < r->n && r->p[r->i + 1] == ':') r->i += 2;
            else return rx_fail(r, "lookaround and named groups are not supported in a pattern"), (frag){-1, -1};
        }
        if (++r->depth > 32) return rx_fail(r, "the pattern nests more than 32 groups"), (frag){-1, -1};
        frag f = parse_alt(r);
        r->depth--;
        if (f.s < 0) return f;
        if (r->i >= r->n || r->p[r->i] != ')') return rx_fail(r, "a '(' is not closed"), (frag){-1, -1};
        r->i++;
        return f;
    case '[': return parse_class(r);
    case '.':
        for (int x = 0; x <= Q35_SYM_WIDE; x++)
            if (x != '\n' && x != '\r') set_add(set, x);
        return frag_set(r, set);
    case '\\':
        if (r->i < r->n && class_escape((unsigned char)r->p[r->i], set)) { r->i++; return frag_set(r, set); }
        if (r->i < r->n && (r->p[r->i] == 'b' || r->p[r->i] == 'B' || (r->p[r->i] >= '0' && r->p[r->i] <= '9') || r->p[r->i] == 'p' ||
                            r->p[r->i] == 'P' || r->p[r->i] == 'k'))
            return rx_fail(r, "the escape '\\%c' is not supported in a pattern", r->p[r->i]), (frag){-1, -1};
        c = escaped_char(r);
        break;
    case '^': case '$':
        return rx_fail(r, "'%c' is supported only at the pattern's start (^) or end ($)", c), (frag){-1, -1};
    case '*': case '+': case '?': case '{':
        return rx_fail(r, "'%c' has nothing to repeat", c), (frag){-1, -1};
    case ')':
        return rx_fail(r, "an unmatched ')'"), (frag){-1, -1};
    default:
        c = literal_byte(r, c);
    }
    if (c < 0) return (frag){-1, -1};
    set_add(set, c);
    return frag_set(r, set);
}

/* "{n}", "{n,}" or "{n,m}" at r->i (after the '{'); false when it is not one (a literal '{'). */
static bool parse_count(rx *r, int *lo, int *hi) {
    size_t i = r->i;
    int a = 0, b = -1, digits = 0;
    while (i < r->n && r->p[i] >= '0' && r->p[i] <= '9' && digits < 6) a = a * 10 + (r->p[i++] - '0'), digits++;
    if (!digits) return false;
    if (i < r->n && r->p[i] == ',') {
        i++;
        digits = 0;
        int m = 0;
        while (i < r->n && r->p[i] >= '0' && r->p[i] <= '9' && digits < 6) m = m * 10 + (r->p[i++] - '0'), digits++;
        b = digits ? m : -1;
    } else b = a;
    if (i >= r->n || r->p[i] != '}') return false;
    r->i = i + 1;
    *lo = a;
    *hi = b;
    return true;
}

/* An atom and its quantifier: a repeated atom is parsed again for each copy. */
static frag parse_piece(rx *r) {
    size_t at = r->i;
    frag f = parse_atom(r);
    if (f.s < 0 || r->i >= r->n) return f;
    int lo, hi, c = r->p[r->i];
    if (c == '*') { lo = 0; hi = -1; r->i++; }
    else if (c == '+') { lo = 1; hi = -1; r->i++; }
    else if (c == '?') { lo = 0; hi = 1; r->i++; }
    else if (c == '{') {
        r->i++;
        if (!parse_count(r, &lo, &hi)) { r->i--; return rx_fail(r, "a '{' that is not a count {n}, {n,} or {n,m}"), (frag){-1, -1}; }
        if (lo > REP_MAX || hi > REP_MAX) return rx_fail(r, "a count above %d in a pattern is not supported", REP_MAX), (frag){-1, -1};
        if (hi >= 0 && hi < lo) return rx_fail(r, "the count {%d,%d} is out of order", lo, hi), (frag){-1, -1};
    } else return f;
    if (r->i < r->n && r->p[r->i] == '?') r->i++; /* lazy: the same strings */
    size_t after = r->i;
    /* lo copies, then hi - lo optional ones or a star; copies after the first are parsed again */
    frag out = frag_empty(r);
    int n_copies = lo + (hi < 0 ? 1 : hi - lo);
    for (int k = 0; k < n_copies && out.s >= 0; k++) {
        frag copy = f;
        if (k) { r->i = at; copy = parse_atom(r); }
        if (copy.s < 0) return copy;
        out = frag_cat(r, out, k < lo ? copy : hi < 0 ? frag_star(r, copy) : frag_alt(r, copy, frag_empty(r)));
    }
    r->i = after;
    return out;
}

static frag parse_seq(rx *r) {
    frag f = frag_empty(r);
    while (f.s >= 0 && r->i < r->n && r->p[r->i] != '|' && r->p[r->i] != ')') {
        if (r->p[r->i] == '$' && r->i + 1 == r->n) break;
        f = frag_cat(r, f, parse_piece(r));
    }
    return f;
}

static frag parse_alt(rx *r) {
    frag f = parse_seq(r);
    while (f.s >= 0 && r->i < r->n && r->p[r->i] == '|') {
        r->i++;
        f = frag_alt(r, f, parse_seq(r));
    }
    return f;
}

/* The epsilon closure of `set` (words words), in place. */
static void closure(const rx *r, uint64_t *set, size_t words, int32_t *stack) {
    int32_t n = 0;
    for (size_t w = 0; w < words; w++)
        for (uint64_t bits = set[w]; bits; bits &= bits - 1) stack[n++] = (int32_t)(w * 64 + (size_t)__builtin_ctzll(bits));
    while (n) {
        const nstate *s = &r->st[stack[--n]];
        for (int k = 0; k < 2; k++) {
            int32_t t = s->eps[k];
            if (t >= 0 && !(set[t >> 6] >> (t & 63) & 1)) { set[t >> 6] |= 1ull << (t & 63); stack[n++] = t; }
        }
    }
}

#define HASH_SIZE (4 * DFA_MAX)

static uint32_t set_hash(const uint64_t *set, size_t words) {
    uint64_t h = 1469598103934665603ull;
    for (size_t w = 0; w < words; w++) h = (h ^ set[w]) * 1099511628211ull;
    return (uint32_t)(h ^ h >> 29) & (HASH_SIZE - 1);
}

/* Scratch for one more set once the DFA is full (only to find it is new). */
static uint64_t *stack_set(rx *r, size_t words) {
    (void)words;
    return r->spare;
}

/* Subset construction, dead states removed, distances; the DFA's index in s or -1. */
static int build_dfa(rx *r, q35_schema *s, int32_t start, int32_t accept) {
    size_t words = ((size_t)r->n_st + 63) / 64;
    uint64_t *sets = calloc((size_t)DFA_MAX * words, sizeof *sets), *moves = calloc((Q35_SYM_WIDE + 1) * words, sizeof *moves);
    int32_t *stack = malloc(sizeof *stack * (size_t)r->n_st * 2 + sizeof *stack);
    uint16_t (*next)[Q35_SYM_WIDE + 1] = malloc(sizeof *next * DFA_MAX);
    int32_t *hash = malloc(sizeof *hash * HASH_SIZE); /* DFA states by their NFA sets, open addressing */
    int rc = -1, n = 1;
    if (!sets || !moves || !stack || !next || !hash) { rx_fail(r, "out of memory"); goto out; }
    for (int h = 0; h < HASH_SIZE; h++) hash[h] = -1;
    sets[start >> 6] |= 1ull << (start & 63);
    closure(r, sets, words, stack);
    hash[set_hash(sets, words)] = 0;
    for (int d = 0; d < n; d++) {
        /* a schema's patterns together get a bounded amount of work (a request compiles them) */
        s->regex_work += (int64_t)words * (Q35_SYM_WIDE + 1);
        if (s->regex_work > REGEX_WORK) { rx_fail(r, "the schema's patterns are too complex together"); goto out; }
        memset(moves, 0, (Q35_SYM_WIDE + 1) * words * sizeof *moves);
        const uint64_t *cur = sets + (size_t)d * words;
        for (int32_t i = 0; i < r->n_st; i++) {
            if (!(cur[i >> 6] >> (i & 63) & 1) || r->st[i].to < 0) continue;
            int32_t t = r->st[i].to;
            for (int w = 0; w < SET_WORDS; w++)
                for (uint64_t bits = r->st[i].set[w]; bits; bits &= bits - 1) {
                    int c = w * 64 + __builtin_ctzll(bits);
                    moves[(size_t)c * words + (size_t)(t >> 6)] |= 1ull << (t & 63);
                    s->regex_work++;
                }
        }
        for (int c = 0; c <= Q35_SYM_WIDE; c++) {
            uint64_t *m = moves + (size_t)c * words;
            bool any = false;
            for (size_t w = 0; w < words && !any; w++) any = m[w] != 0;
            if (!any) { next[d][c] = Q35_DFA_DEAD; continue; }
            if (c && !memcmp(m, m - words, words * sizeof *m) && next[d][c - 1] != Q35_DFA_DEAD) { /* as the symbol before */
                next[d][c] = next[d][c - 1];
                memcpy(m, moves + (size_t)(c - 1) * words, words * sizeof *m);
                continue;
            }
            uint64_t *raw = m; /* kept unclosed in place for the next symbol's comparison: close a copy */
            uint64_t *cl = sets + (size_t)n * words;
            if (n >= DFA_MAX) cl = stack_set(r, words);
            memcpy(cl, raw, words * sizeof *raw);
            closure(r, cl, words, stack);
            uint32_t h = set_hash(cl, words);
            int found = -1;
            for (; hash[h] >= 0; h = (h + 1) & (HASH_SIZE - 1))
                if (!memcmp(sets + (size_t)hash[h] * words, cl, words * sizeof *cl)) { found = hash[h]; break; }
            if (found < 0) {
                if (n >= DFA_MAX) { rx_fail(r, "the pattern needs more than %d automaton states", DFA_MAX); goto out; }
                hash[h] = n;
                found = n++;
            }
            next[d][c] = (uint16_t)found;
        }
    }
    /* acceptance, then the distance of each state to it (Bellman-Ford on a small graph) */
    uint16_t *dist = malloc(sizeof *dist * (size_t)n);
    uint8_t *acc = malloc((size_t)n);
    if (!dist || !acc) { free(dist); free(acc); rx_fail(r, "out of memory"); goto out; }
    for (int d = 0; d < n; d++) {
        acc[d] = sets[(size_t)d * words + (size_t)(accept >> 6)] >> (accept & 63) & 1;
        dist[d] = acc[d] ? 0 : Q35_DFA_DEAD;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int d = 0; d < n; d++)
            for (int c = 0; c <= Q35_SYM_WIDE; c++) {
                uint16_t t = next[d][c];
                if (t != Q35_DFA_DEAD && dist[t] != Q35_DFA_DEAD && dist[t] + 1 < dist[d]) { dist[d] = (uint16_t)(dist[t] + 1); changed = true; }
            }
    }
    for (int d = 0; d < n; d++)
        for (int c = 0; c <= Q35_SYM_WIDE; c++)
            if (next[d][c] != Q35_DFA_DEAD && dist[next[d][c]] == Q35_DFA_DEAD) next[d][c] = Q35_DFA_DEAD;
    if (dist[0] == Q35_DFA_DEAD) {
        free(dist); free(acc);
        rx_fail(r, "the pattern matches no string that can be written without escapes");
        goto out;
    }
    if (!s->cache && (s->cache = calloc(1, sizeof *s->cache)))
        for (int i = 0; i < Q35_MASK_CACHE; i++) s->cache->e[i].q = -1;
    q35_schema_dfa *grown = realloc(s->dfa, sizeof *grown * (size_t)(s->n_dfa + 1));
    if (!grown) { free(dist); free(acc); rx_fail(r, "out of memory"); goto out; }
    s->dfa = grown;
    void *tab = realloc(next, sizeof *next * (size_t)n);
    int32_t max_dist = 0;
    for (int d = 0; d < n; d++)
        if (dist[d] > max_dist) max_dist = dist[d];
    s->dfa[s->n_dfa] = (q35_schema_dfa){.n = n, .next = tab ? tab : next, .accept = acc, .dist = dist, .max_dist = max_dist};
    next = NULL;
    rc = s->n_dfa++;
out:
    free(hash);
    free(sets);
    free(moves);
    free(stack);
    free(next);
    return rc;
}

int q35_schema_regex(q35_schema *s, const char *pattern, char *msg, size_t msg_size) {
    msg[0] = 0;
    rx r = {.p = pattern, .n = strlen(pattern), .msg = msg, .msg_size = msg_size};
    r.st = malloc(sizeof *r.st * NFA_MAX);
    if (!r.st) return rx_fail(&r, "out of memory");
    uint64_t any[SET_WORDS] = {0};
    set_writable(any);
    bool head = r.n && r.p[0] == '^';
    r.i = head;
    frag f = head ? frag_empty(&r) : frag_star(&r, frag_set(&r, any));
    f = frag_cat(&r, f, parse_alt(&r));
    bool tail = r.i + 1 == r.n && r.p[r.i] == '$';
    if (f.s >= 0 && r.i < r.n && !tail) f = (frag){-1, rx_fail(&r, "an unmatched ')'")};
    if (f.s >= 0 && !tail) f = frag_cat(&r, f, frag_star(&r, frag_set(&r, any)));
    int id = f.s >= 0 ? build_dfa(&r, s, f.s, f.e) : -1;
    free(r.st);
    return id;
}

void q35_schema_dfa_free(q35_schema *s) {
    for (int i = 0; s->cache && i < Q35_MASK_CACHE; i++) free(s->cache->e[i].bits);
    free(s->cache);
    for (int32_t i = 0; i < s->n_dfa; i++) {
        free(s->dfa[i].next);
        free(s->dfa[i].accept);
        free(s->dfa[i].dist);
    }
    free(s->dfa);
}
