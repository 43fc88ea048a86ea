/* sse.c: server-sent event framing (sse.h): "data: <payload>\n\n" appended
 * to a growing buffer that the HTTP side sends as it fills. */
#include "server/sse.h"
#include "server/buf.h"

#include <stdlib.h>
#include <string.h>

int q35_sse_append_raw(char **buf, size_t *len, size_t *cap, const char *data) {
    if (q35_text_append(buf, len, cap, "data: ", 6)) return -1;
    if (q35_text_append(buf, len, cap, data, strlen(data))) return -1;
    return q35_text_append(buf, len, cap, "\n\n", 2);
}

int q35_sse_append_json(char **buf, size_t *len, size_t *cap, const json_t *event) {
    /* compact JSON never contains a raw newline, so one data: line suffices */
    char *s = json_dumps(event, JSON_COMPACT);
    if (!s) return -1;
    int rc = q35_sse_append_raw(buf, len, cap, s);
    free(s);
    return rc;
}
