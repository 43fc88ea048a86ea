/* pyjson.c: Python-compatible JSON and str() output (pyjson.h). */
#include "text/pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void q35_py_float_repr(double x, q35_buf *out) {
    if (isnan(x)) { q35_buf_puts(out, "NaN"); return; }
    if (isinf(x)) { q35_buf_puts(out, x < 0 ? "-Infinity" : "Infinity"); return; }
    char e[40];
    /* Shortest round-tripping digits, as Python's repr (David Gay's mode 0). */
    for (int prec = 0; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e is "-d.ddde+XX": split into sign, digits and decimal exponent. */
    const char *p = e;
    bool neg = *p == '-';
    if (neg) p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(p + 1);  /* x = d.ddd * 10^exp10 */
    int decpt = exp10 + 1;    /* digits before the decimal point */
    if (neg) q35_buf_putc(out, '-');
    if (decpt > -4 && decpt <= 16) { /* Python: fixed unless decpt <= -4 or decpt > 16 */
        if (decpt <= 0) {
            q35_buf_puts(out, "0.");
            for (int i = 0; i < -decpt; i++) q35_buf_putc(out, '0');
            q35_buf_append(out, digits, (size_t)nd);
        } else if (decpt >= nd) {
            q35_buf_append(out, digits, (size_t)nd);
            for (int i = nd; i < decpt; i++) q35_buf_putc(out, '0');
            q35_buf_puts(out, ".0");
        } else {
            q35_buf_append(out, digits, (size_t)decpt);
            q35_buf_putc(out, '.');
            q35_buf_append(out, digits + decpt, (size_t)(nd - decpt));
        }
    } else {
        q35_buf_putc(out, digits[0]);
        if (nd > 1) {
            q35_buf_putc(out, '.');
            q35_buf_append(out, digits + 1, (size_t)(nd - 1));
        }
        q35_buf_printf(out, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static void dump_string(const char *s, size_t n, q35_buf *out) {
    q35_buf_putc(out, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char hex[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) { snprintf(hex, sizeof hex, "\\u%04x", c); esc = hex; }
        }
        if (!esc) continue;
        q35_buf_append(out, s + run, i - run);
        q35_buf_puts(out, esc);
        run = i + 1;
    }
    q35_buf_append(out, s + run, n - run);
    q35_buf_putc(out, '"');
}

void q35_py_json_dumps(const json_t *v, q35_buf *out) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        bool first = true;
        q35_buf_putc(out, '{');
        json_object_foreach((json_t *)v, key, val) {
            if (!first) q35_buf_puts(out, ", ");
            first = false;
            dump_string(key, strlen(key), out);
            q35_buf_puts(out, ": ");
            q35_py_json_dumps(val, out);
        }
        q35_buf_putc(out, '}');
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *val;
        q35_buf_putc(out, '[');
        json_array_foreach(v, i, val) {
            if (i) q35_buf_puts(out, ", ");
            q35_py_json_dumps(val, out);
        }
        q35_buf_putc(out, ']');
        break;
    }
    case JSON_STRING: dump_string(json_string_value(v), json_string_length(v), out); break;
    case JSON_INTEGER: q35_buf_printf(out, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: q35_py_float_repr(json_real_value(v), out); break;
    case JSON_TRUE: q35_buf_puts(out, "true"); break;
    case JSON_FALSE: q35_buf_puts(out, "false"); break;
    case JSON_NULL: q35_buf_puts(out, "null"); break;
    }
}

bool q35_py_str(const json_t *v, q35_buf *out) {
    switch (json_typeof(v)) {
    case JSON_STRING: q35_buf_append(out, json_string_value(v), json_string_length(v)); return true;
    case JSON_INTEGER: q35_buf_printf(out, "%lld", (long long)json_integer_value(v)); return true;
    case JSON_REAL: q35_py_float_repr(json_real_value(v), out); return true;
    case JSON_TRUE: q35_buf_puts(out, "True"); return true;
    case JSON_FALSE: q35_buf_puts(out, "False"); return true;
    case JSON_NULL: q35_buf_puts(out, "None"); return true;
    default: return false;
    }
}
