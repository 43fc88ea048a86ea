/* json_prefix.c: is this byte string the start of a JSON object? (json_prefix.h)
 *
 * A pushdown recogniser fed byte by byte, for response_format json_object:
 * before each sampled token the server feeds the token's bytes to a copy of
 * the state and masks the token when they cannot continue a valid object.
 * Bytes at or above 0x80 are allowed only inside strings and are not
 * checked as UTF-8 there (a character may span tokens; the detokenizer
 * repairs what never completes). Whitespace between tokens is limited, so a
 * model cannot stall in an endless run of blanks. */
#include "server/json_prefix.h"

#include <string.h>

enum {
    JP_VALUE,      /* a value must start (after ws) */
    JP_KEY_OR_END, /* just after '{': a key string or '}' */
    JP_KEY,        /* after ',' in an object: a key string */
    JP_COLON,      /* after a key */
    JP_AFTER,      /* after a value: ',' or the closer, or the end */
    JP_STRING,     /* inside a string */
    JP_ESCAPE,     /* after a backslash */
    JP_UNICODE,    /* in \uXXXX; aux = hex digits left */
    JP_NUMBER,     /* aux: 0 after '-', 1 int digits (first '0': 2), 3 after '.', 4 frac digits, 5 after e, 6 after e sign, 7 exp digits */
    JP_LITERAL,    /* in true/false/null: aux = index into the word, lit = which */
    JP_DONE,       /* the top-level object closed */
};

static const char *const literals[3] = {"true", "false", "null"};

void q35_json_prefix_init(q35_json_prefix *p) {
    memset(p, 0, sizeof *p);
    p->mode = JP_VALUE;
}

bool q35_json_prefix_complete(const q35_json_prefix *p) { return p->mode == JP_DONE; }

static bool is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A value ended: the container decides what may come next. */
static void value_done(q35_json_prefix *p) { p->mode = p->depth ? JP_AFTER : JP_DONE; }

static bool start_value(q35_json_prefix *p, int c) {
    if (p->depth == 0 && c != '{') return false; /* json_object: the top level is an object */
    switch (c) {
    case '{':
    case '[':
        if (p->depth >= Q35_JSON_MAX_DEPTH) return false;
        p->stack[p->depth++] = (char)c;
        p->mode = c == '{' ? JP_KEY_OR_END : JP_VALUE;
        p->after_open = c == '[';
        return true;
    case '"': p->mode = JP_STRING; p->in_key = false; return true;
    case '-': p->mode = JP_NUMBER; p->aux = 0; return true;
    case 't': case 'f': case 'n':
        p->mode = JP_LITERAL;
        p->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        p->aux = 1;
        return true;
    default:
        if (c >= '0' && c <= '9') { p->mode = JP_NUMBER; p->aux = c == '0' ? 2 : 1; return true; }
        return false;
    }
}

static bool close_container(q35_json_prefix *p, int c) {
    if (!p->depth || p->stack[p->depth - 1] != (c == '}' ? '{' : '[')) return false;
    p->depth--;
    value_done(p);
    return true;
}

/* A number may end here (the byte c is then handled as what follows it). */
static bool number_can_end(int aux) { return aux == 1 || aux == 2 || aux == 4 || aux == 7; }

static bool feed_byte(q35_json_prefix *p, int c) {
    bool ws = is_ws(c);
    if (p->mode != JP_STRING && p->mode != JP_ESCAPE && p->mode != JP_UNICODE && p->mode != JP_NUMBER &&
        p->mode != JP_LITERAL) {
        if (ws) return ++p->ws_run <= Q35_JSON_MAX_WS;
        p->ws_run = 0;
    }
    switch (p->mode) {
    case JP_DONE: return false;
    case JP_VALUE:
        if (p->after_open && c == ']') { p->after_open = false; return close_container(p, c); }
        p->after_open = false;
        return start_value(p, c);
    case JP_KEY_OR_END:
        if (c == '}') return close_container(p, c);
        /* fall through */
    case JP_KEY:
        if (c != '"') return false;
        p->mode = JP_STRING;
        p->in_key = true;
        return true;
    case JP_COLON:
        if (c != ':') return false;
        p->mode = JP_VALUE;
        return true;
    case JP_AFTER:
        if (c == ',') { p->mode = p->stack[p->depth - 1] == '{' ? JP_KEY : JP_VALUE; return true; }
        if (c == '}' || c == ']') return close_container(p, c);
        return false;
    case JP_STRING:
        if (c == '"') {
            if (p->in_key) p->mode = JP_COLON;
            else value_done(p);
            return true;
        }
        if (c == '\\') { p->mode = JP_ESCAPE; return true; }
        return c >= 0x20; /* control characters must be escaped */
    case JP_ESCAPE:
        if (c == 'u') { p->mode = JP_UNICODE; p->aux = 4; return true; }
        if (!strchr("\"\\/bfnrt", c) || !c) return false;
        p->mode = JP_STRING;
        return true;
    case JP_UNICODE:
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
        if (--p->aux == 0) p->mode = JP_STRING;
        return true;
    case JP_LITERAL: {
        const char *w = literals[p->lit];
        if (c != w[p->aux]) return false;
        if (!w[++p->aux]) value_done(p);
        return true;
    }
    case JP_NUMBER: {
        bool digit = c >= '0' && c <= '9';
        switch (p->aux) {
        case 0: if (!digit) return false; p->aux = c == '0' ? 2 : 1; return true;
        case 1: if (digit) return true; break;
        case 2: if (digit) return false; break; /* no leading zeros */
        case 3: if (!digit) return false; p->aux = 4; return true;
        case 4: if (digit) return true; break;
        case 5: if (c == '+' || c == '-') { p->aux = 6; return true; } /* fall through */
        case 6: if (!digit) return false; p->aux = 7; return true;
        case 7: if (digit) return true; break;
        }
        if ((p->aux == 1 || p->aux == 2) && c == '.') { p->aux = 3; return true; }
        if ((p->aux == 1 || p->aux == 2 || p->aux == 4) && (c == 'e' || c == 'E')) { p->aux = 5; return true; }
        if (!number_can_end(p->aux)) return false;
        value_done(p); /* the number ends; c belongs to what follows */
        return feed_byte(p, c);
    }
    }
    return false;
}

bool q35_json_prefix_byte(void *p, unsigned char c) { return feed_byte(p, c); }

bool q35_json_prefix_in_string(const q35_json_prefix *p) { return p->mode == JP_STRING; }

bool q35_json_prefix_feed(q35_json_prefix *p, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(p, (unsigned char)s[i])) return false;
    return true;
}
