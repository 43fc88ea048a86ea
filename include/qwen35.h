/* qwen35.h: the public interface of the qwen35 engine.
 *
 * Two opaque handles:
 *   q35_engine   a loaded model (checkpoint directory or weight cache). It is
 *                read-only after load and may be shared by many sessions.
 *   q35_session  one timeline: the attention KV caches and the Gated DeltaNet
 *                recurrent and conv states of one sequence.
 *
 * Every call that can fail returns a q35_status and, when given a q35_error,
 * fills it with a message that names the file or tensor at fault. The library
 * never prints and never exits. */
#ifndef QWEN35_H
#define QWEN35_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define Q35_VERSION "0.1.0"

typedef enum q35_status {
    Q35_OK = 0,
    Q35_ERR_IO = 1,          /* a file could not be opened, read, mapped or written */
    Q35_ERR_FORMAT = 2,      /* a file is malformed, truncated or inconsistent */
    Q35_ERR_UNSUPPORTED = 3, /* a valid input this engine does not handle */
    Q35_ERR_NOMEM = 4,
    Q35_ERR_ARG = 5,         /* a bad argument from the caller */
    Q35_ERR_CONTEXT = 6,     /* the session's context is full */
} q35_status;

typedef struct q35_error {
    q35_status status;
    char msg[1024];
} q35_error;

typedef struct q35_engine q35_engine;
typedef struct q35_session q35_session;

/* What a caller needs to know about the loaded model. */
typedef struct q35_model_info {
    int32_t vocab_size;        /* rows of lm_head (logits per position) */
    int32_t hidden_size;
    int32_t n_layer;           /* decoder layers, both kinds */
    int32_t n_layer_full;      /* of which full (gated) attention */
    int32_t max_position;      /* max_position_embeddings from the config */
    int32_t eos_token_id;      /* -1 when the config names none */
    int32_t has_mtp;           /* the checkpoint carries mtp.* tensors */
    int32_t has_vision;        /* the weights hold the vision tower (model.visual.*): images can be encoded */
    int64_t n_params;          /* text-model parameters (MTP and vision excluded) */
    int64_t weight_bytes;      /* bytes of every weight the text model holds (MTP excluded) */
    int64_t bytes_per_token;   /* weight bytes one decode step reads: all but the embedding
                                  table, of which one row */
    int64_t mtp_bytes_per_draft; /* bytes one MTP draft row reads (its layer, fc, lm_head) */
    int64_t file_bytes;        /* bytes of the weight files (cache or safetensors), all mapped */
    int32_t weights_copied;    /* 1: the files were read into anonymous memory (Q35_WEIGHTS_IN_MEMORY) */
    int32_t kv_cache;          /* the sessions' KV cache format, a q35_kv_cache */
    int64_t kv_bytes_per_pos;  /* KV cache bytes one position of a session takes (every full-attention
                                  layer, keys and values; the MTP layer's own cache adds one layer's worth) */
} q35_model_info;

/* Where the weights live. Decode streams every weight once per token, and the
 * hardware prefetchers stop at page boundaries: from 2 MiB pages it reads
 * markedly faster than from the page cache's 4 KiB pages. */
typedef enum q35_weights_mode {
    Q35_WEIGHTS_AUTO = 0,      /* in memory when the kernel offers transparent huge pages ("always" or "madvise")
                                  and the available memory holds the files with a quarter to spare; else mapped */
    Q35_WEIGHTS_MAPPED = 1,    /* served from the mapped files (page cache, shared between processes) */
    Q35_WEIGHTS_IN_MEMORY = 2, /* read into anonymous memory, on huge pages where the kernel allows them, at the
                                  addresses of the mapping: costs one read of the files at load */
} q35_weights_mode;

/* How sessions store the attention layers' keys and values. Decode reads the
 * whole cache once per token, so at long contexts its size competes with
 * the weights' (at the 9B shapes fp32 takes 64 KiB per position: 2 GiB at
 * 32k against 5 GB of weights). */
typedef enum q35_kv_cache {
    Q35_KV_F32 = 0,            /* fp32: exactly the values computed */
    Q35_KV_Q8 = 1,             /* 8 bits per value and an fp32 scale per 32 (llama.cpp's q8_0 cache type):
                                  3.6x smaller at head_dim 256, each value within half a step of its block */
} q35_kv_cache;
/* "f32" / "q8" (also "f32"'s alias "fp32" and "q8"'s "q8_0") to a q35_kv_cache; -1 for anything else. */
int32_t q35_kv_cache_parse(const char *name);
const char *q35_kv_cache_name(int32_t kv_cache);

typedef struct q35_engine_params {
    int32_t n_threads;         /* 0: one per core */
    int32_t weights;           /* a q35_weights_mode; 0: Q35_WEIGHTS_AUTO */
    int32_t kv_cache;          /* a q35_kv_cache for every session; 0: Q35_KV_F32. A backend that
                                  cannot store it fails the load with Q35_ERR_UNSUPPORTED */
    const char *backend;       /* "cpu" or "ref" (q35_engine_backend); NULL: the environment variable
                                  Q35_BACKEND, else "cpu" */
} q35_engine_params;

/* Loads a Hugging Face checkpoint directory (config.json plus
 * model.safetensors or model.safetensors.index.json), or a weight cache
 * directory written by `qwen35 prepare` (config.json plus model.q35, used
 * as it is: mapped, then read into huge-page memory or not as params->weights
 * says). */
q35_status q35_engine_load(const char *path, const q35_engine_params *params,
                           q35_engine **out, q35_error *err);
void q35_engine_free(q35_engine *engine);
const q35_model_info *q35_engine_info(const q35_engine *engine);
/* The kernel table in use ("ref", "avx2", "avx512", "avx512bf16"; the environment variable
 * Q35_KERNELS forces one) and a note for the user, or NULL, e.g. that this
 * CPU has no AVX2 and runs the slow scalar kernels. */
const char *q35_engine_kernels(const q35_engine *engine, const char **note);
/* The backend the model runs on: "cpu" (the default), or "ref", the scalar
 * reference (one thread, reference kernels), as the environment variable
 * Q35_BACKEND chooses at load. */
const char *q35_engine_backend(const q35_engine *engine);
int32_t q35_engine_threads(const q35_engine *engine);

/* A session holds up to n_ctx positions (0: the model's maximum). */
q35_status q35_session_new(q35_engine *engine, int32_t n_ctx, q35_session **out, q35_error *err);
void q35_session_free(q35_session *session);
void q35_session_reset(q35_session *session);
int32_t q35_session_pos(const q35_session *session); /* tokens consumed so far */
int32_t q35_session_ctx(const q35_session *session); /* capacity in tokens */
/* For benchmarks at a context depth: empties the session, then leaves it as
 * if n tokens had been evaluated, its attention caches and recurrent states
 * pseudo-random from seed (what no tokens would give; their ids are unknown,
 * so q35_session_sync / reuse never match them). The next eval continues at
 * position n; n = 0 is q35_session_reset. Q35_ERR_ARG for n outside
 * [0, ctx); Q35_ERR_UNSUPPORTED on a backend without it. */
q35_status q35_session_fill_random(q35_session *session, int32_t n, uint64_t seed, q35_error *err);

enum {
    Q35_EVAL_ALL_LOGITS = 1, /* write logits for every input row, not only the last */
    Q35_EVAL_RECURRENT = 2,  /* run the GDN token by token even for a prompt (testing) */
    Q35_EVAL_REWINDABLE = 4, /* keep per-row states so q35_session_rewind can drop rows (at most
                                Q35_SPEC_K_MAX+1 tokens; needs q35_session_set_spec) */
};

/* Feeds n tokens at the session's current position. logits, when not NULL,
 * receives vocab_size floats for the last row, or n*vocab_size with
 * Q35_EVAL_ALL_LOGITS. On error the session is left as it was before. */
q35_status q35_session_eval(q35_session *session, const int32_t *tokens, int32_t n,
                            float *logits, int flags, q35_error *err);

/* One decode step for several independent sessions: row i feeds tokens[i]
 * to sessions[i] and receives vocab_size logits at logits + i*vocab_size.
 * Row by row the result equals q35_session_eval on each session alone, so a
 * request's output does not depend on what else is in the batch. The
 * sessions must be distinct and belong to one engine. */
q35_status q35_batch_decode(q35_session *const *sessions, const int32_t *tokens, int32_t n, float *logits,
                            q35_error *err);

/* A snapshot is a copy of a session's whole state at its current position
 * (attention KV rows 0..pos-1 and the GDN conv and recurrent states). It
 * backs prefix caching and speculative rollback: restoring it into any
 * session of the same engine (with enough context) continues exactly as the
 * original would have. */
typedef struct q35_snapshot q35_snapshot;
q35_status q35_snapshot_take(const q35_session *session, q35_snapshot **out, q35_error *err);
q35_status q35_snapshot_restore(q35_session *session, const q35_snapshot *snap, q35_error *err);
int32_t q35_snapshot_pos(const q35_snapshot *snap);
size_t q35_snapshot_bytes(const q35_snapshot *snap);
void q35_snapshot_free(q35_snapshot *snap);

/* ---- speculative decoding with the MTP head ----
 * With speculation on, each generation step (q35_generation_step, below)
 * drafts k tokens with the
 * checkpoint's MTP head, verifies them in one batch of k+1 rows, keeps the
 * longest accepted prefix plus one token from the target, and rolls the
 * GDN, attention and MTP states back past the rejected rows. Greedy output
 * is token-for-token the output without speculation; with sampling, drafts
 * go through standard speculative rejection sampling, so the output
 * distribution is unchanged. */
#define Q35_SPEC_K_MAX 8

typedef struct q35_spec_stats {
    int64_t steps;     /* verify steps run */
    int64_t drafts;    /* draft tokens proposed */
    int64_t accepted;  /* draft tokens accepted */
    int64_t accepted_at[Q35_SPEC_K_MAX]; /* accepted drafts by their position in a step (0: the first) */
} q35_spec_stats;

/* k draft tokens per step (1..Q35_SPEC_K_MAX), or 0 for off. Needs an MTP
 * head (Q35_ERR_UNSUPPORTED otherwise). Call between requests, not mid-way:
 * it allocates the rollback buffers. */
q35_status q35_session_set_spec(q35_session *session, int32_t k, q35_error *err);
int32_t q35_session_spec_k(const q35_session *session);
q35_spec_stats q35_session_spec_stats(const q35_session *session);

/* A reduced-vocabulary draft head. The MTP draft's logits are computed over
 * a subset of token ids only (typically the most frequent ones), so a draft
 * reads n rows of lm_head instead of vocab_size; its argmax, or its sampled
 * draft, is restricted to the subset. Verification by the target is
 * unchanged, so greedy output stays token for token the same and sampled
 * output keeps its distribution (the draft distribution is zero outside the
 * subset, which rejection sampling corrects); only acceptance can change.
 * ids: n distinct token ids in any order (n = 0: the full vocabulary again).
 * The engine keeps a copy of those lm_head rows in their stored dtype, so a
 * subset row's draft logit is bit for bit the full head's. Needs an MTP head.
 * Call before sessions step, never while one does. */
q35_status q35_engine_set_draft_vocab(q35_engine *engine, const int32_t *ids, int32_t n, q35_error *err);
/* Rows of the draft head: vocab_size unless a subset is set. */
int32_t q35_engine_draft_vocab(const q35_engine *engine);

/* Reads a draft vocabulary file: decimal token ids separated by whitespace
 * or commas, '#' starting a comment to the end of its line (the format
 * `qwen35 draft-vocab` writes: one id per line, most frequent first). Every
 * id must be in [0, vocab_size) and appear once; an empty list, a
 * malformed, negative or out-of-range id, or a repeat is Q35_ERR_FORMAT
 * with the line number. *ids is malloc'd: free() it. */
q35_status q35_draft_vocab_load(const char *path, int32_t vocab_size, int32_t **ids, int32_t *n, q35_error *err);
/* q35_draft_vocab_load of path, then q35_engine_set_draft_vocab with its ids. */
q35_status q35_engine_set_draft_vocab_file(q35_engine *engine, const char *path, q35_error *err);

/* The target logits rows that chose the tokens of the session's last step
 * (n_out rows of vocab_size), valid until its next eval or step. */
const float *q35_session_step_logits(const q35_session *session);

/* Rewinds the last eval made with Q35_EVAL_REWINDABLE to its first n_keep
 * rows (1 <= n_keep <= rows): GDN states, KV length and MTP rows. */
q35_status q35_session_rewind(q35_session *session, int32_t n_keep, q35_error *err);

/* The machine's best sequential read bandwidth in GB/s (1e9 bytes/s) with
 * n_threads threads (<= 0: one per online CPU): each thread streams its own
 * contiguous share of a 1 GiB buffer (4 KiB pages) with the widest loads of
 * the kernel table in use; best of 5 passes. This is the ceiling that
 * benchmarks quote decode GB/s against. Maps and frees 1 GiB and takes
 * about a second. */
q35_status q35_read_bandwidth(int32_t n_threads, double *gb_s, q35_error *err);

/* The same measurement, to take again and again beside other work (a
 * benchmark that compares each of its steps with the bandwidth of that
 * moment): q35_read_probe_new maps and writes `bytes` (rounded up to 4 KiB;
 * 0: 1 GiB) and starts n_threads threads; q35_read_probe_run streams the
 * buffer `passes` times as q35_read_bandwidth does and returns the best
 * pass in GB/s; q35_read_probe_free unmaps it and stops the threads. */
typedef struct q35_read_probe q35_read_probe;
q35_status q35_read_probe_new(int32_t n_threads, size_t bytes, q35_read_probe **out, q35_error *err);
double q35_read_probe_run(q35_read_probe *probe, int passes);
void q35_read_probe_free(q35_read_probe *probe);

/* Greedy choice: the lowest index among the largest logits. */
int32_t q35_argmax(const float *logits, int32_t n);

const char *q35_status_name(q35_status status);

/* ---- tokenizer, chat template and output parsers ---- */

/* A byte-level BPE tokenizer loaded from a model directory: tokenizer.json,
 * or vocab.json + merges.txt + tokenizer_config.json. Read-only after load;
 * one tokenizer may be used from many threads. */
typedef struct q35_tokenizer q35_tokenizer;

q35_status q35_tokenizer_load(const char *dir, q35_tokenizer **out, q35_error *err);
void q35_tokenizer_free(q35_tokenizer *tok);

/* Ids run 0..q35_tokenizer_n_ids()-1; some may name no token. */
int32_t q35_tokenizer_n_ids(const q35_tokenizer *tok);

/* Text to ids, as Hugging Face's Tokenizer.encode (no BOS/EOS are added).
 * Invalid UTF-8 is first replaced by U+FFFD (one per maximal invalid
 * subpart, as Python's bytes.decode(errors="replace")). Added tokens are
 * always matched as whole tokens; special ones only when parse_special is
 * set (HF split_special_tokens=False). *ids is malloc'd: free() it. */
q35_status q35_tokenize(const q35_tokenizer *tok, const char *text, size_t len, int parse_special,
                        int32_t **ids, size_t *n_ids, q35_error *err);

/* The id of an added token by its content ("<|im_end|>"), else of the base
 * token whose bytes are exactly text; -1 when there is none. */
int32_t q35_token_id(const q35_tokenizer *tok, const char *text, size_t len);
/* The bytes an id decodes to (may be part of a UTF-8 character); NULL for an
 * id that names no token. Not NUL-terminated. */
const char *q35_token_bytes(const q35_tokenizer *tok, int32_t id, size_t *len);
int q35_token_is_special(const q35_tokenizer *tok, int32_t id); /* an added token with special=true */

/* Streaming decoder. It returns only whole UTF-8 characters, holds back an
 * incomplete one until its last byte arrives, and replaces invalid bytes by
 * U+FFFD exactly as HF's decode does over the whole sequence. Ids that name
 * no token decode to nothing; with skip_special, special added tokens too. */
typedef struct q35_detokenizer q35_detokenizer;
q35_status q35_detokenizer_new(const q35_tokenizer *tok, int skip_special, q35_detokenizer **out, q35_error *err);
void q35_detokenizer_free(q35_detokenizer *d);
void q35_detokenizer_reset(q35_detokenizer *d);
/* The text completed by this id: NUL-terminated, owned by d, valid until
 * the next call on d. Never allocates. */
const char *q35_detokenizer_feed(q35_detokenizer *d, int32_t id, size_t *len);
/* End of stream: a dangling partial character becomes U+FFFD. */
const char *q35_detokenizer_flush(q35_detokenizer *d, size_t *len);
/* Whole-sequence convenience: *text is malloc'd and NUL-terminated. */
q35_status q35_detokenize(const q35_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                          char **text, size_t *len, q35_error *err);

/* Qwen3.5 chat template, rendered byte for byte as transformers'
 * apply_chat_template does with the model's chat_template.jinja. The
 * published templates differ in their generation prompt: */
typedef enum q35_chat_variant {
    Q35_CHAT_QWEN35_SMALL = 0, /* Qwen3.5-0.8B's: thinks only when enable_thinking is true */
    Q35_CHAT_QWEN35_9B = 1,    /* Qwen3.5-9B's: thinks unless enable_thinking is false */
    Q35_CHAT_DEMO = 2,         /* models/qwen35-demo's ChatML (no tools, never opens <think>, no images) */
    Q35_CHAT_DEMO_VISION = 3,  /* the same with image parts (scripts/train_demo_vision.py CHAT_TEMPLATE) */
} q35_chat_variant;

typedef struct q35_chat_options {
    int add_generation_prompt;
    int enable_thinking;  /* chat_template_kwargs.enable_thinking: 1 true, -1 false, 0 absent (or not a boolean) */
    int add_vision_id;    /* "Picture N: " before each image */
    int variant;          /* a q35_chat_variant */
} q35_chat_options;

/* Whether the generation prompt opt renders ends inside an open <think>. */
int q35_chat_thinks(const q35_chat_options *opt);
/* A model directory's template (chat_template.jinja, else tokenizer_config.json's
 * chat_template) identified by its SHA-256: *variant is a q35_chat_variant, -1
 * for an unknown template, -2 when there is none; path (path_size bytes) names
 * the file and hex the hash (both "" when there is none). */
q35_status q35_chat_identify(const char *dir, int *variant, char *path, size_t path_size, char hex[65], q35_error *err);

/* messages_json: an OpenAI "messages" array; tools_json: a "tools" array or
 * NULL. Tool-call arguments may be an object or a JSON string holding one.
 * Errors the template would raise come back as Q35_ERR_ARG with its message.
 * *text is malloc'd and NUL-terminated. */
q35_status q35_chat_render(const char *messages_json, const char *tools_json, const q35_chat_options *opt,
                           char **text, q35_error *err);

/* Incremental parser of generated text into OpenAI fields: reasoning
 * (<think>...</think>; an unpaired <tool_call> also ends it), content, and
 * Qwen3.5 XML tool calls whose arguments become a JSON string typed by the
 * tool's JSON schema. Malformed output falls back to content. */
typedef struct q35_output_parser q35_output_parser;

typedef enum q35_delta_kind {
    Q35_DELTA_CONTENT = 0,
    Q35_DELTA_REASONING = 1,
    Q35_DELTA_TOOL_NAME = 2,  /* a new tool call starts: text is its function name */
    Q35_DELTA_TOOL_ARGS = 3,  /* the next piece of that call's arguments JSON */
} q35_delta_kind;

typedef struct q35_delta {
    q35_delta_kind kind;
    int32_t tool_index;  /* for TOOL_NAME and TOOL_ARGS: 0, 1, ... in order */
    const char *text;    /* not NUL-terminated */
    size_t len;
} q35_delta;

/* tools_json: the request's "tools" array, or NULL for no tool parsing.
 * in_reasoning: the prompt ended inside <think> (thinking enabled). */
q35_status q35_output_parser_new(const char *tools_json, int in_reasoning, q35_output_parser **out, q35_error *err);
void q35_output_parser_free(q35_output_parser *p);
/* Feeds generated text, cut anywhere (a tag may span calls). Deltas split
 * characters only where the input did; q35_detokenizer output never does.
 * *deltas points into p and stays valid until the next call on p. */
q35_status q35_output_parser_feed(q35_output_parser *p, const char *text, size_t len,
                                  const q35_delta **deltas, size_t *n_deltas, q35_error *err);
/* End of generation: releases held-back text and closes an open tool call. */
q35_status q35_output_parser_finish(q35_output_parser *p, const q35_delta **deltas, size_t *n_deltas,
                                    q35_error *err);
/* The whole message so far (NUL-terminated, owned by p; the text itself may
 * hold NUL bytes, so *len, when not NULL, gets its length). */
const char *q35_output_parser_content(const q35_output_parser *p, size_t *len);
const char *q35_output_parser_reasoning(const q35_output_parser *p, size_t *len);
/* OpenAI tool_calls without ids, [{"type":"function","function":{"name":..,
 * "arguments":".."}}...], or NULL when there are none; malloc'd. */
char *q35_output_parser_tool_calls_json(const q35_output_parser *p);

/* ---- sampling ---- */
/* (q35_generation, above, takes a sampler and does all of the below for a
 * caller: the prompt is still the caller's to give, q35_sampler_set_prompt.) */

/* Per-request token sampling. The pipeline, in order: repetition penalty
 * (prompt and output tokens), presence and frequency penalties (output
 * tokens), then top-k, top-p and min-p on the penalised distribution, then
 * temperature, then one draw from the sampler's own RNG. temperature 0 is a
 * greedy argmax of the penalised logits. Each sampler owns its RNG, seeded
 * from params.seed, so a request's tokens depend only on its own logits and
 * seed, never on what else is being served. */
typedef struct q35_sampler_params {
    float temperature;        /* 0: greedy */
    int32_t top_k;            /* 0 or -1: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float presence_penalty;   /* 0: off; subtracted once per seen output token */
    float frequency_penalty;  /* 0: off; subtracted per occurrence in the output */
    float repetition_penalty; /* 1: off; divides positive, multiplies negative logits */
    uint64_t seed;
} q35_sampler_params;

typedef struct q35_sampler q35_sampler;

/* Scratch for vocab_size candidates is allocated here, never while sampling. */
q35_status q35_sampler_new(const q35_sampler_params *params, int32_t vocab_size, q35_sampler **out,
                           q35_error *err);
void q35_sampler_free(q35_sampler *s);
/* The prompt tokens, for the repetition penalty (out-of-range ids are skipped). */
void q35_sampler_set_prompt(q35_sampler *s, const int32_t *ids, int32_t n);
/* Records a generated token, for the penalties. */
void q35_sampler_accept(q35_sampler *s, int32_t token);
/* Picks the next token; logits (vocab_size floats) are overwritten. */
int32_t q35_sampler_sample(q35_sampler *s, float *logits);

/* The distribution q35_sampler_sample draws from for this logits row, as
 * vocab_size probabilities (zero outside top-k/top-p/min-p; one-hot at the
 * greedy choice at temperature 0), with the n_prev tokens of prev counted as
 * already generated for the penalties (tokens a speculative step has not
 * emitted yet). logits are left as they are; the sampler's RNG and its
 * record of generated tokens are unchanged. Never allocates. A
 * q35_generation's speculative steps draw drafts and accept them through it,
 * so they keep exactly this sampler's distribution. */
void q35_sampler_probs(q35_sampler *s, const float *logits, const int32_t *prev, int32_t n_prev, float *probs);

/* Log-probability of token under log_softmax(logits), and, when k > 0, the k
 * most likely tokens (ties: lower id first) into top_ids / top_logprobs. */
float q35_logprobs(const float *logits, int32_t n, int32_t token, int32_t k, int32_t *top_ids,
                   float *top_logprobs);

/* ---- generation ----
 *
 * A q35_generation produces the tokens that follow a prompt in one session:
 * each step evaluates the newest token, with speculation on also drafts and
 * verifies, and chooses tokens by, in order: the
 * caller's logits hook, the min_tokens mask, then the sampler (NULL:
 * greedy, the lowest index among the largest logits). Drafts see the same
 * hook and mask as the target, so a token the hook forbids is never
 * emitted, speculated or not. Greedy output is token for token the output
 * without speculation; sampled output keeps the sampler's distribution
 * (speculative rejection sampling, drawing from the sampler's own RNG and
 * nothing else). Each generation chooses from its own rows and its own
 * sampler only, so what else is in a batch never changes its tokens. */

/* The engine's end-of-sequence ids: config.json's eos_token_id (an int or
 * a list; text_config's and the top level's) and generation_config.json's,
 * in that order, without repeats (a missing or unreadable
 * generation_config.json adds none). *n receives the count; the array
 * lives as long as the engine. */
const int32_t *q35_engine_eos_ids(const q35_engine *engine, int32_t *n);

typedef enum q35_stop_reason {
    Q35_STOP_NONE = 0,    /* not stopped: step again */
    Q35_STOP_EOS = 1,     /* an end-of-sequence id (the engine's or params.eos_ids) */
    Q35_STOP_TOKEN = 2,   /* one of params.stop_ids */
    Q35_STOP_LENGTH = 3,  /* params.max_tokens tokens were generated */
    Q35_STOP_CONTEXT = 4, /* the session's context is full: the newest token cannot be evaluated */
} q35_stop_reason;

/* A logits processor: edits one logits row (n_vocab floats) in place before
 * the sampler sees it, e.g. -INFINITY for the tokens a grammar forbids or a
 * logit bias. prev holds the n_prev tokens generated before the one this
 * row chooses. With speculation it is also called for draft rows (prev then
 * ends with the earlier drafts of the step) and for rows whose token is
 * discarded, so its result must depend on the row and prev only. */
typedef void (*q35_logits_fn)(void *ctx, float *logits, int32_t n_vocab, const int32_t *prev, int32_t n_prev);

typedef struct q35_gen_params {
    /* NULL: greedy (so is a sampler at temperature 0 without penalties).
     * Borrowed for the generation's life: it records every emitted token
     * (q35_sampler_accept) and supplies every random draw. */
    q35_sampler *sampler;
    q35_logits_fn logits_fn;   /* NULL: none */
    void *logits_ctx;
    int32_t max_tokens;        /* stop after this many tokens; <= 0: only the context limits */
    int32_t min_tokens;        /* EOS and stop ids are masked until this many were generated */
    int32_t ignore_eos;        /* EOS ids neither stop nor are masked */
    /* More ids that end generation as EOS besides q35_engine_eos_ids (a
     * chat template's end-of-turn token the model directory does not list) */
    const int32_t *eos_ids;
    int32_t n_eos_ids;
    const int32_t *stop_ids;   /* ids that end generation as Q35_STOP_TOKEN, ignore_eos or not */
    int32_t n_stop_ids;
    int32_t max_drafts;        /* drafts per step: 0: the session's k (q35_session_set_spec); > 0: at most
                                  that many; < 0: none (the step then evaluates one token) */
} q35_gen_params;

typedef struct q35_generation q35_generation;

/* What one call produced: n_tokens new tokens (the last one ends the
 * generation when stop is set: the EOS, stop id or max_tokens-th token;
 * callers that print text usually drop an EOS or stop id). The target
 * logits rows that chose them, before the hook and mask, are
 * q35_session_step_logits(session) after a step (after begin: the row
 * begin was given), for log-probabilities. */
typedef struct q35_gen_out {
    int32_t tokens[Q35_SPEC_K_MAX + 1];
    int32_t n_tokens;
    int32_t stop;              /* a q35_stop_reason */
} q35_gen_out;

/* A generation in session (which has just evaluated its prompt) with
 * params (copied; the arrays too). Allocates its buffers here, none while
 * stepping. The sampler's vocabulary must be the engine's. */
q35_status q35_generation_new(q35_session *session, const q35_gen_params *params, q35_generation **out,
                              q35_error *err);
void q35_generation_free(q35_generation *gen);
/* Chooses the first token from the prompt's last logits row (as
 * q35_session_eval or q35_session_sync wrote it; not modified): one token. */
q35_status q35_generation_begin(q35_generation *gen, const float *logits, q35_gen_out *out, q35_error *err);
/* Begins with a first token the caller chose instead (a forced token, or one
 * chosen elsewhere): it is recorded, counted and checked for the stop
 * conditions as a chosen one would be, and the first step evaluates it. */
q35_status q35_generation_begin_with(q35_generation *gen, int32_t token, q35_gen_out *out, q35_error *err);
/* One step: 1..k+1 tokens. Q35_ERR_ARG before begin or after a stop. */
q35_status q35_generation_step(q35_generation *gen, q35_gen_out *out, q35_error *err);
/* One step for n generations of distinct sessions of one engine: the
 * verify rows of all of them go through one forward pass, so the weights
 * are read once for the whole batch (a pass holds 128 rows and a step takes
 * k+1 at most; a batch that needs more takes several passes, each over as
 * many generations as fit). out[i] equals what q35_generation_step would
 * give gens[i] alone. After an error some generations may have stepped.
 * Calls on one engine must not run concurrently. */
q35_status q35_generation_batch_step(q35_generation *const *gens, int32_t n, q35_gen_out *out, q35_error *err);
/* The tokens generated so far (all of them, in order). */
const int32_t *q35_generation_tokens(const q35_generation *gen, int32_t *n);
q35_stop_reason q35_generation_stop(const q35_generation *gen);

/* ---- prefix reuse ----
 * A session records the token ids it holds (every eval and step notes its
 * input; a snapshot carries those of its session). */

/* The token ids at positions 0..q35_session_pos-1 (*n of them); NULL when
 * they are not known (restored from a snapshot that did not know them). */
const int32_t *q35_session_tokens(const q35_session *session, int32_t *n);
/* The token ids the snapshot covers; NULL when its session did not know them. */
const int32_t *q35_snapshot_tokens(const q35_snapshot *snap, int32_t *n);

/* The first half of q35_session_sync, for callers that evaluate the rest
 * themselves (in chunks, say): keeps the session's state, restores snap or
 * resets it, as q35_session_sync would, and evaluates nothing. *n_kept (may
 * be NULL) receives the prompt tokens the session then holds; the caller
 * evaluates prompt[*n_kept..n), at least one token. */
q35_status q35_session_reuse(q35_session *session, const int32_t *prompt, int32_t n, const q35_snapshot *snap,
                             int32_t *n_kept, q35_error *err);
/* Makes the session hold exactly prompt[0..n) and writes the last row's
 * logits (vocab_size floats; logits may be NULL), evaluating only what it
 * cannot reuse. The Gated DeltaNet state cannot be rewound, so it reuses
 * the session's whole history when that is a proper prefix of the prompt,
 * or snap (may be NULL) when its tokens are, whichever is longer; otherwise
 * it starts over. The last prompt token is always evaluated, for the
 * logits. *n_reused (may be NULL) receives the tokens kept. On an error
 * from the evaluation the session may have been reset. */
q35_status q35_session_sync(q35_session *session, const int32_t *prompt, int32_t n, const q35_snapshot *snap,
                            float *logits, int32_t *n_reused, q35_error *err);

/* ---- Images (Qwen3.5's vision tower) ----
 *
 * An image enters a prompt in four steps, each one call:
 *   1. q35_image_process: encoded bytes (JPEG, PNG, WebP, single-frame GIF)
 *      through the model directory's image processor into q35_image_pixels,
 *      transformers' pixel_values and image_grid_thw for that one image;
 *   2. q35_engine_encode_images: the vision tower turns them into a
 *      q35_image_embeds per image: q35_image_embeds_tokens() rows of the
 *      language model's width, one per merge x merge patch group;
 *   3. q35_engine_expand_images: a prompt's ids as the chat template renders
 *      them (one <|image_pad|> per image, inside <|vision_start|> ..
 *      <|vision_end|>) with each image's pad repeated to its token count;
 *   4. q35_session_eval_images: evaluates the expanded ids, each image's
 *      rows taking its embeddings as input and the multimodal rotary
 *      positions of transformers' get_rope_index (t, h, w per patch group
 *      from the current position; text after an image continues from the
 *      image's largest position + 1). The session keeps the offset this
 *      leaves (rows after the image turn at position + offset), so later
 *      q35_session_eval calls, decode steps, speculation with the MTP head,
 *      snapshots and q35_session_sync go on at the right positions.
 * Images are encoded once, outside the token loop; an embeds object may be
 * evaluated in any number of sessions of its engine. Every call fails with a
 * message naming what is wrong (a model without a vision tower:
 * Q35_ERR_UNSUPPORTED; an undecodable image: Q35_ERR_FORMAT or
 * Q35_ERR_UNSUPPORTED; a count that does not match: Q35_ERR_ARG; a prompt
 * that does not fit: Q35_ERR_CONTEXT). */

/* The processor's output for one image, owned by the caller
 * (q35_image_pixels_free). */
typedef struct q35_image_pixels {
    int32_t grid_thw[3];   /* image_grid_thw: (1, height / patch, width / patch) */
    int64_t n_patches;     /* grid_thw[0] * grid_thw[1] * grid_thw[2] */
    int64_t patch_dim;     /* 3 * temporal_patch_size * patch_size^2 */
    float *pixel_values;   /* (n_patches, patch_dim), rows in merge-block order */
} q35_image_pixels;
void q35_image_pixels_free(q35_image_pixels *px); /* frees pixel_values; px itself is the caller's */

/* A model directory's image processor: preprocessor_config.json when there
 * is one, over config.json's vision_config sizes, else Qwen3.5's published
 * values (patch 16, merge 2, temporal patch 2, 65536..16777216 pixels, mean
 * and std 0.5). Thread-safe once loaded. */
typedef struct q35_image_processor q35_image_processor;
q35_status q35_image_processor_load(const char *dir, q35_image_processor **out, q35_error *err);
void q35_image_processor_free(q35_image_processor *p);
/* Decodes len bytes (sniffed; an image declaring more pixels than the
 * processor's limit is refused before its pixels are allocated) and
 * preprocesses them as transformers' Qwen2VLImageProcessor does (EXIF
 * orientation, smart resize, bicubic, normalisation). */
#define Q35_IMAGE_MAX_DECODED_PIXELS ((int64_t)1 << 26) /* the default limit: 8192 x 8192 */
/* The decoded-pixel limit (width * height) of later q35_image_process calls
 * (not concurrent with them); <= 0 restores the default. */
void q35_image_processor_set_max_pixels(q35_image_processor *p, int64_t max_pixels);
q35_status q35_image_process(const q35_image_processor *p, const void *data, size_t len, q35_image_pixels *out,
                             q35_error *err);
/* The <|image_pad|> tokens an image of px takes once encoded (merged
 * patches: n_patches / merge_size^2), known before the tower runs. */
int32_t q35_image_processor_tokens(const q35_image_processor *p, const q35_image_pixels *px);

/* One encoded image: its rows in the language model's width. */
typedef struct q35_image_embeds q35_image_embeds;
/* Runs the vision tower over n images in one call (attention stays within
 * each image); out[i] receives image i's embeddings (all NULL on error).
 * Every pixels' patch_dim must be the tower's and each grid side a multiple
 * of its merge size. Not concurrent with other calls on the engine. */
q35_status q35_engine_encode_images(q35_engine *engine, const q35_image_pixels *pixels, int32_t n,
                                    q35_image_embeds **out, q35_error *err);
void q35_image_embeds_free(q35_image_embeds *im);
int32_t q35_image_embeds_tokens(const q35_image_embeds *im); /* t * h * w / merge^2 */
/* A 64-bit hash of the pixels and grid the embeddings came from (for
 * prefix caches keyed by image content). */
uint64_t q35_image_embeds_hash(const q35_image_embeds *im);
/* The model's <|image_pad|> id (config.json image_token_id), -1 if none. */
int32_t q35_engine_image_token(const q35_engine *engine);

/* ids[0..n) with one image_pad id per image into *out (malloc'd, *n_out
 * ids): image k's pad repeated q35_image_embeds_tokens(images[k]) times.
 * The number of image_pad ids must be n_images. */
q35_status q35_engine_expand_images(const q35_engine *engine, const int32_t *ids, int32_t n,
                                    q35_image_embeds *const *images, int32_t n_images, int32_t **out,
                                    int32_t *n_out, q35_error *err);

/* q35_session_eval for expanded ids holding images: each maximal run of
 * image_pad ids is the next image, and must be exactly its token count;
 * every image must be used. flags: Q35_EVAL_ALL_LOGITS,
 * Q35_EVAL_RECURRENT (not REWINDABLE). Works at any position (after text
 * or an earlier image). The history (q35_session_tokens) records an image
 * row as -1 - (its image's hash & 0x3fffffff), so q35_session_sync never
 * takes a session holding an image for a prefix of a text prompt
 * (q35_session_sync_images does, for the same images); a
 * snapshot restores the rotary offset with the rest. On error the session
 * is left as it was (an error of the pass itself: reset). */
q35_status q35_session_eval_images(q35_session *session, const int32_t *ids, int32_t n,
                                   q35_image_embeds *const *images, int32_t n_images, float *logits, int flags,
                                   q35_error *err);
/* ids (expanded) as a session's history records them (q35_session_tokens,
 * q35_snapshot_tokens): each image row as -1 - (its image's hash &
 * 0x3fffffff), the other ids as they are; out has room for n. The key for
 * prefix caches holding sessions with images. Checks the image_pad runs as
 * q35_session_eval_images does. */
q35_status q35_engine_tag_images(const q35_engine *engine, const int32_t *ids, int32_t n,
                                 q35_image_embeds *const *images, int32_t n_images, int32_t *out, q35_error *err);
/* q35_session_sync for a prompt holding images (expanded ids, the images in
 * order): the session's own history or snap (the longer) is kept when it
 * is a proper prefix of the prompt's tagged form (q35_engine_tag_images)
 * and does not end inside an image; the rest is evaluated with the images
 * it holds; otherwise the session starts over. The last row's logits go to
 * logits; *n_reused (may be NULL) receives the tokens kept. */
q35_status q35_session_sync_images(q35_session *session, const int32_t *ids, int32_t n,
                                   q35_image_embeds *const *images, int32_t n_images, const q35_snapshot *snap,
                                   float *logits, int32_t *n_reused, q35_error *err);
/* The session's multimodal rotary offset (0 until an image is evaluated). */
int32_t q35_session_rope_delta(const q35_session *session);

#ifdef __cplusplus
}
#endif
#endif
