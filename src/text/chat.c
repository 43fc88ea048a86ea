/* chat.c: the Qwen3.5 chat templates (tests/data/chat: the 0.8B's and the
 * 9B's, which differ only in the generation prompt) written out in C, so a
 * request's messages become exactly the prompt text transformers'
 * apply_chat_template renders, without a Jinja engine.
 *
 * The functions follow the template's blocks in order: the tools/system
 * header, the backward scan for the last real user query, then one branch
 * per role, then the generation prompt. Where Jinja and Python semantics
 * leak into the output they are reproduced: |trim is str.strip() (Unicode
 * whitespace), |tojson is json.dumps(ensure_ascii=False), |string is str()
 * (True, None, float repr), `'x' in item` is a key test on a mapping and a
 * substring test on a string. Every raise_exception of the template is an
 * error here with the same message; inputs Jinja would reject with a type
 * error are errors too. Before rendering, reasoning given as "thinking" or
 * "reasoning" is read as reasoning_content, as transformers does. The demo
 * model's ChatML template has its own short renderer, and q35_chat_identify
 * tells the templates apart by their SHA-256. */
#include "text/pyjson.h"
#include "base/util.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct render {
    const q35_chat_options *opt;
    q35_buf out;
    int image_count, video_count;
    q35_error *err;
    bool failed;
} render;

static bool fail(render *r, const char *msg) {
    if (!r->failed) q35_fail(r->err, Q35_ERR_ARG, "chat template: %s", msg);
    r->failed = true;
    return false;
}

static const char *str_of(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool str_is(const json_t *obj, const char *key, const char *want) {
    const char *s = str_of(obj, key);
    return s && !strcmp(s, want);
}

/* Jinja's `needle in item` for the item kinds a content list may hold. */
static bool jinja_in(render *r, const char *needle, const json_t *item, bool *ok) {
    *ok = true;
    if (json_is_object(item)) return json_object_get(item, needle) != NULL;
    if (json_is_string(item)) return strstr(json_string_value(item), needle) != NULL;
    if (json_is_array(item)) {
        size_t i;
        json_t *v;
        json_array_foreach(item, i, v) if (json_is_string(v) && !strcmp(json_string_value(v), needle)) return true;
        return false;
    }
    *ok = false;
    fail(r, "a content item is not iterable");
    return false;
}

static bool vision(render *r, q35_buf *b, bool is_system, bool count, bool video) {
    if (is_system) return fail(r, video ? "System message cannot contain videos." : "System message cannot contain images.");
    int *n = video ? &r->video_count : &r->image_count;
    if (count) ++*n;
    if (r->opt->add_vision_id) q35_buf_printf(b, "%s %d: ", video ? "Video" : "Picture", *n);
    q35_buf_puts(b, video ? "<|vision_start|><|video_pad|><|vision_end|>" : "<|vision_start|><|image_pad|><|vision_end|>");
    return true;
}

/* The template's render_content macro. */
static bool render_content(render *r, const json_t *content, bool do_vision_count, bool is_system, q35_buf *b) {
    if (!content || json_is_null(content)) return true;
    if (json_is_string(content)) {
        q35_buf_append(b, json_string_value(content), json_string_length(content));
        return true;
    }
    if (!json_is_array(content)) return fail(r, "Unexpected content type.");
    size_t i;
    json_t *item;
    json_array_foreach(content, i, item) {
        bool ok;
        bool image = jinja_in(r, "image", item, &ok);
        if (!ok) return false;
        image = image || jinja_in(r, "image_url", item, &ok) || str_is(item, "type", "image");
        if (image) {
            if (!vision(r, b, is_system, do_vision_count, false)) return false;
            continue;
        }
        if (jinja_in(r, "video", item, &ok) || str_is(item, "type", "video")) {
            if (!vision(r, b, is_system, do_vision_count, true)) return false;
            continue;
        }
        if (jinja_in(r, "text", item, &ok)) {
            json_t *text = json_is_object(item) ? json_object_get(item, "text") : NULL; /* else undefined: "" */
            if (text && !q35_py_str(text, b)) return fail(r, "a text item's text is not a string");
            continue;
        }
        return fail(r, "Unexpected item type in content.");
    }
    return true;
}

/* Python's str.strip(), str.lstrip('\n') and str.rstrip('\n') on [s, s+n). */
static void py_strip(const char **s, size_t *n) {
    const char *p = *s, *end = *s + *n;
    while (p < end) {
        uint32_t cp;
        size_t k = q35_utf8_next(p, (size_t)(end - p), &cp);
        if (!q35_py_isspace(cp)) break;
        p += k;
    }
    while (end > p) {
        const char *q = end - 1;
        while (q > p && ((uint8_t)*q & 0xC0) == 0x80) q--;
        uint32_t cp;
        q35_utf8_next(q, (size_t)(end - q), &cp);
        if (!q35_py_isspace(cp)) break;
        end = q;
    }
    *s = p;
    *n = (size_t)(end - p);
}

/* render_content(...)|trim into a fresh buffer. */
static bool content_trimmed(render *r, const json_t *msg, bool do_vision_count, bool is_system, q35_buf *out) {
    q35_buf raw = {0};
    bool ok = render_content(r, json_object_get(msg, "content"), do_vision_count, is_system, &raw);
    const char *s = raw.data ? raw.data : "";
    size_t n = raw.len;
    py_strip(&s, &n);
    q35_buf_append(out, s, n);
    q35_buf_free(&raw);
    return ok;
}

static bool starts_with(const char *s, size_t n, const char *p) {
    size_t k = strlen(p);
    return n >= k && !memcmp(s, p, k);
}

static bool ends_with(const char *s, size_t n, const char *p) {
    size_t k = strlen(p);
    return n >= k && !memcmp(s + n - k, p, k);
}

static const char *memfind(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

static const char *memfind_last(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

static const json_t *reasoning_of(const json_t *msg) {
    static const char *const names[] = {"reasoning_content", "thinking", "reasoning"};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(msg, names[i]);
        if (v && !json_is_null(v)) return v;
    }
    return NULL;
}

static bool render_tool_calls(render *r, const json_t *calls, const char *content, size_t content_len) {
    if (json_is_string(calls) && json_string_length(calls) > 0)
        return fail(r, "tool_calls is a string"); /* Jinja would iterate its characters and fail on .name */
    if (!json_is_array(calls)) return true;
    const char *c = content;
    size_t cn = content_len;
    py_strip(&c, &cn);
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *fn = json_is_object(call) && json_object_get(call, "function") ? json_object_get(call, "function") : call;
        const char *name = json_is_object(fn) ? str_of(fn, "name") : NULL;
        if (!name) return fail(r, "a tool call has no string name");
        q35_buf_printf(&r->out, "%s<tool_call>\n<function=%s>\n", i ? "\n" : cn ? "\n\n" : "", name);
        json_t *args = json_object_get(fn, "arguments"), *parsed = NULL;
        if (args && json_is_string(args)) {
            /* OpenAI clients send arguments as a JSON string; the template
             * needs the mapping (|items), so it is parsed here. */
            parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, NULL);
            if (!json_is_object(parsed)) {
                json_decref(parsed);
                return fail(r, "tool call arguments are a string that is not a JSON object");
            }
            args = parsed;
        }
        if (args && !json_is_object(args)) return fail(r, "Can only get item pairs from a mapping.");
        const char *key;
        json_t *val;
        json_object_foreach(args, key, val) {
            q35_buf_printf(&r->out, "<parameter=%s>\n", key);
            if (json_is_object(val) || json_is_array(val)) q35_py_json_dumps(val, &r->out);
            else q35_py_str(val, &r->out);
            q35_buf_puts(&r->out, "\n</parameter>\n");
        }
        json_decref(parsed);
        q35_buf_puts(&r->out, "</function>\n</tool_call>");
    }
    return true;
}

static bool render_assistant(render *r, const json_t *msg, const char *content, size_t n, bool keep_reasoning) {
    const char *reasoning = "";
    size_t rn = 0;
    const json_t *rc = reasoning_of(msg);
    if (json_is_string(rc)) {
        reasoning = json_string_value(rc);
        rn = json_string_length(rc);
    } else if (memfind(content, n, "</think>")) {
        /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        const char *close = memfind(content, n, "</think>");
        size_t before = (size_t)(close - content);
        while (before && content[before - 1] == '\n') before--;
        const char *open = memfind_last(content, before, "<think>");
        reasoning = open ? open + 7 : content;
        rn = (size_t)(content + before - reasoning);
        while (rn && *reasoning == '\n') { reasoning++; rn--; }
        /* content.split('</think>')[-1].lstrip('\n') */
        const char *last = memfind_last(content, n, "</think>") + 8;
        n -= (size_t)(last - content);
        content = last;
        while (n && *content == '\n') { content++; n--; }
    }
    py_strip(&reasoning, &rn);
    q35_buf_puts(&r->out, "<|im_start|>assistant\n");
    if (keep_reasoning) {
        q35_buf_puts(&r->out, "<think>\n");
        q35_buf_append(&r->out, reasoning, rn);
        q35_buf_puts(&r->out, "\n</think>\n\n");
    }
    q35_buf_append(&r->out, content, n);
    json_t *calls = json_object_get(msg, "tool_calls");
    if (calls && !render_tool_calls(r, calls, content, n)) return false;
    q35_buf_puts(&r->out, "<|im_end|>\n");
    return true;
}

static bool render_header(render *r, const json_t *messages, const json_t *tools) {
    const json_t *first = json_array_get(messages, 0);
    bool has_system = str_is(first, "role", "system");
    q35_buf sys = {0};
    if (has_system && !content_trimmed(r, first, false, true, &sys)) {
        q35_buf_free(&sys);
        return false;
    }
    if (json_is_array(tools) && json_array_size(tools) > 0) {
        q35_buf_puts(&r->out, "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>");
        size_t i;
        json_t *tool;
        json_array_foreach(tools, i, tool) {
            q35_buf_putc(&r->out, '\n');
            q35_py_json_dumps(tool, &r->out);
        }
        q35_buf_puts(&r->out,
                     "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
                     "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
                     "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
                     "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
                     "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
                     "within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n"
                     "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
                     "but NOT after\n- If there is no function call available, answer the question like normal with your current "
                     "knowledge and do not tell the user about function calls\n</IMPORTANT>");
        if (sys.len) {
            q35_buf_puts(&r->out, "\n\n");
            q35_buf_append(&r->out, sys.data, sys.len);
        }
        q35_buf_puts(&r->out, "<|im_end|>\n");
    } else if (has_system) {
        q35_buf_puts(&r->out, "<|im_start|>system\n");
        q35_buf_append(&r->out, sys.data ? sys.data : "", sys.len);
        q35_buf_puts(&r->out, "<|im_end|>\n");
    }
    q35_buf_free(&sys);
    return true;
}

/* The last user message that is not only a <tool_response> block; -1 if none. */
static bool last_query_index(render *r, const json_t *messages, long *out) {
    for (size_t i = json_array_size(messages); i-- > 0;) {
        const json_t *m = json_array_get(messages, i);
        if (!str_is(m, "role", "user")) continue;
        q35_buf c = {0};
        bool ok = content_trimmed(r, m, false, false, &c);
        const char *s = c.data ? c.data : "";
        bool wrapped = starts_with(s, c.len, "<tool_response>") && ends_with(s, c.len, "</tool_response>");
        q35_buf_free(&c);
        if (!ok) return false;
        if (!wrapped) {
            *out = (long)i;
            return true;
        }
    }
    return fail(r, "No user query found in messages.");
}

static bool render_messages(render *r, const json_t *messages, const json_t *tools) {
    size_t n = json_array_size(messages);
    if (n == 0) return fail(r, "No messages provided.");
    for (size_t i = 0; i < n; i++)
        if (!json_is_object(json_array_get(messages, i))) return fail(r, "a message is not an object");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) return fail(r, "tools is not an array");
    for (size_t i = 0; i < json_array_size(tools); i++)
        if (!json_is_object(json_array_get(tools, i))) return fail(r, "a tool is not an object");
    long last_query;
    if (!render_header(r, messages, tools) || !last_query_index(r, messages, &last_query)) return false;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(messages, i);
        q35_buf content = {0};
        bool ok = content_trimmed(r, m, true, false, &content);
        const char *c = content.data ? content.data : "";
        if (!ok) {
        } else if (str_is(m, "role", "system")) {
            if (i != 0) ok = fail(r, "System message must be at the beginning.");
        } else if (str_is(m, "role", "user")) {
            q35_buf_puts(&r->out, "<|im_start|>user\n");
            q35_buf_append(&r->out, c, content.len);
            q35_buf_puts(&r->out, "<|im_end|>\n");
        } else if (str_is(m, "role", "assistant")) {
            ok = render_assistant(r, m, c, content.len, (long)i > last_query);
        } else if (str_is(m, "role", "tool")) {
            /* loop.previtem is undefined for the first message: no opening then. */
            if (i > 0 && !str_is(json_array_get(messages, i - 1), "role", "tool")) q35_buf_puts(&r->out, "<|im_start|>user");
            q35_buf_puts(&r->out, "\n<tool_response>\n");
            q35_buf_append(&r->out, c, content.len);
            q35_buf_puts(&r->out, "\n</tool_response>");
            if (i + 1 == n || !str_is(json_array_get(messages, i + 1), "role", "tool")) q35_buf_puts(&r->out, "<|im_end|>\n");
        } else ok = fail(r, "Unexpected message role.");
        q35_buf_free(&content);
        if (!ok) return false;
    }
    if (r->opt->add_generation_prompt)
        q35_buf_puts(&r->out, q35_chat_thinks(r->opt) ? "<|im_start|>assistant\n<think>\n"
                                                      : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    return true;
}

/* The demo model's ChatML template (models/qwen35-demo/chat_template.jinja),
 * and with `vision` the same template with image parts (Q35_CHAT_DEMO_VISION):
 * each message as <|im_start|>role\ncontent|trim<|im_end|>\n, content
 * being a string, none (''), or its parts concatenated: a part of type
 * 'text' as its text, one of type 'image' or 'image_url' (with `vision`) as
 * the image block, after "Picture N: " with add_vision_id (N counts the
 * conversation's images), any other part as nothing; without `vision` (the
 * text-only template) image parts are nothing too. No tools, no
 * reasoning; the generation prompt writes an empty think block only when
 * enable_thinking is false. */
static bool render_demo(render *r, const json_t *messages, bool vision) {
    size_t n = json_array_size(messages);
    if (n == 0) return fail(r, "No messages provided.");
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(messages, i);
        const char *role = json_is_object(m) ? str_of(m, "role") : NULL;
        if (role && !strcmp(role, "system") && i > 0) return fail(r, "System message must be at the beginning.");
        if (!role) return fail(r, "a message has no string role");
        const json_t *content = json_object_get(m, "content");
        q35_buf text = {0};
        bool ok = true;
        if (json_is_string(content)) q35_buf_append(&text, json_string_value(content), json_string_length(content));
        else if (json_is_array(content)) {
            size_t j;
            json_t *part;
            json_array_foreach(content, j, part) {
                if (!json_is_object(part)) continue;
                if (vision && (str_is(part, "type", "image") || str_is(part, "type", "image_url"))) {
                    if (r->opt->add_vision_id) q35_buf_printf(&text, "Picture %d: ", ++r->image_count);
                    else r->image_count++;
                    q35_buf_puts(&text, "<|vision_start|><|image_pad|><|vision_end|>");
                    continue;
                }
                if (!str_is(part, "type", "text")) continue;
                json_t *t = json_object_get(part, "text"); /* undefined: '' */
                if (t && !q35_py_str(t, &text)) ok = fail(r, "a text part's text is not a string");
            }
        } else if (content && !json_is_null(content) && !json_is_object(content)) ok = fail(r, "the content is not iterable");
        const char *c = text.data ? text.data : "";
        size_t cn = text.len;
        py_strip(&c, &cn);
        q35_buf_printf(&r->out, "<|im_start|>%s\n", role);
        q35_buf_append(&r->out, c, cn);
        q35_buf_puts(&r->out, "<|im_end|>\n");
        q35_buf_free(&text);
        if (!ok) return false;
    }
    if (r->opt->add_generation_prompt) {
        q35_buf_puts(&r->out, "<|im_start|>assistant\n");
        if (r->opt->enable_thinking < 0) q35_buf_puts(&r->out, "<think>\n\n</think>\n\n");
    }
    return true;
}

int q35_chat_thinks(const q35_chat_options *opt) {
    switch (opt->variant) {
    case Q35_CHAT_QWEN35_9B: return opt->enable_thinking >= 0;
    case Q35_CHAT_DEMO:
    case Q35_CHAT_DEMO_VISION: return 0;
    default: return opt->enable_thinking > 0;
    }
}

/* The published templates by SHA-256. */
static const struct { const char *sha256; int variant; } known_templates[] = {
    {"ad22cb6365e58696ffc10f1fbfc5f09b8762d0486df899e8f18b0491906e0b21", Q35_CHAT_QWEN35_SMALL}, /* Qwen3.5-0.8B */
    {"a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715", Q35_CHAT_QWEN35_9B},    /* Qwen3.5-9B */
    {"9d002d01b7392892fe37a3ea70ee8f3ce5745319bb4208d01ab88440634f2259", Q35_CHAT_DEMO},         /* models/qwen35-demo */
    {"2781d0707add9f1f41d46053d76ded4924989704959204a0ad15fd11e34985e2", Q35_CHAT_DEMO_VISION},  /* the same with images */
};

/* tokenizer_config.json's chat_template: a string, or a list of {name, template} (the "default" one). */
static const char *config_template(const json_t *cfg) {
    const json_t *t = json_object_get(cfg, "chat_template");
    if (json_is_string(t)) return json_string_value(t);
    size_t i;
    json_t *v;
    json_array_foreach(t, i, v) if (str_is(v, "name", "default")) return str_of(v, "template");
    return NULL;
}

q35_status q35_chat_identify(const char *dir, int *variant, char *path, size_t path_size, char hex[65], q35_error *err) {
    *variant = -2;
    hex[0] = 0;
    if (path_size) path[0] = 0;
    char *text = NULL, *file = q35_path_join(dir, "chat_template.jinja");
    size_t len = 0;
    json_t *cfg = NULL;
    if (!file) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    if (q35_file_exists(file)) {
        q35_status st = q35_read_file(file, &text, &len, err);
        if (st) { free(file); return st; }
    } else {
        free(file);
        if (!(file = q35_path_join(dir, "tokenizer_config.json"))) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
        const char *t = q35_file_exists(file) ? NULL : "";
        if (!t && (cfg = json_load_file(file, 0, NULL)) && (t = config_template(cfg))) {
            len = strlen(t);
            text = malloc(len + 1);
            if (text) memcpy(text, t, len + 1);
        }
    }
    json_decref(cfg);
    if (text) {
        uint8_t sha[32];
        unsigned int n = 0;
        EVP_Digest(text, len, sha, &n, EVP_sha256(), NULL);
        for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", sha[i]);
        snprintf(path, path_size, "%s", file);
        *variant = -1;
        for (size_t i = 0; i < sizeof known_templates / sizeof *known_templates; i++)
            if (!strcmp(hex, known_templates[i].sha256)) *variant = known_templates[i].variant;
    }
    free(text);
    free(file);
    return Q35_OK;
}

q35_status q35_chat_render(const char *messages_json, const char *tools_json, const q35_chat_options *opt, char **text,
                           q35_error *err) {
    *text = NULL;
    static const q35_chat_options defaults = {0};
    json_error_t je;
    json_t *messages = json_loads(messages_json ? messages_json : "", 0, &je), *tools = NULL;
    if (!json_is_array(messages)) {
        json_decref(messages);
        return q35_fail(err, Q35_ERR_ARG, "chat: messages are not a JSON array%s%s", messages ? "" : ": ", messages ? "" : je.text);
    }
    if (tools_json && !(tools = json_loads(tools_json, JSON_DECODE_ANY, &je))) {
        json_decref(messages);
        return q35_fail(err, Q35_ERR_ARG, "chat: tools are not valid JSON: %s", je.text);
    }
    render r = {.opt = opt ? opt : &defaults, .err = err};
    bool demo = r.opt->variant == Q35_CHAT_DEMO || r.opt->variant == Q35_CHAT_DEMO_VISION;
    bool ok = demo ? render_demo(&r, messages, r.opt->variant == Q35_CHAT_DEMO_VISION) : render_messages(&r, messages, tools);
    json_decref(messages);
    json_decref(tools);
    if (!ok) {
        q35_buf_free(&r.out);
        return Q35_ERR_ARG;
    }
    *text = q35_buf_take(&r.out, NULL);
    if (!*text) return q35_fail(err, Q35_ERR_NOMEM, "chat: out of memory");
    return Q35_OK;
}
