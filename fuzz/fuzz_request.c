/* libFuzzer target: request validation of `qwen35 serve` on arbitrary bytes.
 * The first byte picks the endpoint (completions, chat, or llama-server's
 * /completion, whose body is translated first); the rest is the body. Any input must give 0 with a consistent request, or an HTTP status
 * with a message; never a crash, a leak or an out-of-bounds read. The
 * accepted requests also drive the length check and the stop matcher. */
#include "server/llama.h"
#include "server/request.h"
#include "server/stop.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    static const q35_api_limits lim = {.served_model_name = "Qwen/Qwen3.5-9B", .max_model_len = 4096,
                                       .vocab_size = 320, .max_n = 16, .max_logprobs = 20, .max_total_tokens = 32768,
                                       .max_stop = 16, .max_stop_len = 256, .max_prompts = 64, .vision = true,
                                       .max_images = 4};
    q35_api_kind kind = data[0] & 1 ? Q35_API_CHAT : Q35_API_COMPLETION;
    char *body = malloc(size - 1 ? size - 1 : 1);
    memcpy(body, data + 1, size - 1);
    size_t len = size - 1;
    q35_api_request r;
    char msg[1024], param[128];
    if (kind == Q35_API_COMPLETION && data[0] & 2) {
        char *t = q35_llama_completion_body(body, len, msg, sizeof msg);
        free(body);
        if (!t) { assert(msg[0]); return 0; }
        body = t;
        len = strlen(t);
    }
    int st = q35_api_parse(body, len, kind, &lim, &r, msg, sizeof msg, param, sizeof param);
    if (st == 0) {
        assert(r.n >= 1 && r.n <= lim.max_n);
        assert(r.logprobs <= lim.max_logprobs);
        assert(kind == Q35_API_CHAT ? r.messages != NULL : r.n_prompts >= 1);
        assert(r.n_images >= 0 && r.n_images <= lim.max_images);
        for (int32_t i = 0; i < r.n_images; i++) assert(r.images[i].url && r.images[i].url[0]);
        for (int32_t i = 0; i < r.n_bias; i++) assert(r.bias_ids[i] >= 0 && r.bias_ids[i] < lim.vocab_size && fabsf(r.bias[i]) <= 100);
        for (int32_t i = 0; i < r.n_prompts; i++) {
            const q35_api_prompt *p = &r.prompts[i];
            assert(!!p->text != !!p->ids);
            for (int32_t k = 0; k < p->n_ids; k++) assert(p->ids[k] >= 0 && p->ids[k] < lim.vocab_size);
            int32_t mt;
            if (p->ids && q35_api_check_length(&r, p->n_ids, &lim, &mt, msg, sizeof msg) == 0)
                assert(mt >= 1 && p->n_ids + mt <= lim.max_model_len);
        }
        q35_stop_matcher m;
        q35_stop_init(&m, r.stop, r.n_stop);
        for (int32_t i = 0; i < r.n_prompts; i++)
            if (r.prompts[i].text) {
                long n = q35_stop_feed(&m, r.prompts[i].text, strlen(r.prompts[i].text));
                assert(n >= 0 && (size_t)n <= strlen(q35_stop_text(&m)));
                q35_stop_consume(&m, (size_t)n);
            }
        q35_stop_free(&m);
        q35_api_request_free(&r);
    } else {
        assert(st == 400 || st == 404 || st == 500);
        assert(msg[0]);
    }
    free(body);
    return 0;
}
