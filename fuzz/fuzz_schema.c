/* fuzz_schema.c: arbitrary schemas through the JSON Schema compiler (a
 * JSON array: a tools list through the tool-call compiler), and walks
 * through the recogniser of those it accepts. Input: the JSON text, a NUL
 * byte, then one byte per step choosing among the bytes the recogniser
 * allows. Every state must allow some byte or be a whole document, and
 * every whole schema document must parse as JSON. Two oracles for the
 * root's value: a string with a `pattern` must match it (PCRE2, whose
 * syntax covers schema_regex.c's subset), a number within minimum /
 * maximum (and the exclusive ones) must lie within them. */
#include "text/schema.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* The root's pattern matches the document's string (a search, as JSON Schema's). */
static void check_pattern(const json_t *schema, const json_t *doc) {
    const char *pat = json_string_value(json_object_get(schema, "pattern"));
    if (!pat || !json_is_string(doc)) return;
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, NULL);
    if (!re) return; /* the compiler took a pattern PCRE2 reads otherwise: nothing to compare */
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)json_string_value(doc), json_string_length(doc), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    if (rc < 0 && rc != PCRE2_ERROR_MATCHLIMIT) abort();
}

static void check_bounds(const json_t *schema, const json_t *doc) {
    if (!json_is_number(doc)) return;
    double v = json_number_value(doc);
    const json_t *mn = json_object_get(schema, "minimum"), *mx = json_object_get(schema, "maximum");
    const json_t *emn = json_object_get(schema, "exclusiveMinimum"), *emx = json_object_get(schema, "exclusiveMaximum");
    if (json_is_number(mn) && (json_is_true(emn) ? v <= json_number_value(mn) : v < json_number_value(mn))) abort();
    if (json_is_number(mx) && (json_is_true(emx) ? v >= json_number_value(mx) : v > json_number_value(mx))) abort();
    if (json_is_number(emn) && v <= json_number_value(emn)) abort();
    if (json_is_number(emx) && v >= json_number_value(emx)) abort();
    const char *t = json_string_value(json_object_get(schema, "type"));
    if (t && !strcmp(t, "integer") && v != floor(v)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t n_schema = nul ? (size_t)(nul - data) : size;
    json_t *j = json_loadb((const char *)data, n_schema, JSON_DECODE_ANY, NULL);
    if (!j) return 0;
    q35_schema *s;
    char where[256], msg[256];
    bool tools = json_is_array(j);
    if (tools ? q35_schema_compile_tool_call(j, NULL, &s, where, sizeof where, msg, sizeof msg)
              : q35_schema_compile(j, &s, where, sizeof where, msg, sizeof msg)) {
        if (!msg[0]) abort(); /* a refusal always says why */
        json_decref(j);
        return 0;
    }
    q35_schema_state st;
    q35_schema_start(s, &st);
    char doc[1024];
    size_t n = 0;
    for (size_t i = n_schema + 1; i < size && n < sizeof doc - 1; i++) {
        if (q35_schema_closed(s, &st)) break;
        int ok[256], n_ok = 0;
        for (int c = 1; c < 256; c++) {
            q35_schema_state t;
            q35_schema_copy(&t, &st);
            if (q35_schema_byte(s, &t, (unsigned char)c)) ok[n_ok++] = c;
        }
        if (!n_ok && !q35_schema_complete(s, &st)) abort(); /* stuck */
        if (!n_ok || data[i] == 0xFF) break;
        int c = ok[data[i] % n_ok];
        if (!q35_schema_byte(s, &st, (unsigned char)c)) abort();
        doc[n++] = (char)c;
    }
    if (!tools && q35_schema_complete(s, &st)) {
        json_t *d = json_loadb(doc, n, JSON_DECODE_ANY, NULL);
        if (!d) abort();
        check_pattern(j, d);
        check_bounds(j, d);
        json_decref(d);
    }
    json_decref(j);
    q35_schema_free(s);
    return 0;
}
