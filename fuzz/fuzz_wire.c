/* libFuzzer target: the first-request-line check and the raw error
 * responses of `qwen35 serve` (src/server/wire.c) on arbitrary bytes. The
 * check must give one of its statuses, decide at the first end of line
 * (more bytes never change a decision), and never read past the input; an
 * error response with any message must be whole, with a JSON body. */
#include "server/wire.h"

#include <assert.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    int st = q35_wire_request_line(buf, size);
    assert(st == 0 || st == 200 || st == 400 || st == 414 || st == 505);
    for (size_t k = size; st && k > 0 && k > size - 8; k--) { /* a decision made on a prefix holds for the whole */
        int pre = q35_wire_request_line(buf, k - 1);
        assert(pre == 0 || pre == st);
    }
    char *msg = malloc(size + 1);
    memcpy(msg, data, size);
    msg[size] = 0;
    char out[4096];
    size_t n = q35_wire_error(400, msg, out, sizeof out);
    if (n) {
        const char *body = strstr(out, "\r\n\r\n");
        assert(body && body < out + n);
        json_t *j = json_loadb(body + 4, n - (size_t)(body + 4 - out), 0, NULL);
        /* jansson refuses invalid UTF-8 in a message: then there is no body, and no response */
        assert(j && json_is_object(json_object_get(j, "error")));
        json_decref(j);
    }
    free(msg);
    free(buf);
    return 0;
}
