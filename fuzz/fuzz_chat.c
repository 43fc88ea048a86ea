/* fuzz_chat.c: arbitrary bytes as a chat request's messages (and, after a
 * 0xFF byte, its tools) through the Qwen3.5 chat renderer. */
#include "qwen35.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    char *buf = malloc(size + 1);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    char *tools = memchr(buf, 0xFF, size - 1);
    if (tools) *tools++ = 0;
    q35_chat_options opt = {.add_generation_prompt = data[0] & 1, .enable_thinking = (data[0] >> 1 & 3) - 1,
                            .add_vision_id = data[0] & 8, .variant = data[0] >> 4 & 3};
    char *text = NULL;
    q35_error err = {0};
    q35_status st = q35_chat_render(buf, tools, &opt, &text, &err);
    if ((st == Q35_OK) != (text != NULL)) abort();
    free(text);
    free(buf);
    return 0;
}
