/* cli.h: the subcommands of the qwen35 program. Each lives in its own file
 * under tools/ and returns the process exit status. */
#ifndef Q35_CLI_H
#define Q35_CLI_H

#include "qwen35.h"

#include <stddef.h>
#include <stdint.h>

/* (one line per subcommand, kept in the order of the table in qwen35.c) */
int cmd_run(int argc, char **argv);    /* tools/run.c */
int cmd_logits(int argc, char **argv); /* tools/run.c */
int cmd_speed(int argc, char **argv);  /* tools/speed.c */
int cmd_serve(int argc, char **argv);  /* tools/serve.c */
int cmd_prepare(int argc, char **argv); /* tools/prepare.c */
int cmd_verify(int argc, char **argv);  /* tools/prepare.c */
int cmd_info(int argc, char **argv);    /* tools/prepare.c */
int cmd_eval(int argc, char **argv);    /* tools/eval.c */
int cmd_bench(int argc, char **argv);  /* tools/bench.c */
int cmd_tokenize(int argc, char **argv); /* tools/tokenize.c */
int cmd_chat(int argc, char **argv);   /* tools/chat.c */
int cmd_draft_vocab(int argc, char **argv); /* tools/draft_vocab.c */

/* qwen35 speed --vision (tools/speed_vision.c). */
int cli_speed_vision(const int *threads, int n_threads, int side, const char *json_path, const char *model,
                     const char *tower_dtype);
/* The embedded default model's directory (malloc'd). tools/cli_util.c */
char *cli_default_model(void);
/* Seconds on the monotonic clock. tools/cli_util.c */
double cli_now(void);

/* The file at path tokenized (no special tokens parsed) with the tokenizer
 * in dir: *ids (free()) and *n. */
q35_status cli_tokenize_file(const char *path, const char *dir, int32_t **ids, size_t *n, q35_error *err);
/* The session's speculation counters on stderr (nothing when it does not speculate). */
struct q35_engine;
struct q35_session;
void cli_print_spec_stats(const struct q35_engine *e, const struct q35_session *s);
/* --draft-vocab FILE: loads the token-id list into e's draft head; on
 * failure prints "PROG: why" and returns -1. tools/cli_util.c */
struct q35_engine;
int cli_set_draft_vocab(struct q35_engine *e, const char *path, const char *prog);
/* The chat template's end tokens the tokenizer knows (<|im_end|>,
 * <|endoftext|>) below n_vocab into ids (room for 2); returns how many. They end a reply
 * as EOS ids do (q35_gen_params.eos_ids), whatever the model directory's
 * config lists. tools/cli_util.c */
struct q35_tokenizer;
int cli_chat_end_ids(const struct q35_tokenizer *tok, int32_t n_vocab, int32_t *ids);
/* The q35_chat_variant of dir's chat template; Qwen3.5-9B's (with a note
 * on stderr for an unknown one) when it is unknown or missing. */
int cli_chat_variant(const char *dir, const char *who);
/* A chat request file (an object with "messages", optional "tools",
 * "add_generation_prompt" (default true), "enable_thinking" or
 * "chat_template_kwargs", or a bare messages array) rendered with the
 * template variant into malloc'd text; NULL after printing "PROG: why".
 * tools/cli_util.c */
char *cli_render_chat(const char *path, int variant, const char *prog);

/* An image prompt (tools/mm_prompt.c): a chat request rendered, tokenized,
 * its image parts (image_url: a data: URL with base64, or a local path,
 * relative to the request file; the same with --image) processed by the
 * model directory's processor, encoded by e, and the ids expanded. */
struct q35_image_embeds;
typedef struct cli_mm_prompt {
    int32_t *ids, n;                  /* expanded */
    struct q35_image_embeds **images; /* n_images, in prompt order */
    int32_t n_images;
} cli_mm_prompt;
/* From a request file; prints "PROG: why" and returns -1 on failure. */
int cli_mm_prompt_from_request(struct q35_engine *e, const char *model_dir, const char *req_path, cli_mm_prompt *out,
                               const char *prog);
/* Images (files or data: URLs; relative paths against base_dir, or the
 * working directory when it is NULL) encoded by e into out (no ids). */
int cli_mm_encode(struct q35_engine *e, const char *model_dir, const char *const *sources, int32_t n_sources,
                  const char *base_dir, cli_mm_prompt *out, const char *prog);
/* The same, and the ids of a prompt text holding one <|image_pad|> per
 * image, expanded. */
int cli_mm_prompt_build(struct q35_engine *e, const char *model_dir, const struct q35_tokenizer *tok, const char *text,
                        const char *const *sources, int32_t n_sources, const char *base_dir, cli_mm_prompt *out,
                        const char *prog);
void cli_mm_prompt_free(cli_mm_prompt *p);

#endif
