/* prompt.h: tokenizing a task's prompts (prompt.c). */
#ifndef Q35_SERVER_PROMPT_H
#define Q35_SERVER_PROMPT_H

#include "server/request.h"
#include "server/sched.h"
#include "qwen35.h"

#include <stddef.h>

/* Fills t's per-prompt arrays from t->api (q35_task_alloc): token ids,
 * lengths, resolved max_tokens, and for chat the turn snapshot. Text
 * needs tok (NULL: 501). 0, or -1 with an HTTP status and a message. */
int q35_prompt_prepare(const q35_tokenizer *tok, const q35_api_limits *lim, q35_task *t, char *msg, size_t msg_size,
                       int *status);

#endif
