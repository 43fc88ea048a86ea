/* stop.h: the stop-string matcher (stop.c): it holds back generated text that
 * could still grow into a stop string, so no part of one reaches a client. */
#ifndef Q35_SERVER_STOP_H
#define Q35_SERVER_STOP_H

#include <stddef.h>
#include <stdint.h>

/* Text goes in piece by piece; q35_stop_feed returns how many bytes of the
 * held text may be released now (a prefix of q35_stop_text). A suffix that
 * is a prefix of some stop string stays held. When a stop string is found,
 * *matched is its index and the releasable text ends where it starts; the
 * matcher then refuses more text. q35_stop_finish releases the rest. */
typedef struct q35_stop_matcher {
    char **stop;
    int32_t n_stop;
    char *buf;
    size_t len, cap;
    int32_t matched;           /* -1 until a stop string is found */
} q35_stop_matcher;

void q35_stop_init(q35_stop_matcher *m, char **stop, int32_t n_stop);
void q35_stop_free(q35_stop_matcher *m);
/* Returns bytes now releasable from the front of the held text, or -1 on
 * allocation failure. Call q35_stop_consume(m, n) after copying them out. */
long q35_stop_feed(q35_stop_matcher *m, const char *text, size_t len);
size_t q35_stop_finish(q35_stop_matcher *m); /* all held text is releasable (no match) */
const char *q35_stop_text(const q35_stop_matcher *m);
void q35_stop_consume(q35_stop_matcher *m, size_t n);

#endif
