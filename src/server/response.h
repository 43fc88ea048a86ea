/* response.h: JSON bodies and pieces of the generation endpoints
 * (response.c), built from a task's events. A token shows as its text, or
 * "token_id:N" when there is no tokenizer (tok NULL). */
#ifndef Q35_SERVER_RESPONSE_H
#define Q35_SERVER_RESPONSE_H

#include "server/sched.h"
#include "qwen35.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* A JSON string of text that may not be valid UTF-8 (a token's bytes): as
 * is when valid, else vLLM's "bytes:\xNN..." form. */
json_t *q35_json_text(const char *s, size_t n);
json_t *q35_json_token(const q35_tokenizer *tok, int32_t id);
const char *q35_finish_name(int finish);
json_t *q35_usage_json(const q35_task *t);
/* Legacy completions logprobs of one event, appended into lp's arrays. */
void q35_completion_logprobs_add(const q35_tokenizer *tok, json_t *lp, const q35_event *e, size_t offset);
/* The prompt's rows of completions logprobs (echo with logprobs), appended
 * into lp's arrays as vLLM shows them: the first token with null, then each
 * with its own entry first in top_logprobs; text_offset counts from 0 by
 * the tokens' text. Returns the offset after the prompt. */
size_t q35_prompt_logprobs_add(const q35_tokenizer *tok, json_t *lp, const q35_task *r, int32_t prompt_index);
/* vLLM's prompt_logprobs field: [null, {"id": {"logprob", "rank", "decoded_token"}}, ...]. */
json_t *q35_prompt_logprobs_json(const q35_tokenizer *tok, const q35_task *r, int32_t prompt_index);
json_t *q35_chat_logprob_entry(const q35_tokenizer *tok, const q35_event *e);
json_t *q35_stop_reason_json(const q35_event *e);
/* The prompt as echo shows it (malloc'd): its text, token ids decoded
 * (as vLLM's echo detokenizes them), or "<id>" per token without a tokenizer. */
char *q35_echo_text(const q35_tokenizer *tok, const q35_task *t, int32_t prompt_index);
/* One output-parser delta as a chat.completion.chunk delta object. */
json_t *q35_delta_json(const q35_delta *d);
/* The whole response of a finished task. */
json_t *q35_full_response(const q35_tokenizer *tok, const char *model, const q35_task *t);
/* A streaming chunk's envelope around choices (a reference it steals). */
json_t *q35_chunk_base(const char *model, const q35_task *t, json_t *choices);

#endif
