/* fuzz_schema.c: arbitrary schemas through the JSON Schema compiler (a
 * JSON array: a tools list through the tool-call compiler), and walks
 * through the recogniser of those it accepts. Input: the JSON text, a NUL
 * byte, then one byte per step choosing among the bytes the recogniser
 * allows. Every state must allow some byte or be a whole document, and
 * every whole schema document must parse as JSON. */
#include "text/schema.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

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
    json_decref(j);
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
        json_decref(d);
    }
    q35_schema_free(s);
    return 0;
}
