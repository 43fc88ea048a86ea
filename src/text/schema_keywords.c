/* schema_keywords.c: the keywords schema.c rewrites before it compiles:
 * $ref (a JSON pointer into the schema's own document), allOf (merged into
 * one schema), oneOf (accepted when its alternatives cannot overlap, then
 * compiled as anyOf), `format` and numeric bounds (as the regular
 * expressions schema_regex.c compiles).
 *
 * Numeric bounds, exactly: an integer's bounds allow the integers in
 * [lo, hi] written without leading zeros or exponent, at most 15 digits;
 * a number's allow those integers and the decimals k.ddd (1 to 15 fraction
 * digits) whose every completion stays in bounds: k in [lo, hi - 1] (from
 * 0 up), -k with k in [-hi, -lo - 1] and -0.ddd when -1 >= lo and 0 <= hi,
 * exclusive bounds excluding the bound itself. So every number produced is
 * valid, and a bound that is not an integer only narrows the fractions. */
#include "text/schema_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ABS 999999999999999.0 /* 15 digits: Q35_SCHEMA_INT_DIGITS */

/* ---- $ref ---- */

const json_t *q35_schema_ref_target(const json_t *root, const char *ref) {
    if (!ref || ref[0] != '#') return NULL;
    const json_t *at = root;
    const char *p = ref + 1;
    if (!*p) return root;
    if (*p != '/') return NULL;
    while (*p == '/' && at) {
        p++;
        char key[256];
        size_t n = 0;
        for (; *p && *p != '/' && n + 1 < sizeof key; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) { key[n++] = p[1] == '0' ? '~' : '/'; p++; }
            else key[n++] = *p;
        }
        if (*p && *p != '/') return NULL;
        key[n] = 0;
        if (json_is_object(at)) at = json_object_get(at, key);
        else if (json_is_array(at)) {
            char *end;
            long i = strtol(key, &end, 10);
            at = *key && !*end && i >= 0 ? json_array_get(at, (size_t)i) : NULL;
        } else at = NULL;
    }
    return at;
}

const json_t *q35_schema_resolve(const json_t *root, const json_t *j) {
    for (int hops = 0; json_is_object(j) && json_object_get(j, "$ref"); hops++)
        j = hops < 16 ? q35_schema_ref_target(root, json_string_value(json_object_get(j, "$ref"))) : NULL;
    return j;
}

/* ---- allOf ---- */

static bool annotation(const char *k) {
    static const char *const names[] = {"title", "description", "default", "examples", "$comment", "deprecated",
                                        "readOnly", "writeOnly", "$schema", "$id", "$defs", "definitions", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(k, names[i])) return true;
    return false;
}

/* Adds part's keywords to m; "properties" merge key by key (a key in both
 * becomes the allOf of its two schemas), "required" is the union. */
static int merge_into(json_t *m, const json_t *part, char *key_out, size_t key_size) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)part, k, v) {
        json_t *have = json_object_get(m, k);
        if (annotation(k)) continue;
        if (!have) { json_object_set(m, k, v); continue; }
        if (!strcmp(k, "properties") && json_is_object(have) && json_is_object(v)) {
            json_t *props = json_deep_copy(have);
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                json_t *old = json_object_get(props, pk);
                if (!old || json_equal(old, pv)) json_object_set(props, pk, pv);
                else json_object_set_new(props, pk, json_pack("{s:[OO]}", "allOf", old, pv));
            }
            json_object_set_new(m, k, props);
        } else if (!strcmp(k, "required") && json_is_array(have) && json_is_array(v)) {
            json_t *req = json_copy(have);
            size_t i;
            json_t *r;
            json_array_foreach(v, i, r) {
                bool dup = false;
                for (size_t j = 0; j < json_array_size(req) && !dup; j++) dup = json_equal(json_array_get(req, j), r);
                if (!dup) json_array_append(req, r);
            }
            json_object_set_new(m, k, req);
        } else if (!json_equal(have, v)) {
            snprintf(key_out, key_size, "%s", k);
            return -1;
        }
    }
    return 0;
}

json_t *q35_schema_merge_all_of(const json_t *root, const json_t *j, char *msg, size_t msg_size) {
    const json_t *all = json_object_get(j, "allOf");
    if (!json_is_array(all) || !json_array_size(all) || json_array_size(all) > 64) {
        snprintf(msg, msg_size, "'allOf' must be a non-empty list of at most 64 schemas");
        return NULL;
    }
    json_t *m = json_deep_copy(j);
    json_object_del(m, "allOf");
    char key[128] = "";
    size_t i;
    const json_t *part;
    json_array_foreach(all, i, part) {
        const json_t *p = q35_schema_resolve(root, part);
        if (json_is_true(p)) continue;
        if (!json_is_object(p) || json_object_get(p, "$ref")) {
            snprintf(msg, msg_size, "allOf[%zu] must be a schema object (a $ref into this document resolves)", i);
            json_decref(m);
            return NULL;
        }
        /* a part with additionalProperties false allows only its own keys */
        if (merge_into(m, p, key, sizeof key)) {
            snprintf(msg, msg_size, "allOf parts that disagree on '%s' are not supported", key);
            json_decref(m);
            return NULL;
        }
    }
    /* the keys a part without additionalProperties forbids are left out (optional) or refused (required) */
    json_array_foreach(all, i, part) {
        const json_t *p = q35_schema_resolve(root, part);
        if (!json_is_false(json_object_get(p, "additionalProperties"))) continue;
        json_t *props = json_object_get(m, "properties"), *own = json_object_get(p, "properties");
        const char *pk;
        json_t *pv;
        void *tmp;
        json_object_foreach_safe(props, tmp, pk, pv) {
            if (json_object_get(own, pk)) continue;
            const json_t *req = json_object_get(m, "required");
            for (size_t r = 0; r < json_array_size(req); r++)
                if (!strcmp(json_string_value(json_array_get(req, r)) ? json_string_value(json_array_get(req, r)) : "", pk)) {
                    snprintf(msg, msg_size, "allOf[%zu] forbids the required property '%s'", i, pk);
                    json_decref(m);
                    return NULL;
                }
            json_object_del(props, pk);
        }
    }
    return m;
}

/* ---- oneOf: alternatives that cannot both hold ---- */

enum { T_STRING = 1, T_NUMBER = 2, T_INTEGER = 4, T_BOOL = 8, T_NULL = 16, T_OBJECT = 32, T_ARRAY = 64 };

static int type_bit(const char *t) {
    static const char *const n[] = {"string", "number", "integer", "boolean", "null", "object", "array"};
    for (int i = 0; i < 7; i++)
        if (t && !strcmp(t, n[i])) return 1 << i;
    return 0;
}

static int value_bits(const json_t *v) {
    if (json_is_string(v)) return T_STRING;
    if (json_is_integer(v)) return T_INTEGER | T_NUMBER;
    if (json_is_real(v)) return T_NUMBER | (json_real_value(v) == floor(json_real_value(v)) ? T_INTEGER : 0);
    if (json_is_boolean(v)) return T_BOOL;
    if (json_is_null(v)) return T_NULL;
    return json_is_object(v) ? T_OBJECT : T_ARRAY;
}

/* The JSON types a schema's documents may have (as schema.c produces them). */
static int types_of(const json_t *root, const json_t *j) {
    j = q35_schema_resolve(root, j);
    if (!json_is_object(j)) return 127;
    const json_t *en = json_object_get(j, "enum"), *cn = json_object_get(j, "const"), *t = json_object_get(j, "type");
    int bits = 0;
    if (cn) return value_bits(cn);
    if (json_is_array(en)) {
        size_t i;
        const json_t *v;
        json_array_foreach(en, i, v) bits |= value_bits(v);
        return bits;
    }
    if (json_is_string(t)) bits = type_bit(json_string_value(t));
    else if (json_is_array(t)) {
        size_t i;
        const json_t *v;
        json_array_foreach(t, i, v) bits |= type_bit(json_string_value(v));
    } else if (json_object_get(j, "properties") || json_object_get(j, "required")) bits = T_OBJECT;
    else if (json_object_get(j, "items") || json_object_get(j, "prefixItems")) bits = T_ARRAY;
    else return 127;
    if (bits & T_INTEGER) bits |= T_NUMBER;
    if (bits & T_NUMBER) bits |= T_INTEGER; /* a number schema may produce 1 */
    return bits;
}

static bool in_names(const json_t *arr, const char *k) {
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (json_is_string(json_array_get(arr, i)) && !strcmp(json_string_value(json_array_get(arr, i)), k)) return true;
    return false;
}

/* b requires a key that a's documents never hold (a produces only its properties and required keys). */
static bool requires_foreign_key(const json_t *a, const json_t *b) {
    const json_t *req = json_object_get(b, "required"), *props = json_object_get(a, "properties");
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *k = json_string_value(json_array_get(req, i));
        if (k && !json_object_get(props, k) && !in_names(json_object_get(a, "required"), k)) return true;
    }
    return false;
}

/* The values a property schema allows, when it is an enum or a const. */
static json_t *fixed_values(const json_t *root, const json_t *p) {
    p = q35_schema_resolve(root, p);
    const json_t *cn = json_object_get(p, "const"), *en = json_object_get(p, "enum");
    if (cn) return json_pack("[O]", cn);
    return json_is_array(en) ? json_incref((json_t *)en) : NULL;
}

/* A key both require whose fixed values (enum, const) are disjoint. */
static bool discriminated(const json_t *root, const json_t *a, const json_t *b) {
    const json_t *ra = json_object_get(a, "required");
    for (size_t i = 0; i < json_array_size(ra); i++) {
        const char *k = json_string_value(json_array_get(ra, i));
        if (!k || !in_names(json_object_get(b, "required"), k)) continue;
        json_t *va = fixed_values(root, json_object_get(json_object_get(a, "properties"), k));
        json_t *vb = fixed_values(root, json_object_get(json_object_get(b, "properties"), k));
        bool disjoint = va && vb;
        for (size_t x = 0; disjoint && x < json_array_size(va); x++)
            for (size_t y = 0; disjoint && y < json_array_size(vb); y++) disjoint = !json_equal(json_array_get(va, x), json_array_get(vb, y));
        json_decref(va);
        json_decref(vb);
        if (disjoint) return true;
    }
    return false;
}

int q35_schema_one_of_disjoint(const json_t *root, const json_t *alts, size_t *bad_a, size_t *bad_b) {
    for (size_t i = 0; i < json_array_size(alts); i++)
        for (size_t k = i + 1; k < json_array_size(alts); k++) {
            const json_t *a = q35_schema_resolve(root, json_array_get(alts, i)), *b = q35_schema_resolve(root, json_array_get(alts, k));
            int ta = types_of(root, a), tb = types_of(root, b);
            if (!(ta & tb)) continue;
            if (ta == T_OBJECT && tb == T_OBJECT &&
                ((requires_foreign_key(a, b) && requires_foreign_key(b, a)) || discriminated(root, a, b)))
                continue;
            if (json_object_get(a, "const") || json_is_array(json_object_get(a, "enum"))) {
                json_t *va = fixed_values(root, a), *vb = fixed_values(root, b);
                bool disjoint = va && vb;
                for (size_t x = 0; disjoint && x < json_array_size(va); x++)
                    for (size_t y = 0; disjoint && y < json_array_size(vb); y++)
                        disjoint = !json_equal(json_array_get(va, x), json_array_get(vb, y));
                json_decref(va);
                json_decref(vb);
                if (disjoint) continue;
            }
            *bad_a = i;
            *bad_b = k;
            return -1;
        }
    return 0;
}

/* ---- format ---- */

#define DATE "[1-9][0-9]{3}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
#define TIME "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define LABEL "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?"

const char *q35_schema_format_regex(const char *format) {
    static const char *const table[][2] = {
        {"date", "^" DATE "$"},
        {"time", "^" TIME "$"},
        {"date-time", "^" DATE "T" TIME "$"},
        {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
        {"email", "^[a-zA-Z0-9_+-]+(\\.[a-zA-Z0-9_+-]+)*@" LABEL "(\\." LABEL ")*\\.[a-z]{2,6}$"},
        {"ipv4", "^(" OCTET "\\.){3}" OCTET "$"},
        {"ipv6", "^([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}$"},
        {"hostname", "^" LABEL "(\\." LABEL ")*$"},
    };
    for (size_t i = 0; format && i < sizeof table / sizeof *table; i++)
        if (!strcmp(format, table[i][0])) return table[i][1];
    return NULL;
}

/* ---- numeric bounds ---- */

typedef struct sbuf { char *p; size_t n, cap; bool oom; } sbuf;

static void put(sbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        size_t cap = 2 * (b->n + k + 1);
        char *np = realloc(b->p, cap);
        if (!np) { b->oom = true; return; }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

/* The decimal strings from L to H, both n digits. */
static void same_length(sbuf *b, const char *L, const char *H, int n) {
    if (n == 0) return;
    char t[64];
    if (L[0] == H[0]) {
        snprintf(t, sizeof t, "%c", L[0]);
        put(b, t);
        same_length(b, L + 1, H + 1, n - 1);
        return;
    }
    bool low0 = strspn(L + 1, "0") == (size_t)(n - 1), high9 = strspn(H + 1, "9") == (size_t)(n - 1);
    if (low0 && high9) {
        snprintf(t, sizeof t, n > 1 ? "[%c-%c][0-9]{%d}" : "[%c-%c]", L[0], H[0], n - 1);
        put(b, t);
        return;
    }
    char nines[16], zeros[16];
    memset(nines, '9', (size_t)n - 1);
    memset(zeros, '0', (size_t)n - 1);
    nines[n - 1] = zeros[n - 1] = 0;
    put(b, "(");
    snprintf(t, sizeof t, "%c", L[0]);
    put(b, t);
    same_length(b, L + 1, nines, n - 1);
    if (L[0] + 1 <= H[0] - 1) {
        snprintf(t, sizeof t, "|[%c-%c][0-9]{%d}", L[0] + 1, H[0] - 1, n - 1);
        put(b, t);
    }
    snprintf(t, sizeof t, "|%c", H[0]);
    put(b, t);
    same_length(b, zeros, H + 1, n - 1);
    put(b, ")");
}

/* The non-negative integers in [lo, hi], as alternatives. */
static void nonneg(sbuf *b, long long lo, long long hi) {
    bool first = true;
    long long p = 1;
    for (int len = 1; len <= 15; len++, p *= 10) {
        long long a = len == 1 ? 0 : p, z = p * 10 - 1;
        if (a < lo) a = lo;
        if (z > hi) z = hi;
        if (a > z) continue;
        char A[32], Z[32];
        snprintf(A, sizeof A, "%lld", a);
        snprintf(Z, sizeof Z, "%lld", z);
        if (!first) put(b, "|");
        first = false;
        same_length(b, A, Z, len);
    }
}

/* integers in [lo, hi] (either side may be negative) as one group; false when empty */
static bool int_range(sbuf *b, long long lo, long long hi) {
    if (lo > hi) return false;
    put(b, "(");
    if (hi >= 0) nonneg(b, lo > 0 ? lo : 0, hi);
    if (lo < 0) {
        put(b, hi >= 0 ? "|-(" : "-(");
        nonneg(b, hi < 0 ? -hi : 1, -lo);
        put(b, ")");
    }
    put(b, ")");
    return true;
}

static double clampd(double x) { return x < -MAX_ABS ? -MAX_ABS : x > MAX_ABS ? MAX_ABS : x; }

int q35_schema_bounds_regex(const json_t *j, bool integer, char **out, char *msg, size_t msg_size) {
    *out = NULL;
    const json_t *mn = json_object_get(j, "minimum"), *mx = json_object_get(j, "maximum");
    const json_t *emn = json_object_get(j, "exclusiveMinimum"), *emx = json_object_get(j, "exclusiveMaximum");
    if (!mn && !mx && !json_is_number(emn) && !json_is_number(emx)) {
        if ((emn && !json_is_boolean(emn)) || (emx && !json_is_boolean(emx))) goto bad;
        return 0;
    }
    double lo = -INFINITY, hi = INFINITY;
    bool lo_ex = false, hi_ex = false;
    if (mn) { if (!json_is_number(mn)) goto bad; lo = json_number_value(mn); lo_ex = json_is_true(emn); }
    if (mx) { if (!json_is_number(mx)) goto bad; hi = json_number_value(mx); hi_ex = json_is_true(emx); }
    if (emn && !json_is_boolean(emn)) {
        if (!json_is_number(emn)) goto bad;
        double v = json_number_value(emn);
        if (v >= lo) { lo = v; lo_ex = true; }
    }
    if (emx && !json_is_boolean(emx)) {
        if (!json_is_number(emx)) goto bad;
        double v = json_number_value(emx);
        if (v <= hi) { hi = v; hi_ex = true; }
    }
    if (!isfinite(lo) && lo > 0) goto bad;
    if (!isfinite(hi) && hi < 0) goto bad;
    /* the integers allowed, and (numbers) the integer parts k that any fraction may follow */
    double ilo = clampd(lo_ex ? floor(lo) + 1 : ceil(lo)), ihi = clampd(hi_ex ? ceil(hi) - 1 : floor(hi));
    sbuf b = {0};
    put(&b, "^(");
    bool any = int_range(&b, (long long)ilo, (long long)ihi);
    if (!integer) {
        double plo = ilo > 0 ? ilo : 0, phi = clampd(floor(hi) - 1);         /* k.ddd in [k, k+1) */
        double nlo = clampd(hi_ex ? floor(-hi) + 1 : ceil(-hi)), nhi = clampd(floor(-lo) - 1); /* -k.ddd in (-k-1, -k] */
        if (nlo < 1) nlo = 1;
        bool zero = lo <= -1 && (hi_ex ? hi > 0 : hi >= 0);                   /* -0.ddd in (-1, 0] */
        if (plo <= phi || nlo <= nhi || zero) {
            put(&b, any ? "|(" : "(");
            bool more = false;
            if (plo <= phi) { int_range(&b, (long long)plo, (long long)phi); more = true; }
            if (nlo <= nhi) { put(&b, more ? "|-" : "-"); int_range(&b, (long long)nlo, (long long)nhi); more = true; }
            if (zero) put(&b, more ? "|-0" : "-0");
            put(&b, ")\\.[0-9]{1,15}");
            any = true;
        }
    }
    put(&b, ")$");
    if (b.oom || !any) {
        free(b.p);
        snprintf(msg, msg_size, b.oom ? "out of memory" : "no %s satisfies the schema's bounds", integer ? "integer" : "number");
        return -1;
    }
    *out = b.p;
    return 0;
bad:
    snprintf(msg, msg_size, "'minimum', 'maximum', 'exclusiveMinimum' and 'exclusiveMaximum' must be numbers (the latter two may be booleans beside the former)");
    return -1;
}
