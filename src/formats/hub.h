/* hub.h: downloading a checkpoint (one revision of a model repository) from
 * the Hugging Face Hub (hub.c). */
#ifndef Q35_HUB_H
#define Q35_HUB_H

#include "base/util.h"

typedef struct q35_download_params {
    const char *endpoint;  /* "https://huggingface.co"; http only for 127.0.0.1 / localhost */
    const char *repo;      /* "Qwen/Qwen3.5-9B" */
    const char *revision;  /* commit hash or branch */
    const char *dest_dir;  /* created if missing; files resume from dest/NAME.partial */
    q35_progress_fn progress;
    void *progress_ctx;
} q35_download_params;

q35_status q35_hub_download(const q35_download_params *p, q35_error *err);

#endif
