/* qwen35.c: entry point of the qwen35 program; dispatches to subcommands. */
#include "cli.h"
#include "qwen35.h"

#include <stdio.h>
#include <string.h>

static int cmd_version(int argc, char **argv) {
    (void)argc; (void)argv;
    printf("qwen35 %s\n", Q35_VERSION);
    return 0;
}

typedef struct { const char *name; int (*fn)(int, char **); const char *help; } command;

static const command commands[] = {
    {"chat", cmd_chat, "chat on the terminal (the embedded demo model without -m)"},
    {"run", cmd_run, "greedy generation from prompt token ids; prints ids and tok/s"},
    {"logits", cmd_logits, "write float32 logits for every prompt position"},
    {"speed", cmd_speed, "engine speed: decode/prompt tok/s, GB/s vs measured bandwidth, spec costs"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (completions, chat, streaming, metrics)"},
    {"prepare", cmd_prepare, "convert a checkpoint into a weight cache (BFP4/BFP8/BF16), or download one first"},
    {"verify", cmd_verify, "re-hash every tensor of a weight cache and name each mismatch"},
    {"info", cmd_info, "tensor counts by dtype, bytes, bytes per token, and the 9B cache size per policy"},
    {"eval", cmd_eval, "perplexity on a text or token ids; KL divergence and top-1 agreement against a base"},
    {"bench", cmd_bench, "speed benchmark against an OpenAI-compatible server"},
    {"draft-vocab", cmd_draft_vocab, "the most frequent token ids of a corpus: a reduced draft head for --draft-vocab"},
    {"tokenize", cmd_tokenize, "text or a chat request to token ids (and pieces)"},
    {"version", cmd_version, "print the version"},
};

static void usage(FILE *fp) {
    fprintf(fp, "qwen35 %s: Qwen3.5 inference engine\n\nusage: qwen35 COMMAND [options]\n\ncommands:\n", Q35_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(fp, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(fp, "\n'qwen35 COMMAND --help' shows a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "qwen35: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
