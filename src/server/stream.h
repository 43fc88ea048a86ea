/* stream.h: the SSE response of a streaming request (stream.c). */
#ifndef Q35_SERVER_STREAM_H
#define Q35_SERVER_STREAM_H

#include "server/context.h"
#include "server/http.h"

/* Queues the streaming response of the submitted task t on connection c
 * (socket fd), taking the caller's reference to t. */
enum MHD_Result q35_stream_respond(q35_server *srv, struct MHD_Connection *c, q35_task *t, int fd);

#endif
