/* llama.h: llama-server's native routes (llama.c), for the clients written
 * against it: /completion (its body becomes an OpenAI completion request,
 * its answer and chunks take llama-server's shape), /props, /slots,
 * /apply-template, and the llama-server forms of /tokenize and /detokenize. */
#ifndef Q35_SERVER_LLAMA_H
#define Q35_SERVER_LLAMA_H

#include "server/context.h"

#include <jansson.h>
#include <stddef.h>

/* A /completion body as the /v1/completions body it means (n_predict is
 * max_tokens, repeat_penalty repetition_penalty, seed -1 none, logit_bias
 * [[id, bias], ...] an object); NULL with a message for what is not JSON. */
char *q35_llama_completion_body(const char *body, size_t len, char *msg, size_t msg_size);
/* A whole /v1/completions response object in llama-server's shape (steals o). */
json_t *q35_llama_response(json_t *o, const q35_task *t);
/* A completion chunk's choice as one llama-server stream event (steals choice). */
json_t *q35_llama_chunk(json_t *choice);
/* GET /props and GET /slots (no prompts or other private data). */
json_t *q35_llama_props(const q35_server *srv);
json_t *q35_llama_slots(const q35_server *srv);

#endif
