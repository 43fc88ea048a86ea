/* prompt.c: a parsed request's prompts to token ids (prompt.h). Completion
 * prompts are ids already or text to tokenize; chat renders its messages
 * (and tools) with the Qwen3.5 template first. Each prompt's max_tokens is
 * resolved against the context, and a chat's turn boundary found for the
 * scheduler's turn snapshot. A chat's images (loaded already, images.c)
 * widen their placeholders to their token counts here. */
#include "server/prompt.h"

#include "server/images.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Assistant prefill, as transformers' continue_final_message: the rendered
 * chat is cut just after the last occurrence of the final message's text
 * (stripped; a list's last text part), so the model continues it. */
static int continue_final(const json_t *messages, char *text) {
    const json_t *c = json_object_get(json_array_get(messages, json_array_size(messages) - 1), "content");
    for (size_t i = json_array_size(c); i-- > 0 && !json_is_string(c);)
        if (json_is_string(json_object_get(json_array_get(c, i), "text"))) c = json_object_get(json_array_get(c, i), "text");
    const char *s = json_is_string(c) ? json_string_value(c) : "";
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) n--;
    while (n && isspace((unsigned char)*s)) { s++; n--; }
    if (!n) return 0; /* rindex("") is the end: the text stays whole */
    char *at = NULL;
    for (char *p = text; *p; p++)
        if (!strncmp(p, s, n)) at = p;
    if (!at) return -1;
    at[n] = 0;
    return 0;
}

/* Text (to tokenize) of prompt i, or NULL when it is token ids; chat renders
 * its messages with the model's template (r->chat). *owned is set when the caller
 * must free the text. */
static int prompt_text(const q35_task *r, int32_t i, int add_generation_prompt, char **text, bool *owned, char *msg,
                       size_t msg_size, int *status) {
    *owned = false;
    *text = NULL;
    if (r->api.kind != Q35_API_CHAT) {
        *text = r->api.prompts[i].text;
        return 0;
    }
    char *mj = json_dumps(r->api.messages, JSON_COMPACT);
    char *tj = r->tools_json;
    q35_chat_options o = r->chat;
    o.add_generation_prompt = add_generation_prompt && !r->api.continue_final;
    q35_error err = {0};
    q35_status st = mj ? q35_chat_render(mj, tj, &o, text, &err) : Q35_ERR_NOMEM;
    free(mj);
    if (st) {
        *status = st == Q35_ERR_ARG ? 400 : 500;
        snprintf(msg, msg_size, "%s", st == Q35_ERR_NOMEM ? "out of memory" : err.msg);
        return -1;
    }
    *owned = true;
    if (add_generation_prompt && r->api.continue_final && continue_final(r->api.messages, *text)) {
        free(*text);
        *text = NULL;
        *owned = false;
        *status = 400;
        snprintf(msg, msg_size, "the final assistant message does not appear in the rendered chat, so it cannot be continued");
        return -1;
    }
    return 0;
}

/* Where a follow-up of this chat stops sharing its prompt: the template
 * writes an earlier assistant turn as "<|im_start|>assistant\n" + content,
 * without the think block the generation prompt opened, so the state worth
 * keeping ends just after "<|im_start|>assistant\n". 0 when unknown. */
static int32_t turn_boundary(const q35_tokenizer *tok, const q35_task *r) {
    char *text, msg[256];
    bool owned;
    int status;
    if (prompt_text(r, 0, 0, &text, &owned, msg, sizeof msg, &status)) return 0;
    int32_t *ids = NULL, *head = NULL;
    size_t n = 0, m = 0;
    q35_error err;
    static const char opener[] = "<|im_start|>assistant\n";
    int32_t at = 0;
    char why[256];
    if (!q35_tokenize(tok, text, strlen(text), 1, &ids, &n, &err) &&
        !q35_api_images_expand(&r->api, q35_image_pad_id(tok), &ids, &n, NULL, why, sizeof why) &&
        !q35_tokenize(tok, opener, sizeof opener - 1, 1, &head, &m, &err)) {
        const int32_t *p = r->prompt_ids[0];
        size_t np = (size_t)r->prompt_len[0];
        if (n <= np && !memcmp(ids, p, n * sizeof *p)) {
            at = (int32_t)n;
            if (n + m <= np && !memcmp(head, p + n, m * sizeof *p)) at += (int32_t)m;
        }
    }
    free(ids);
    free(head);
    if (owned) free(text);
    return at;
}

int q35_prompt_prepare(const q35_tokenizer *tok, const q35_api_limits *lim, q35_task *r, char *msg, size_t msg_size, int *status) {
    if (r->api.kind == Q35_API_CHAT) r->api.n_prompts = 1;
    int32_t np = r->api.n_prompts;
    if (q35_task_alloc(r)) { *status = 500; snprintf(msg, msg_size, "out of memory"); return -1; }
    for (int32_t i = 0; i < np; i++) {
        bool is_text = r->api.kind == Q35_API_CHAT || r->api.prompts[i].text;
        if (is_text && !tok) {
            *status = 501;
            snprintf(msg, msg_size, r->api.kind == Q35_API_CHAT
                     ? "this model directory has no tokenizer, so chat is not available; use /v1/completions with token ids"
                     : "this model directory has no tokenizer, so text prompts are not available; send token ids");
            return -1;
        }
        if (is_text) {
            char *text;
            bool owned;
            if (prompt_text(r, i, r->api.add_generation_prompt || r->api.continue_final, &text, &owned, msg, msg_size, status))
                return -1;
            size_t n = 0;
            q35_error err = {0};
            /* special tokens written in the text are parsed, as HF's encode does by default */
            q35_status st = q35_tokenize(tok, text, strlen(text), 1, &r->prompt_ids[i], &n, &err);
            if (owned) free(text);
            if (st) { *status = st == Q35_ERR_NOMEM ? 500 : 400; snprintf(msg, msg_size, "%s", err.msg); return -1; }
            if (r->api.n_images) {
                int32_t pad = q35_image_pad_id(tok);
                if (pad < 0) { *status = 400; snprintf(msg, msg_size, "the tokenizer has no <|image_pad|> token, so images cannot be placed"); return -1; }
                free(r->api.spans);
                r->api.spans = NULL;
                if ((*status = q35_api_images_expand(&r->api, pad, &r->prompt_ids[i], &n, &r->api.spans, msg, msg_size))) return -1;
                r->api.n_spans = r->api.n_images;
            }
            if (n == 0 || n > INT32_MAX / 2) { *status = 400; snprintf(msg, msg_size, "the prompt is empty after tokenization"); return -1; }
            r->prompt_len[i] = (int32_t)n;
            for (size_t k = 0; k < n; k++)
                if (r->prompt_ids[i][k] >= lim->vocab_size) {
                    *status = 400;
                    snprintf(msg, msg_size, "the tokenizer gave id %d, outside the model's vocabulary of %d", r->prompt_ids[i][k], lim->vocab_size);
                    return -1;
                }
        } else {
            q35_api_prompt *p = &r->api.prompts[i];
            r->prompt_ids[i] = malloc(sizeof(int32_t) * (size_t)p->n_ids);
            if (!r->prompt_ids[i]) { *status = 500; snprintf(msg, msg_size, "out of memory"); return -1; }
            memcpy(r->prompt_ids[i], p->ids, sizeof(int32_t) * (size_t)p->n_ids);
            r->prompt_len[i] = p->n_ids;
        }
        if ((*status = q35_api_check_length(&r->api, r->prompt_len[i], lim, &r->max_tokens[i], msg, msg_size))) return -1;
    }
    if (r->api.kind == Q35_API_CHAT) r->turn_snap = turn_boundary(tok, r);
    if (q35_task_alloc_prompt_lp(r)) { *status = 500; snprintf(msg, msg_size, "out of memory"); return -1; }
    return 0;
}
