/* routes.h: the endpoints (routes.c): /v1/completions, /v1/chat/completions,
 * /v1/models, /health, /metrics, /tokenize, /detokenize, /version. */
#ifndef Q35_SERVER_ROUTES_H
#define Q35_SERVER_ROUTES_H

#include "server/context.h"
#include "server/http.h"

/* Answers one request whose body has fully arrived: the route, its method,
 * the API key, readiness, then the endpoint's handler. */
enum MHD_Result q35_route(q35_server *srv, struct MHD_Connection *c, const char *url, const char *method,
                          const q35_http_body *body);

#endif
