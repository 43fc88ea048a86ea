/* schema.c: compiles a JSON Schema subset (schema.h) into nodes that
 * schema_match.c recognises documents of, byte by byte.
 *
 * It lives in text/: it needs base/ and jansson only, does no I/O, and the
 * server (response_format json_schema), the benchmark and the fuzz target
 * share it.
 *
 * Supported: type (one name or a list), properties, required,
 * additionalProperties, items, minItems, maxItems, minLength, maxLength,
 * enum, const, anyOf, and the annotations (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly). Any
 * other keyword is refused, naming it. The recogniser accepts a subset of
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
 *     exponent (so that every parser reads a finite double); strings use
 *     no \u escapes (raw UTF-8, which is checked);
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

typedef struct cctx {
    q35_schema *s;
    char *where;
    size_t where_size;
    char *msg;
    size_t msg_size;
    int depth;
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
            int kid = pass ? any_scalar(c, p) : compile(c, json_object_iter_value(it), p);
            q35_schema_node *d = &c->s->node[id];
            size_t L = strlen(enc);
            memmove(enc, enc + 1, L - 2);
            enc[L - 2] = 0;
            d->str[d->n] = enc;
            d->len[d->n] = L - 2;
            if (kid < 0) { d->n++; rc = -1; break; }
            d->child[d->n] = (uint16_t)kid;
            for (size_t r = 0; r < n_req; r++) required[d->n] |= !strcmp(json_string_value(json_array_get(req, r)), key);
            d->n++;
            if (!pass) it = json_object_iter_next((json_t *)props, it);
        }
    }
    q35_schema_node *d = &c->s->node[id];
    d->next_req[d->n] = d->n;
    for (int32_t k = d->n - 1; k >= 0; k--) d->next_req[k] = required[k] ? k : d->next_req[k + 1];
    free(required);
    return rc ? -1 : id;
}

static int array_node(cctx *c, const json_t *j, const char *path) {
    char p[512];
    const json_t *items = json_object_get(j, "items");
    int id = new_node(c, SK_ARRAY, path);
    if (id < 0) return -1;
    int32_t lo = 0, hi = -1;
    if (get_count(c, j, "minItems", 65535, &lo, path) || get_count(c, j, "maxItems", 65535, &hi, path)) return -1;
    if (hi >= 0 && lo > hi) return sub(p, sizeof p, path, ".minItems"), fail(c, p, "minItems %d is above maxItems %d", lo, hi);
    sub(p, sizeof p, path, ".items");
    if (items && !json_is_object(items) && !json_is_boolean(items)) return fail(c, p, "'items' must be a schema");
    int kid = items && !(json_is_false(items)) ? compile(c, items, p) : !items ? any_scalar(c, p) : -2;
    if (kid == -1) return -1;
    if (kid == -2) { /* items: false: only the empty array */
        if (lo > 0) return fail(c, p, "no item is allowed but minItems is %d", lo);
        hi = 0;
        kid = 0;
    }
    c->s->node[id].item = (uint16_t)kid;
    c->s->node[id].lo = lo;
    c->s->node[id].hi = hi;
    return id;
}

static int string_node(cctx *c, const json_t *j, const char *path) {
    char p[512];
    int id = new_node(c, SK_STRING, path);
    if (id < 0) return -1;
    int32_t lo = 0, hi = -1;
    if (get_count(c, j, "minLength", 65535, &lo, path) || get_count(c, j, "maxLength", 65535, &hi, path)) return -1;
    if (hi >= 0 && lo > hi) return sub(p, sizeof p, path, ".minLength"), fail(c, p, "minLength %d is above maxLength %d", lo, hi);
    c->s->node[id].lo = lo;
    c->s->node[id].hi = hi;
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
        else if (json_object_get(j, "items") || json_object_get(j, "minItems") || json_object_get(j, "maxItems")) type = "array";
        else if (json_object_get(j, "maxLength") || json_object_get(j, "minLength")) type = "string";
        else return any_scalar(c, path);
    }
    if (!strcmp(type, "object")) return object_node(c, j, path);
    if (!strcmp(type, "array")) return array_node(c, j, path);
    if (!strcmp(type, "string")) return string_node(c, j, path);
    if (!strcmp(type, "number")) return new_node(c, SK_NUMBER, path);
    if (!strcmp(type, "integer")) return new_node(c, SK_INTEGER, path);
    json_t *lits = !strcmp(type, "boolean") ? json_pack("[bb]", 1, 0) : json_pack("[n]");
    int id = lits ? literals(c, lits, NULL, path) : fail(c, path, "out of memory");
    json_decref(lits);
    return id;
}

static const char *const known_keys[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
    "maxLength", "enum", "const", "anyOf", "title", "description", "default", "examples", "$schema", "$id",
    "$comment", "deprecated", "readOnly", "writeOnly", NULL};

static int compile(cctx *c, const json_t *j, const char *path) {
    char p[512];
    if (++c->depth > Q35_SCHEMA_DEPTH - 1) return fail(c, path, "the schema nests deeper than %d levels", Q35_SCHEMA_DEPTH - 1);
    int id;
    if (json_is_true(j)) id = any_scalar(c, path);
    else if (!json_is_object(j)) id = fail(c, path, "a schema must be an object or true");
    else {
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)j, key, v) {
            bool known = false;
            for (int k = 0; known_keys[k] && !known; k++) known = !strcmp(key, known_keys[k]);
            sub(p, sizeof p, path, ".%s", key);
            if (!known) { c->depth--; return fail(c, p, "the schema keyword '%s' is not supported", key); }
        }
        const json_t *type = json_object_get(j, "type"), *any = json_object_get(j, "anyOf");
        const json_t *en = json_object_get(j, "enum");
        sub(p, sizeof p, path, ".type");
        if (type && !json_is_string(type) && !json_is_array(type)) id = fail(c, p, "'type' must be a name or a list of names");
        else if (en && (!json_is_array(en) || !json_array_size(en)))
            id = (sub(p, sizeof p, path, ".enum"), fail(c, p, "'enum' must be a non-empty list"));
        else if (any) {
            sub(p, sizeof p, path, ".anyOf");
            if (!json_is_array(any) || !json_array_size(any) || json_array_size(any) > Q35_SCHEMA_MAX_ITEMS)
                id = fail(c, p, "'anyOf' must be a non-empty list of schemas");
            else if (type || en || json_object_get(j, "const") || json_object_get(j, "properties") || json_object_get(j, "items"))
                id = fail(c, p, "'anyOf' beside type, enum, const, properties or items is not supported");
            else if ((id = new_node(c, SK_ANYOF, path)) >= 0 && !alloc_items(c, id, (int32_t)json_array_size(any), false, true, path)) {
                size_t i;
                const json_t *alt;
                json_array_foreach(any, i, alt) {
                    sub(p, sizeof p, path, ".anyOf[%zu]", i);
                    int kid = compile(c, alt, p);
                    if (kid < 0) { id = -1; break; }
                    c->s->node[id].child[c->s->node[id].n++] = (uint16_t)kid;
                }
            } else id = -1;
        } else if (json_is_array(type)) {
            size_t n = json_array_size(type), i;
            const json_t *t;
            json_array_foreach(type, i, t) {
                if (!json_is_string(t) || !known_type(json_string_value(t)))
                    return c->depth--, sub(p, sizeof p, path, ".type[%zu]", i), fail(c, p, "not a JSON Schema type name");
            }
            const json_t *cn = json_object_get(j, "const");
            if (!n) id = fail(c, p, "'type' must not be an empty list");
            else if (n == 1) id = typed(c, j, json_string_value(json_array_get(type, 0)), path);
            else if (en || cn) { /* the values that have one of the types */
                json_t *vals = json_array(), *from = en ? json_incref((json_t *)en) : json_pack("[O]", cn);
                size_t k;
                const json_t *ev;
                json_array_foreach(from, k, ev) {
                    bool ok = false;
                    json_array_foreach(type, i, t) ok |= type_ok(ev, json_string_value(t));
                    if (ok) json_array_append(vals, (json_t *)ev);
                }
                id = vals && json_array_size(vals) ? literals(c, vals, NULL, path) : fail(c, path, "no value of it has the schema's type");
                json_decref(vals);
                json_decref(from);
            } else if ((id = new_node(c, SK_ANYOF, path)) >= 0 && !alloc_items(c, id, (int32_t)n, false, true, path)) {
                json_array_foreach(type, i, t) {
                    int kid = typed(c, j, json_string_value(t), path);
                    if (kid < 0) { id = -1; break; }
                    c->s->node[id].child[c->s->node[id].n++] = (uint16_t)kid;
                }
            } else id = -1;
        } else {
            const char *t = json_string_value(type);
            if (t && !known_type(t)) id = fail(c, p, "'%s' is not a JSON Schema type name", t);
            else id = typed(c, j, t, path);
        }
    }
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
    const char *type = json_string_value(json_object_get(ps, "type"));
    sub(p, sizeof p, path, ".type");
    if (!type) return fail(c, p, "a forced tool call needs each required parameter's 'type', one name");
    int id = compile(c, ps, path);
    if (id < 0 || strcmp(type, "string")) return id;
    q35_schema_node *d = &c->s->node[id];
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
    cctx c = {.s = s, .where = where, .where_size = where_size, .msg = msg, .msg_size = msg_size};
    int root = schema ? compile(&c, schema, "") : fail(&c, "", "no schema");
    if (root < 0) {
        if (!msg[0]) snprintf(msg, msg_size, "invalid schema");
        q35_schema_free(s);
        return -1;
    }
    s->root = (uint16_t)root;
    *out = s;
    return 0;
}
