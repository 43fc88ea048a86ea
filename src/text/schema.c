/* schema.c: compiles a JSON Schema subset (schema.h) into nodes that
 * schema_match.c recognises documents of, byte by byte.
 *
 * It lives in text/: it needs base/ and jansson only, does no I/O, and the
 * server (response_format json_schema), the benchmark and the fuzz target
 * share it.
 *
 * Supported: type (one name or a list), properties, required,
 * additionalProperties, items, prefixItems, minItems, maxItems, minLength,
 * maxLength, pattern, format (date, time, date-time, uuid, email, ipv4,
 * ipv6, hostname; others are annotations), minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (integers and numbers, as
 * schema_keywords.c says), enum, const, anyOf, oneOf (of alternatives that
 * cannot overlap), allOf (merged), $ref into the document ($defs,
 * definitions, "#"; a recursive one is unrolled down to the nesting bound,
 * where an optional property, an alternative or further items that would
 * need more are left out), uniqueItems (false, or with maxItems <= 1), and
 * the annotations (title, description, default, examples, $schema, $id,
 * $comment, deprecated, readOnly, writeOnly). Any other keyword is
 * refused, naming it; so are pattern or format with minLength, and
 * pattern with format. The recogniser accepts a subset of
 * the documents the schema allows, so every document it accepts is valid:
 *   - an object's keys come in the order of `properties`, each at most once;
 *     optional ones may be left out, required ones may not;
 *   - no key outside `properties` is ever produced, whatever
 *     additionalProperties says (false, true, a schema or absent: as
 *     xgrammar's strict mode treats absent); a required key that
 *     `properties` lacks is produced with any scalar value;
 *   - a value with no type constraint ({}, true, an items schema left out)
 *     is a scalar: a string, a number, true, false or null;
 *   - numbers have at most 15 integer and 15 fraction digits and a 2-digit
 *     exponent (so that every parser reads a finite double; none with
 *     bounds); strings use no \u escapes (raw UTF-8, which is checked), and
 *     a string with a pattern or format no escapes at all;
 *   - whitespace: none, except one optional space after ':' and ','.
 * An enum (or const) value is produced as its compact JSON text.
 *
 * q35_schema_compile_tool_call builds, from an OpenAI tools list, the
 * recogniser of one Qwen3.5 XML tool call (tool_choice required or named):
 * fixed text around the function's name and each required parameter in the
 * order of `required`; a parameter's value is written as the tool-call
 * parser (output_parser.c) reads it back by its schema's `type`: a string
 * raw (no '<', no control bytes, never "null"), anything else as JSON. */
#include "text/schema_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define IMPOSSIBLE (-3) /* compile's answer for a value with no document in the nesting left (recursive refs) */
#define REF_MEMO 512

typedef struct cctx {
    q35_schema *s;
    char *where;
    size_t where_size;
    char *msg;
    size_t msg_size;
    int depth;
    const json_t *root;        /* the document $refs point into */
    int in_ref;                /* $refs being expanded: past the depth, a value is IMPOSSIBLE, not an error */
    int n_memo;
    struct ref_memo { const json_t *target; int depth, id; } memo[REF_MEMO]; /* a $ref's node at a depth */
} cctx;

static int fail(cctx *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(cctx *c, const char *path, const char *fmt, ...) {
    if (!c->msg[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, c->msg_size, fmt, ap);
        va_end(ap);
        snprintf(c->where, c->where_size, "%s", path);
    }
    return -1;
}

static int new_node(cctx *c, int kind, const char *path) {
    q35_schema *s = c->s;
    if (s->n >= Q35_SCHEMA_MAX_NODES) return fail(c, path, "the schema has more than %d parts", Q35_SCHEMA_MAX_NODES);
    if (s->n == s->cap) {
        int32_t cap = s->cap ? 2 * s->cap : 16;
        q35_schema_node *n = realloc(s->node, sizeof *n * (size_t)cap);
        if (!n) return fail(c, path, "out of memory");
        s->node = n;
        s->cap = cap;
    }
    memset(&s->node[s->n], 0, sizeof s->node[0]);
    s->node[s->n].kind = kind;
    s->node[s->n].hi = -1;
    s->node[s->n].dfa = -1;
    return s->n++;
}

static int alloc_items(cctx *c, int id, int32_t n, bool strs, bool kids, const char *path) {
    q35_schema_node *d = &c->s->node[id];
    d->n = 0;
    if (strs) { d->str = calloc((size_t)n + 1, sizeof *d->str); d->len = calloc((size_t)n + 1, sizeof *d->len); }
    if (kids) d->child = calloc((size_t)n + 1, sizeof *d->child);
    if ((strs && (!d->str || !d->len)) || (kids && !d->child)) return fail(c, path, "out of memory");
    return 0;
}

static void sub(char *out, size_t size, const char *path, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void sub(char *out, size_t size, const char *path, const char *fmt, ...) {
    size_t n = (size_t)snprintf(out, size, "%s", path);
    if (n >= size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + n, size - n, fmt, ap);
    va_end(ap);
}

static bool type_ok(const json_t *v, const char *type) {
    if (!strcmp(type, "string")) return json_is_string(v);
    if (!strcmp(type, "number")) return json_is_number(v);
    if (!strcmp(type, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(type, "boolean")) return json_is_boolean(v);
    if (!strcmp(type, "null")) return json_is_null(v);
    if (!strcmp(type, "object")) return json_is_object(v);
    if (!strcmp(type, "array")) return json_is_array(v);
    return false;
}

static bool known_type(const char *t) {
    static const char *const names[] = {"string", "number", "integer", "boolean", "null", "object", "array"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(t, names[i])) return true;
    return false;
}

static int compile(cctx *c, const json_t *j, const char *path);
static int typed(cctx *c, const json_t *j, const char *type, const char *path);

/* A literal node of each value that has the type (NULL: any type). */
static int literals(cctx *c, const json_t *vals, const char *type, const char *path) {
    int id = new_node(c, SK_LITERAL, path);
    if (id < 0 || alloc_items(c, id, (int32_t)json_array_size(vals), true, false, path)) return -1;
    q35_schema_node *d = &c->s->node[id];
    size_t i;
    const json_t *v;
    json_array_foreach(vals, i, v) {
        if (type && !type_ok(v, type)) continue;
        if (json_is_real(v) && !isfinite(json_real_value(v))) continue;
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text) return fail(c, path, "out of memory");
        bool dup = false;
        for (int32_t k = 0; k < d->n && !dup; k++) dup = !strcmp(d->str[k], text);
        if (dup) { free(text); continue; }
        d->len[d->n] = strlen(text);
        d->str[d->n++] = text;
    }
    if (!d->n) return fail(c, path, "no value of it has the schema's type");
    return id;
}

/* An untyped value: a string, a number, true, false or null. */
static int any_scalar(cctx *c, const char *path) {
    int id = new_node(c, SK_ANYOF, path);
    if (id < 0 || alloc_items(c, id, 3, false, true, path)) return -1;
    int kids[3] = {new_node(c, SK_STRING, path), new_node(c, SK_NUMBER, path), -1};
    json_t *lits = json_pack("[bbn]", 1, 0);
    kids[2] = lits ? literals(c, lits, NULL, path) : fail(c, path, "out of memory");
    json_decref(lits);
    for (int k = 0; k < 3; k++) {
        if (kids[k] < 0) return -1;
        c->s->node[id].child[c->s->node[id].n++] = (uint16_t)kids[k];
    }
    return id;
}

static int get_count(cctx *c, const json_t *j, const char *key, int32_t max, int32_t *out, const char *path) {
    const json_t *v = json_object_get(j, key);
    if (!v) return 0;
    char p[512];
    sub(p, sizeof p, path, ".%s", key);
    double x = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
    if (x < 0 || x != floor(x)) return fail(c, p, "'%s' must be a non-negative integer", key);
    if (x > max) return fail(c, p, "'%s' is at most %d here", key, (int)max);
    *out = (int32_t)x;
    return 0;
}

static int object_node(cctx *c, const json_t *j, const char *path) {
    char p[512];
    const json_t *props = json_object_get(j, "properties"), *req = json_object_get(j, "required");
    const json_t *ap = json_object_get(j, "additionalProperties");
    if (props && !json_is_object(props)) return sub(p, sizeof p, path, ".properties"), fail(c, p, "'properties' must be an object");
    if (req && !json_is_array(req)) return sub(p, sizeof p, path, ".required"), fail(c, p, "'required' must be a list of names");
    if (ap && !json_is_boolean(ap) && !json_is_object(ap))
        return sub(p, sizeof p, path, ".additionalProperties"), fail(c, p, "'additionalProperties' must be a boolean or a schema");
    size_t i, n_req = json_array_size(req);
    const json_t *v;
    json_array_foreach(req, i, v) {
        sub(p, sizeof p, path, ".required[%zu]", i);
        if (!json_is_string(v)) return fail(c, p, "'required' must be a list of names");
    }
    size_t n = json_object_size(props) + n_req;
    if (n > Q35_SCHEMA_MAX_ITEMS) return sub(p, sizeof p, path, ".properties"), fail(c, p, "more than %d properties", Q35_SCHEMA_MAX_ITEMS);
    int id = new_node(c, SK_OBJECT, path);
    if (id < 0 || alloc_items(c, id, (int32_t)n, true, true, path)) return -1;
    c->s->node[id].next_req = malloc(sizeof(int32_t) * (n + 1));
    if (!c->s->node[id].next_req) return fail(c, path, "out of memory");
    bool *required = calloc(n + 1, 1);
    if (!required) return fail(c, path, "out of memory");
    const char *key;
    int rc = 0;
    /* the properties in order, then required names that they lack */
    for (int pass = 0; pass < 2 && !rc; pass++) {
        size_t k = 0;
        void *it = pass ? NULL : json_object_iter((json_t *)props);
        for (;; k++) {
            if (pass) {
                if (k >= n_req) break;
                key = json_string_value(json_array_get(req, k));
                if (json_object_get(props, key)) continue;
                bool dup = false;
                for (int32_t q = 0; q < c->s->node[id].n && !dup; q++)
                    dup = !strcmp(c->s->node[id].str[q], key);
                if (dup) continue;
            } else {
                if (!it) break;
                key = json_object_iter_key(it);
            }
            sub(p, sizeof p, path, ".properties.%s", key);
            json_t *name = json_string(key);
            char *enc = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
            json_decref(name);
            if (!enc) { rc = fail(c, p, "out of memory"); break; }
            bool req_k = false;
            for (size_t r = 0; r < n_req; r++) req_k |= !strcmp(json_string_value(json_array_get(req, r)), key);
            int kid = pass ? any_scalar(c, p) : compile(c, json_object_iter_value(it), p);
            if (kid == IMPOSSIBLE) { /* an optional property is left out; a required one takes the object with it */
                free(enc);
                if (req_k) { rc = IMPOSSIBLE; break; }
                if (!pass) it = json_object_iter_next((json_t *)props, it);
                continue;
            }
            q35_schema_node *d = &c->s->node[id];
            size_t L = strlen(enc);
            memmove(enc, enc + 1, L - 2);
            enc[L - 2] = 0;
            d->str[d->n] = enc;
            d->len[d->n] = L - 2;
            if (kid < 0) { d->n++; rc = -1; break; }
            d->child[d->n] = (uint16_t)kid;
            required[d->n] = req_k;
            d->n++;
            if (!pass) it = json_object_iter_next((json_t *)props, it);
        }
    }
    q35_schema_node *d = &c->s->node[id];
    d->next_req[d->n] = d->n;
    for (int32_t k = d->n - 1; k >= 0; k--) d->next_req[k] = required[k] ? k : d->next_req[k + 1];
    free(required);
    return rc == IMPOSSIBLE ? IMPOSSIBLE : rc ? -1 : id;
}

/* items (the rest after prefixItems), min/maxItems; an item with no
 * document left (IMPOSSIBLE) ends the array before it. */
static int array_node(cctx *c, const json_t *j, const char *path) {
    char p[512];
    const json_t *items = json_object_get(j, "items"), *prefix = json_object_get(j, "prefixItems");
    const json_t *uniq = json_object_get(j, "uniqueItems");
    int32_t lo = 0, hi = -1;
    if (get_count(c, j, "minItems", 65535, &lo, path) || get_count(c, j, "maxItems", 65535, &hi, path)) return -1;
    if (hi >= 0 && lo > hi) return sub(p, sizeof p, path, ".minItems"), fail(c, p, "minItems %d is above maxItems %d", lo, hi);
    sub(p, sizeof p, path, ".uniqueItems");
    if (uniq && !json_is_boolean(uniq)) return fail(c, p, "'uniqueItems' must be a boolean");
    if (json_is_true(uniq) && (hi < 0 || hi > 1)) return fail(c, p, "'uniqueItems' true is not supported (unless maxItems is at most 1)");
    sub(p, sizeof p, path, ".prefixItems");
    if (prefix && (!json_is_array(prefix) || json_array_size(prefix) > 64)) return fail(c, p, "'prefixItems' must be a list of at most 64 schemas");
    int id = new_node(c, SK_ARRAY, path);
    if (id < 0 || alloc_items(c, id, (int32_t)json_array_size(prefix), false, true, path)) return -1;
    size_t i;
    const json_t *v;
    json_array_foreach(prefix, i, v) {
        sub(p, sizeof p, path, ".prefixItems[%zu]", i);
        int kid = compile(c, v, p);
        if (kid == -1) return -1;
        if (kid == IMPOSSIBLE) { /* no array reaches this item */
            if (lo > (int32_t)i) return IMPOSSIBLE;
            hi = (int32_t)i;
            break;
        }
        c->s->node[id].child[c->s->node[id].n++] = (uint16_t)kid;
    }
    int32_t n_pre = c->s->node[id].n;
    sub(p, sizeof p, path, ".items");
    if (items && !json_is_object(items) && !json_is_boolean(items)) return fail(c, p, "'items' must be a schema");
    int kid = items && !(json_is_false(items)) ? compile(c, items, p) : !items ? any_scalar(c, p) : IMPOSSIBLE;
    if (kid == -1) return -1;
    if (kid == IMPOSSIBLE) { /* items: false (or none possible): nothing after the prefix */
        if (lo > n_pre) return items && json_is_false(items) ? fail(c, p, "no item is allowed after %d but minItems is %d", (int)n_pre, lo)
                                                             : IMPOSSIBLE;
        if (hi < 0 || hi > n_pre) hi = n_pre;
        kid = 0;
    }
    c->s->node[id].item = (uint16_t)kid;
    c->s->node[id].lo = lo;
    c->s->node[id].hi = hi;
    return id;
}

/* A string; `pattern` or a known `format` hold its characters to a DFA
 * (an unknown format is an annotation, as JSON Schema has it). */
static int string_node(cctx *c, const json_t *j, const char *path) {
    char p[512];
    int id = new_node(c, SK_STRING, path);
    if (id < 0) return -1;
    int32_t lo = 0, hi = -1;
    if (get_count(c, j, "minLength", 65535, &lo, path) || get_count(c, j, "maxLength", 65535, &hi, path)) return -1;
    if (hi >= 0 && lo > hi) return sub(p, sizeof p, path, ".minLength"), fail(c, p, "minLength %d is above maxLength %d", lo, hi);
    const json_t *pat = json_object_get(j, "pattern"), *fmt = json_object_get(j, "format");
    sub(p, sizeof p, path, pat ? ".pattern" : ".format");
    if (pat && !json_is_string(pat)) return fail(c, p, "'pattern' must be a string");
    if (fmt && !json_is_string(fmt)) return fail(c, p, "'format' must be a string");
    const char *rx = pat ? json_string_value(pat) : q35_schema_format_regex(json_string_value(fmt));
    if (pat && q35_schema_format_regex(json_string_value(fmt)))
        return fail(c, p, "'pattern' together with 'format' is not supported");
    if (rx && lo > 0) return fail(c, p, "minLength together with '%s' is not supported", pat ? "pattern" : "format");
    if (rx) {
        char m[256];
        int dfa = q35_schema_regex(c->s, rx, m, sizeof m);
        if (dfa < 0) return fail(c, p, "%s", m);
        if (hi >= 0 && c->s->dfa[dfa].dist[0] > hi) return fail(c, p, "no string of at most maxLength %d characters matches", hi);
        c->s->node[id].dfa = dfa;
    }
    c->s->node[id].lo = lo;
    c->s->node[id].hi = hi;
    return id;
}

/* A number or an integer; minimum / maximum and the exclusive ones hold it to a DFA (schema_keywords.c). */
static int number_node(cctx *c, const json_t *j, bool integer, const char *path) {
    char m[256], *rx = NULL;
    int id = new_node(c, integer ? SK_INTEGER : SK_NUMBER, path);
    if (id < 0) return -1;
    if (q35_schema_bounds_regex(j, integer, &rx, m, sizeof m)) return fail(c, path, "%s", m);
    if (!rx) return id;
    int dfa = q35_schema_regex(c->s, rx, m, sizeof m);
    free(rx);
    if (dfa < 0) return fail(c, path, "%s", m);
    c->s->node[id].dfa = dfa;
    return id;
}

static int typed(cctx *c, const json_t *j, const char *type, const char *path) {
    const json_t *en = json_object_get(j, "enum"), *cn = json_object_get(j, "const");
    if (en || cn) {
        json_t *vals = en ? json_incref((json_t *)en) : json_pack("[O]", cn);
        int id = vals ? literals(c, vals, type, path) : fail(c, path, "out of memory");
        json_decref(vals);
        return id;
    }
    if (!type) {
        if (json_object_get(j, "properties") || json_object_get(j, "required")) type = "object";
        else if (json_object_get(j, "items") || json_object_get(j, "minItems") || json_object_get(j, "maxItems") ||
                 json_object_get(j, "prefixItems"))
            type = "array";
        else if (json_object_get(j, "maxLength") || json_object_get(j, "minLength") || json_object_get(j, "pattern") ||
                 json_object_get(j, "format"))
            type = "string";
        else if (json_object_get(j, "minimum") || json_object_get(j, "maximum") || json_object_get(j, "exclusiveMinimum") ||
                 json_object_get(j, "exclusiveMaximum"))
            type = "number";
        else return any_scalar(c, path);
    }
    if (!strcmp(type, "object")) return object_node(c, j, path);
    if (!strcmp(type, "array")) return array_node(c, j, path);
    if (!strcmp(type, "string")) return string_node(c, j, path);
    if (!strcmp(type, "number") || !strcmp(type, "integer")) return number_node(c, j, !strcmp(type, "integer"), path);
    json_t *lits = !strcmp(type, "boolean") ? json_pack("[bb]", 1, 0) : json_pack("[n]");
    int id = lits ? literals(c, lits, NULL, path) : fail(c, path, "out of memory");
    json_decref(lits);
    return id;
}

static const char *const known_keys[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "title",
    "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", NULL};

/* The alternatives of anyOf (or oneOf, or a list of types via `typed`) as
 * one SK_ANYOF node; those with no document left are dropped. */
static int alternatives(cctx *c, const json_t *j, const json_t *alts, const json_t *types, const char *key, const char *path) {
    char p[512];
    size_t n = json_array_size(alts ? alts : types), i;
    int id = new_node(c, SK_ANYOF, path);
    if (id < 0 || alloc_items(c, id, (int32_t)n, false, true, path)) return -1;
    for (i = 0; i < n; i++) {
        int kid;
        if (alts) {
            sub(p, sizeof p, path, ".%s[%zu]", key, i);
            kid = compile(c, json_array_get(alts, i), p);
        } else kid = typed(c, j, json_string_value(json_array_get(types, i)), path);
        if (kid == IMPOSSIBLE) continue;
        if (kid < 0) return -1;
        c->s->node[id].child[c->s->node[id].n++] = (uint16_t)kid;
    }
    return c->s->node[id].n ? id : IMPOSSIBLE;
}

/* A $ref: the node of its target, once per depth (a recursive schema is
 * unrolled down to the nesting left, then its recursion is IMPOSSIBLE). */
static int ref_node(cctx *c, const json_t *j, const char *path) {
    char p[512];
    const json_t *ref = json_object_get(j, "$ref");
    sub(p, sizeof p, path, ".$ref");
    if (!json_is_string(ref)) return fail(c, p, "'$ref' must be a string");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)j, k, v) {
        if (strcmp(k, "$ref") && strcmp(k, "$defs") && strcmp(k, "definitions") && strcmp(k, "title") && strcmp(k, "description") &&
            strcmp(k, "$comment") && strcmp(k, "default") && strcmp(k, "examples"))
            return fail(c, p, "'$ref' beside '%s' is not supported (use allOf)", k);
    }
    const json_t *target = q35_schema_ref_target(c->root, json_string_value(ref));
    if (!target) return fail(c, p, "'$ref' %s does not name a schema in this document (only '#...' pointers such as '#/$defs/Name')", json_string_value(ref));
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].target == target && c->memo[i].depth == c->depth) return c->memo[i].id;
    c->in_ref++;
    int id = compile(c, target, p);
    c->in_ref--;
    if (id != -1 && c->n_memo < REF_MEMO) c->memo[c->n_memo++] = (struct ref_memo){target, c->depth, id};
    return id;
}

static int compile_object(cctx *c, const json_t *j, const char *path) {
    char p[512];
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)j, key, v) {
        bool known = false;
        for (int k = 0; known_keys[k] && !known; k++) known = !strcmp(key, known_keys[k]);
        sub(p, sizeof p, path, ".%s", key);
        if (!known) return fail(c, p, "the schema keyword '%s' is not supported", key);
    }
    if (json_object_get(j, "$ref")) return ref_node(c, j, path);
    if (json_object_get(j, "allOf")) {
        char m[256];
        json_t *merged = q35_schema_merge_all_of(c->root, j, m, sizeof m);
        sub(p, sizeof p, path, ".allOf");
        if (!merged) return fail(c, p, "%s", m);
        c->depth--; /* the merged schema stands in for this one */
        int id = compile(c, merged, path);
        c->depth++;
        json_decref(merged);
        return id;
    }
    const json_t *type = json_object_get(j, "type"), *any = json_object_get(j, "anyOf"), *one = json_object_get(j, "oneOf");
    const json_t *en = json_object_get(j, "enum");
    sub(p, sizeof p, path, ".type");
    if (type && !json_is_string(type) && !json_is_array(type)) return fail(c, p, "'type' must be a name or a list of names");
    if (en && (!json_is_array(en) || !json_array_size(en)))
        return sub(p, sizeof p, path, ".enum"), fail(c, p, "'enum' must be a non-empty list");
    if (any || one) {
        const char *kw = any ? "anyOf" : "oneOf";
        const json_t *alts = any ? any : one;
        sub(p, sizeof p, path, ".%s", kw);
        if (any && one) return fail(c, p, "'anyOf' beside 'oneOf' is not supported");
        if (!json_is_array(alts) || !json_array_size(alts) || json_array_size(alts) > Q35_SCHEMA_MAX_ITEMS)
            return fail(c, p, "'%s' must be a non-empty list of schemas", kw);
        if (type || en || json_object_get(j, "const") || json_object_get(j, "properties") || json_object_get(j, "items"))
            return fail(c, p, "'%s' beside type, enum, const, properties or items is not supported", kw);
        size_t x, y;
        if (one && q35_schema_one_of_disjoint(c->root, one, &x, &y))
            return fail(c, p, "oneOf alternatives %zu and %zu may both hold for one value; only alternatives of different types, "
                        "objects that each require a key the other lacks, or objects told apart by a required const/enum key are supported", x, y);
        return alternatives(c, j, alts, NULL, kw, path);
    }
    if (json_is_array(type)) {
        size_t n = json_array_size(type), i;
        const json_t *t;
        json_array_foreach(type, i, t) {
            if (!json_is_string(t) || !known_type(json_string_value(t)))
                return sub(p, sizeof p, path, ".type[%zu]", i), fail(c, p, "not a JSON Schema type name");
        }
        const json_t *cn = json_object_get(j, "const");
        if (!n) return fail(c, p, "'type' must not be an empty list");
        if (n == 1) return typed(c, j, json_string_value(json_array_get(type, 0)), path);
        if (en || cn) { /* the values that have one of the types */
            json_t *vals = json_array(), *from = en ? json_incref((json_t *)en) : json_pack("[O]", cn);
            size_t k;
            const json_t *ev;
            json_array_foreach(from, k, ev) {
                bool ok = false;
                json_array_foreach(type, i, t) ok |= type_ok(ev, json_string_value(t));
                if (ok) json_array_append(vals, (json_t *)ev);
            }
            int id = vals && json_array_size(vals) ? literals(c, vals, NULL, path) : fail(c, path, "no value of it has the schema's type");
            json_decref(vals);
            json_decref(from);
            return id;
        }
        return alternatives(c, j, NULL, type, "type", path);
    }
    const char *t = json_string_value(type);
    if (t && !known_type(t)) return fail(c, p, "'%s' is not a JSON Schema type name", t);
    return typed(c, j, t, path);
}

static int compile(cctx *c, const json_t *j, const char *path) {
    if (c->depth + 1 > Q35_SCHEMA_DEPTH - 1)
        return c->in_ref ? IMPOSSIBLE : fail(c, path, "the schema nests deeper than %d levels", Q35_SCHEMA_DEPTH - 1);
    c->depth++;
    int id = json_is_true(j) ? any_scalar(c, path) : !json_is_object(j) ? fail(c, path, "a schema must be an object or true")
                                                   : compile_object(c, j, path);
    c->depth--;
    return id;
}

/* ---- forced tool calls ---- */

/* The fixed text a b e. */
static int text_node(cctx *c, const char *a, const char *b, const char *e, const char *path) {
    int id = new_node(c, SK_LITERAL, path);
    if (id < 0 || alloc_items(c, id, 1, true, false, path)) return -1;
    q35_schema_node *d = &c->s->node[id];
    size_t la = strlen(a), lb = strlen(b), le = strlen(e);
    if (!(d->str[0] = malloc(la + lb + le + 1))) return fail(c, path, "out of memory");
    memcpy(d->str[0], a, la);
    memcpy(d->str[0] + la, b, lb);
    memcpy(d->str[0] + la + lb, e, le + 1);
    d->len[0] = la + lb + le;
    d->n = 1;
    return id;
}

/* A raw parameter text can be read back as this string (schema_match.c's raw_byte). */
static bool raw_ok(const char *v) {
    if (!strcasecmp(v, "null")) return false;
    for (; *v; v++)
        if ((unsigned char)*v < 0x20 || *v == '<') return false;
    return true;
}

/* A parameter's value: its schema's JSON text, except that a string is
 * written raw, as the tool-call parser reads it back by the schema's type. */
static int param_value(cctx *c, const json_t *ps, const char *path) {
    char p[512];
    /* a $ref (a nested model's $defs) counts by its target's type, as the tool-call parser reads it */
    const json_t *res = q35_schema_resolve(c->root, ps);
    const char *type = json_string_value(json_object_get(res, "type"));
    sub(p, sizeof p, path, ".type");
    if (!type) return fail(c, p, "a forced tool call needs each required parameter's 'type', one name");
    int id = compile(c, strcmp(type, "string") ? ps : res, path); /* a string's node becomes raw: one of its own */
    if (id == IMPOSSIBLE) return fail(c, path, "the parameter has no value within %d levels of nesting", Q35_SCHEMA_DEPTH - 1);
    if (id < 0 || strcmp(type, "string")) return id;
    q35_schema_node *d = &c->s->node[id];
    if (d->kind == SK_STRING && d->dfa >= 0)
        return fail(c, p, "a forced tool call's string parameter with a pattern or format is not supported");
    if (d->kind == SK_STRING) { d->kind = SK_RAW; return id; }
    int32_t k = 0; /* an enum: each string that can be written raw */
    for (int32_t i = 0; i < d->n; i++) {
        json_t *v = json_loads(d->str[i], JSON_DECODE_ANY, NULL);
        const char *sv = json_string_value(v);
        free(d->str[i]);
        d->str[i] = NULL;
        if (sv && raw_ok(sv) && (d->str[k] = strdup(sv))) d->len[k] = strlen(d->str[k]), k++;
        json_decref(v);
    }
    d->n = k;
    return k ? id : fail(c, path, "no value of it can be a tool call's parameter");
}

/* "NAME>\n", each required parameter, "</function>\n</tool_call>" */
static int tool_seq(cctx *c, const json_t *f, const char *path) {
    char p[512];
    const json_t *params = json_object_get(f, "parameters");
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    size_t n_req = json_array_size(req), i;
    c->root = params; /* its $refs point into the parameters */
    int id = new_node(c, SK_SEQ, path);
    if (id < 0 || alloc_items(c, id, (int32_t)(3 * n_req + 2), false, true, path)) return -1;
    int kid = text_node(c, json_string_value(json_object_get(f, "name")), ">\n", "", path);
    if (kid < 0) return -1;
    c->s->node[id].child[c->s->node[id].n++] = (uint16_t)kid;
    const json_t *k;
    json_array_foreach(req, i, k) {
        const char *key = json_string_value(k);
        sub(p, sizeof p, path, ".parameters.properties.%s", key ? key : "?");
        if (!key) return fail(c, p, "'required' must be a list of names");
        const json_t *ps = json_object_get(props, key);
        int parts[3] = {text_node(c, "<parameter=", key, ">\n", p), -1, -1};
        if (ps) parts[1] = param_value(c, ps, p);
        else if ((parts[1] = new_node(c, SK_RAW, p)) >= 0) c->s->node[parts[1]].hi = -1; /* untyped: read back as a string */
        parts[2] = text_node(c, "\n</parameter>\n", "", "", p);
        for (int q = 0; q < 3; q++) {
            if (parts[q] < 0) return -1;
            c->s->node[id].child[c->s->node[id].n++] = (uint16_t)parts[q];
        }
    }
    if ((kid = text_node(c, "</function>\n</tool_call>", "", "", path)) < 0) return -1;
    c->s->node[id].child[c->s->node[id].n++] = (uint16_t)kid;
    return id;
}

int q35_schema_compile_tool_call(const json_t *tools, const char *name, q35_schema **out, char *where, size_t where_size,
                                 char *msg, size_t msg_size) {
    where[0] = msg[0] = 0;
    *out = NULL;
    q35_schema *s = calloc(1, sizeof *s);
    if (!s) { snprintf(msg, msg_size, "out of memory"); return -1; }
    cctx c = {.s = s, .where = where, .where_size = where_size, .msg = msg, .msg_size = msg_size, .depth = 2};
    int root = new_node(&c, SK_SEQ, ""), any = new_node(&c, SK_ANYOF, ""), head = text_node(&c, "<tool_call>\n<function=", "", "", "");
    size_t n = json_array_size(tools), i;
    if (root < 0 || any < 0 || head < 0 || alloc_items(&c, root, 2, false, true, "") || alloc_items(&c, any, (int32_t)n, false, true, ""))
        root = -1;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const char *fname = json_string_value(json_object_get(f, "name"));
        if (root < 0 || !fname || (name && strcmp(fname, name))) continue;
        char p[512];
        snprintf(p, sizeof p, "[%zu].function", i);
        int kid = tool_seq(&c, f, p);
        if (kid < 0) { root = -1; break; }
        s->node[any].child[s->node[any].n++] = (uint16_t)kid;
    }
    if (root >= 0 && !s->node[any].n) root = fail(&c, "", "no function to call");
    if (root < 0) {
        if (!msg[0]) snprintf(msg, msg_size, "invalid tools");
        q35_schema_free(s);
        return -1;
    }
    s->node[root].child[0] = (uint16_t)head;
    s->node[root].child[1] = (uint16_t)any;
    s->node[root].n = 2;
    s->root = (uint16_t)root;
    *out = s;
    return 0;
}

void q35_schema_free(q35_schema *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n; i++) {
        q35_schema_node *d = &s->node[i];
        for (int32_t k = 0; d->str && k < d->n; k++) free(d->str[k]);
        free(d->str);
        free(d->len);
        free(d->child);
        free(d->next_req);
    }
    free(s->node);
    q35_schema_dfa_free(s);
    free(s);
}

int q35_schema_compile(const json_t *schema, q35_schema **out, char *where, size_t where_size, char *msg, size_t msg_size) {
    char w0[4], m0[4];
    if (!where || !where_size) { where = w0; where_size = sizeof w0; }
    if (!msg || !msg_size) { msg = m0; msg_size = sizeof m0; }
    where[0] = msg[0] = 0;
    *out = NULL;
    q35_schema *s = calloc(1, sizeof *s);
    if (!s) { snprintf(msg, msg_size, "out of memory"); return -1; }
    cctx c = {.s = s, .where = where, .where_size = where_size, .msg = msg, .msg_size = msg_size, .root = schema};
    int root = schema ? compile(&c, schema, "") : fail(&c, "", "no schema");
    if (root == IMPOSSIBLE) root = fail(&c, "", "the schema has no document within %d levels of nesting", Q35_SCHEMA_DEPTH - 1);
    if (root < 0) {
        if (!msg[0]) snprintf(msg, msg_size, "invalid schema");
        q35_schema_free(s);
        return -1;
    }
    s->root = (uint16_t)root;
    *out = s;
    return 0;
}
