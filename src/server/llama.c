/* llama.c: llama-server's native routes (llama.h). Its /completion is
 * served as /v1/completions is: the body is translated field by field, the
 * answer reshaped; nothing here generates. */
#include "server/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void rename_field(json_t *o, const char *from, const char *to) {
    json_t *v = json_object_get(o, from);
    if (!v) return;
    if (!json_object_get(o, to)) json_object_set(o, to, v);
    json_object_del(o, from);
}

char *q35_llama_completion_body(const char *body, size_t len, char *msg, size_t msg_size) {
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        snprintf(msg, msg_size, "the request body must be a JSON object");
        return NULL;
    }
    json_t *np = json_object_get(o, "n_predict");
    if (np && json_is_integer(np) && json_integer_value(np) < 0) json_object_del(o, "n_predict"); /* -1: unlimited */
    rename_field(o, "n_predict", "max_tokens");
    rename_field(o, "repeat_penalty", "repetition_penalty");
    rename_field(o, "n_probs", "logprobs");
    json_t *seed = json_object_get(o, "seed");
    if (json_is_integer(seed) && json_integer_value(seed) < 0) json_object_del(o, "seed"); /* -1: random */
    json_t *lb = json_object_get(o, "logit_bias");
    if (json_is_array(lb)) { /* [[id, bias], ...]; a bias of false bans the token */
        json_t *obj = json_object();
        size_t i;
        json_t *pair;
        json_array_foreach(lb, i, pair) {
            json_t *id = json_array_get(pair, 0), *b = json_array_get(pair, 1);
            char key[32];
            if (!json_is_integer(id)) { json_object_set_new(obj, "x", json_integer(0)); continue; } /* refused by the parser */
            snprintf(key, sizeof key, "%lld", (long long)json_integer_value(id));
            json_object_set_new(obj, key, json_is_false(b) ? json_integer(-100) : json_deep_copy(b ? b : json_null()));
        }
        json_object_set_new(o, "logit_bias", obj);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) snprintf(msg, msg_size, "out of memory");
    return s;
}

static void stop_fields(json_t *out, const json_t *choice) {
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    json_t *reason = json_object_get(choice, "stop_reason");
    bool word = json_is_string(reason);
    json_object_set_new(out, "stop", json_boolean(finish != NULL));
    if (!finish) return;
    json_object_set_new(out, "stop_type", json_string(!strcmp(finish, "length") ? "limit" : word ? "word" : "eos"));
    json_object_set_new(out, "stopping_word", json_string(word ? json_string_value(reason) : ""));
}

json_t *q35_llama_response(json_t *o, const q35_task *t) {
    json_t *choice = json_array_get(json_object_get(o, "choices"), 0), *usage = json_object_get(o, "usage");
    json_t *out = json_pack("{s:O, s:O, s:O, s:O, s:i}", "content", json_object_get(choice, "text"),
                            "model", json_object_get(o, "model"), "tokens_predicted", json_object_get(usage, "completion_tokens"),
                            "tokens_evaluated", json_object_get(usage, "prompt_tokens"), "tokens_cached", t->cached_tokens);
    if (out) stop_fields(out, choice);
    json_decref(o);
    return out;
}

json_t *q35_llama_chunk(json_t *choice) {
    json_t *out = json_pack("{s:O, s:i}", "content", json_object_get(choice, "text"), "index", 0);
    if (out) stop_fields(out, choice);
    json_decref(choice);
    return out;
}

json_t *q35_llama_props(const q35_server *srv) {
    static const char *const names[] = {"qwen3.5-0.8b", "qwen3.5-9b", "qwen35-demo"};
    return json_pack("{s:{s:i, s:{s:i}}, s:i, s:s, s:s, s:s, s:{s:b, s:b}}", "default_generation_settings", "n_ctx",
                     srv->limits.max_model_len, "params", "n_predict", -1, "total_slots", srv->cfg.parallel, "model_path",
                     srv->cfg.model_path, "chat_template_variant", names[srv->chat_variant], "build_info", Q35_VERSION,
                     "modalities", "vision", 0, "audio", 0);
}

json_t *q35_llama_slots(const q35_server *srv) {
    q35_sched_stats st;
    q35_sched_get_stats(srv->sched, &st);
    json_t *a = json_array();
    for (int i = 0; i < srv->cfg.parallel; i++)
        json_array_append_new(a, json_pack("{s:i, s:i, s:b}", "id", i, "n_ctx", srv->limits.max_model_len, "is_processing",
                                           i < st.running));
    return a;
}
