/* decoder.h: streaming token-to-text for one choice (decoder.c). With a
 * tokenizer, ids go through a q35_detokenizer (special tokens skipped, as
 * vLLM's default); without one each token shows as "<id>". The returned
 * text is owned by the decoder and valid until its next call. */
#ifndef Q35_SERVER_DECODER_H
#define Q35_SERVER_DECODER_H

#include "qwen35.h"

#include <stddef.h>
#include <stdint.h>

typedef struct q35_text_decoder q35_text_decoder;

q35_text_decoder *q35_text_decoder_new(const q35_tokenizer *tok); /* tok may be NULL */
const char *q35_text_decoder_feed(q35_text_decoder *d, int32_t token, size_t *len);
const char *q35_text_decoder_flush(q35_text_decoder *d, size_t *len);
void q35_text_decoder_free(q35_text_decoder *d);

#endif
