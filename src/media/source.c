/* source.c: image bytes from data:, http(s): and file: URLs under a policy
 * (source.h). The data-URL and base64 parsers are hand-written and bounded
 * (fuzz/fuzz_media_source.c); URLs are taken apart by libcurl's URL parser,
 * so the host checked against the allowed domains is the host libcurl then
 * connects to; fetching is libcurl with redirects followed here, one hop at
 * a time, so each new location is checked before it is requested. */
#include "media/source.h"

#include "base/util.h"

#include <curl/curl.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int q35_media_global_init(void) { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1; }

static size_t max_of(const q35_media_policy *p) { return p && p->max_bytes ? p->max_bytes : Q35_MEDIA_DEFAULT_MAX_BYTES; }

/* ---- base64 and data: URLs ---------------------------------------------- */

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

q35_status q35_base64_decode(const char *s, size_t len, size_t max_bytes, uint8_t **out, size_t *n, q35_error *err) {
    *out = NULL;
    *n = 0;
    /* an upper bound of the output (whitespace only makes it less), and
     * never more than the limit and the last quantum past it */
    size_t cap = len / 4 * 3 + 3;
    if (cap > max_bytes + 3) cap = max_bytes + 3;
    uint8_t *o = malloc(cap);
    if (!o) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    uint32_t acc = 0;
    int k = 0, pad = 0;
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (is_ws(c)) continue;
        if (c == '=') {
            /* padding only ends the payload: at most two, after 2 or 3 characters of a quantum */
            if (k < 2 || pad + k >= 4) { free(o); return q35_fail(err, Q35_ERR_FORMAT, "bad base64 padding at offset %zu", i); }
            pad++;
            continue;
        }
        int v = b64_value(c);
        if (v < 0) {
            free(o);
            if (c >= 0x20 && c < 0x7f) return q35_fail(err, Q35_ERR_FORMAT, "invalid base64 character '%c' at offset %zu", c, i);
            return q35_fail(err, Q35_ERR_FORMAT, "invalid base64 byte 0x%02x at offset %zu", c, i);
        }
        if (pad) { free(o); return q35_fail(err, Q35_ERR_FORMAT, "base64 data after the '=' padding at offset %zu", i); }
        acc = acc << 6 | (uint32_t)v;
        if (++k == 4) {
            o[m++] = (uint8_t)(acc >> 16);
            o[m++] = (uint8_t)(acc >> 8);
            o[m++] = (uint8_t)acc;
            acc = 0;
            k = 0;
            if (m > max_bytes) { free(o); return q35_fail(err, Q35_ERR_ARG, "the image is over the limit of %zu bytes", max_bytes); }
        }
    }
    if (pad && k + pad != 4) { free(o); return q35_fail(err, Q35_ERR_FORMAT, "bad base64 padding at the end"); }
    if (k == 1) { free(o); return q35_fail(err, Q35_ERR_FORMAT, "truncated base64: one character left over at the end"); }
    if (k == 2) o[m++] = (uint8_t)(acc >> 4);
    if (k == 3) { o[m++] = (uint8_t)(acc >> 10); o[m++] = (uint8_t)(acc >> 2); }
    if (m > max_bytes) { free(o); return q35_fail(err, Q35_ERR_ARG, "the image is over the limit of %zu bytes", max_bytes); }
    if (!m) { free(o); return q35_fail(err, Q35_ERR_FORMAT, "the base64 payload is empty"); }
    *out = o;
    *n = m;
    return Q35_OK;
}

/* An RFC 2045 token character (media types and parameters). */
static int is_tchar(unsigned char c) { return c > 0x20 && c < 0x7f && !strchr("()<>@,;:\\\"/[]?=", c); }

q35_status q35_data_url_decode(const char *url, size_t len, size_t max_bytes, uint8_t **out, size_t *n, q35_error *err) {
    *out = NULL;
    *n = 0;
    if (len < 5 || strncasecmp(url, "data:", 5)) return q35_fail(err, Q35_ERR_ARG, "not a data: URL");
    const char *p = url + 5, *end = url + len;
    const char *comma = memchr(p, ',', (size_t)(end - p));
    if (!comma) return q35_fail(err, Q35_ERR_ARG, "a data: URL needs a ',' before its payload");
    /* type/subtype, optional */
    const char *t = p;
    while (p < comma && is_tchar((unsigned char)*p)) p++;
    size_t tlen = (size_t)(p - t);
    if (tlen) {
        if (p >= comma || *p != '/') return q35_fail(err, Q35_ERR_ARG, "the data: URL's media type '%.*s' is not type/subtype", (int)tlen, t);
        p++;
        const char *s = p;
        while (p < comma && is_tchar((unsigned char)*p)) p++;
        if (p == s) return q35_fail(err, Q35_ERR_ARG, "the data: URL's media type has no subtype");
        size_t full = (size_t)(p - t);
        if (!(tlen == 5 && !strncasecmp(t, "image", 5)) && !(full == 24 && !strncasecmp(t, "application/octet-stream", 24)))
            return q35_fail(err, Q35_ERR_ARG, "the data: URL's media type '%.*s' is not an image type", (int)(full > 64 ? 64 : full), t);
    }
    /* ;name=value parameters, then ;base64 right before the comma */
    int base64 = 0;
    while (p < comma) {
        if (*p != ';') return q35_fail(err, Q35_ERR_ARG, "unexpected '%c' in the data: URL's media type at offset %zu", *p, (size_t)(p - url));
        p++;
        const char *name = p;
        while (p < comma && is_tchar((unsigned char)*p)) p++;
        size_t nlen = (size_t)(p - name);
        if (!nlen) return q35_fail(err, Q35_ERR_ARG, "an empty parameter in the data: URL at offset %zu", (size_t)(p - url));
        if (p == comma && nlen == 6 && !strncasecmp(name, "base64", 6)) { base64 = 1; break; }
        if (p >= comma || *p != '=') return q35_fail(err, Q35_ERR_ARG, "the data: URL's parameter '%.*s' has no value", (int)(nlen > 32 ? 32 : nlen), name);
        p++;
        const char *v = p;
        while (p < comma && is_tchar((unsigned char)*p)) p++;
        if (p == v) return q35_fail(err, Q35_ERR_ARG, "the data: URL's parameter '%.*s' has an empty value", (int)(nlen > 32 ? 32 : nlen), name);
    }
    if (!base64) return q35_fail(err, Q35_ERR_ARG, "only base64 data: URLs are supported (data:image/...;base64,...)");
    q35_status st = q35_base64_decode(comma + 1, (size_t)(end - comma - 1), max_bytes, out, n, err);
    if (st == Q35_ERR_FORMAT) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        return q35_fail(err, st, "bad base64 in the data: URL: %s", m);
    }
    return st;
}

/* ---- the policy --------------------------------------------------------- */

int q35_media_domain_allowed(const q35_media_policy *p, const char *host) {
    if (!p || !p->allowed_domains || !host || !*host) return 0;
    size_t hl = strlen(host);
    if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') { host++; hl -= 2; } /* an IPv6 literal, as vLLM's hostname gives it */
    for (const char *s = p->allowed_domains; *s;) {
        while (*s == ',' || *s == ' ' || *s == '\t') s++;
        const char *e = s;
        while (*e && *e != ',' && *e != ' ' && *e != '\t') e++;
        const char *a = s, *b = e;
        if (b - a > 2 && *a == '[' && b[-1] == ']') { a++; b--; }
        if ((size_t)(b - a) == hl && !strncasecmp(a, host, hl)) return 1;
        s = e;
    }
    return 0;
}

/* ---- file: and local paths ---------------------------------------------- */

/* An absolute path with "." and ".." and repeated slashes taken out, as
 * text (no file system access); -1 when it does not fit. */
static int lexical_normal(const char *path, char *out, size_t cap) {
    size_t m = 0;
    out[m++] = '/';
    for (const char *s = path; *s;) {
        while (*s == '/') s++;
        const char *e = s;
        while (*e && *e != '/') e++;
        size_t len = (size_t)(e - s);
        if (len == 2 && s[0] == '.' && s[1] == '.') {
            while (m > 1 && out[m - 1] != '/') m--; /* drop the last component */
            if (m > 1) m--;
        } else if (len && !(len == 1 && s[0] == '.')) {
            if (m + len + 2 > cap) return -1;
            if (m > 1) out[m++] = '/';
            memcpy(out + m, s, len);
            m += len;
        }
        s = e;
    }
    out[m] = 0;
    return 0;
}

/* Strictly inside root: the directory itself is not a file to read; "/" holds everything. */
static int path_inside(const char *path, const char *root) {
    size_t rl = strlen(root);
    return rl == 1 ? path[1] != 0 : !strncmp(path, root, rl) && path[rl] == '/' && path[rl + 1];
}

q35_status q35_media_load_path(const q35_media_policy *p, const char *path, uint8_t **out, size_t *n, q35_error *err) {
    *out = NULL;
    *n = 0;
    if (!p || !p->allowed_local_path || !*p->allowed_local_path)
        return q35_fail(err, Q35_ERR_ARG, "cannot load local files without --allowed-local-media-path");
    char root[PATH_MAX], given[PATH_MAX], lex[PATH_MAX], real[PATH_MAX];
    if (!realpath(p->allowed_local_path, root))
        return q35_fail(err, Q35_ERR_ARG, "--allowed-local-media-path %s: %s", p->allowed_local_path, strerror(errno));
    char abs[PATH_MAX];
    if (path[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd) || (size_t)snprintf(abs, sizeof abs, "%s/%s", cwd, path) >= sizeof abs)
            return q35_fail(err, Q35_ERR_ARG, "the file path %.200s cannot be made absolute", path);
        path = abs;
    }
    /* first as text, so that a path outside is refused the same whether or
     * not it exists (no file system answer leaks out); then resolved, so
     * that no symlink leads out */
    if (lexical_normal(path, lex, sizeof lex) || lexical_normal(p->allowed_local_path, given, sizeof given) ||
        !(path_inside(lex, root) || path_inside(lex, given)))
        return q35_fail(err, Q35_ERR_ARG, "the file path %.200s must be a subpath of --allowed-local-media-path %.200s", path, root);
    if (!realpath(lex, real)) return q35_fail(err, Q35_ERR_IO, "cannot open %.200s: %s", path, strerror(errno));
    if (!path_inside(real, root))
        return q35_fail(err, Q35_ERR_ARG, "the file path %.200s must be a subpath of --allowed-local-media-path %.200s", path, root);
    int fd = open(real, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return q35_fail(err, Q35_ERR_IO, "cannot open %.200s: %s", path, strerror(errno));
    struct stat sb;
    size_t max = max_of(p);
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) { close(fd); return q35_fail(err, Q35_ERR_ARG, "%.200s is not a regular file", path); }
    if ((uint64_t)sb.st_size > max) {
        close(fd);
        return q35_fail(err, Q35_ERR_IO, "%.200s has %lld bytes, over the limit of %zu", path, (long long)sb.st_size, max);
    }
    size_t want = (size_t)sb.st_size;
    uint8_t *b = malloc(want ? want : 1);
    if (!b) { close(fd); return q35_fail(err, Q35_ERR_NOMEM, "out of memory"); }
    size_t got = 0;
    while (got < want) {
        ssize_t r = read(fd, b + got, want - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != want || !got) { free(b); return q35_fail(err, Q35_ERR_IO, "cannot read %.200s", path); }
    *out = b;
    *n = got;
    return Q35_OK;
}

/* ---- URLs --------------------------------------------------------------- */

typedef struct fetch_buf {
    uint8_t *data;
    size_t len, cap, max;
    int over;
} fetch_buf;

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    fetch_buf *f = ud;
    size_t add = size * nmemb;
    if (add > f->max - f->len) { f->over = 1; return 0; } /* aborts the transfer */
    if (f->len + add > f->cap) {
        size_t nc = f->cap ? f->cap : 65536;
        while (nc < f->len + add) nc *= 2;
        if (nc > f->max) nc = f->max;
        uint8_t *d = realloc(f->data, nc);
        if (!d) return 0;
        f->data = d;
        f->cap = nc;
    }
    memcpy(f->data + f->len, ptr, add);
    f->len += add;
    return add;
}

/* The scheme (lower case), host and decoded path of url; 0, or libcurl's
 * reason it cannot take the URL apart. */
static int url_parts(const char *url, char **scheme, char **host, char **path) {
    *scheme = *host = NULL;
    if (path) *path = NULL;
    CURLU *u = curl_url();
    if (!u) return CURLUE_OUT_OF_MEMORY;
    int rc = (int)curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME);
    if (!rc) rc = (int)curl_url_get(u, CURLUPART_SCHEME, scheme, 0);
    if (!rc && curl_url_get(u, CURLUPART_HOST, host, 0)) *host = NULL; /* file: URLs may have none */
    if (!rc && path) rc = (int)curl_url_get(u, CURLUPART_PATH, path, CURLU_URLDECODE);
    curl_url_cleanup(u);
    if (rc) {
        curl_free(*scheme);
        curl_free(*host);
        if (path) curl_free(*path);
        *scheme = *host = NULL;
        if (path) *path = NULL;
    }
    return rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One URL that is http(s) on an allowed host, or an error saying which it is not. */
static q35_status check_http(const q35_media_policy *p, const char *url, int hop, q35_error *err) {
    char *scheme, *host;
    if (url_parts(url, &scheme, &host, NULL))
        return q35_fail(err, Q35_ERR_ARG, hop ? "a redirect goes to a URL that cannot be parsed" : "the URL cannot be parsed");
    q35_status st = Q35_OK;
    if (strcmp(scheme, "http") && strcmp(scheme, "https"))
        st = q35_fail(err, Q35_ERR_ARG, "a redirect goes to a %s: URL; only http and https are followed", scheme);
    else if (!p || !p->allowed_domains || !*p->allowed_domains)
        st = q35_fail(err, Q35_ERR_ARG, "http(s) image URLs are not allowed on this server (start it with --allowed-media-domains)");
    else if (!q35_media_domain_allowed(p, host))
        st = q35_fail(err, Q35_ERR_ARG, "%s must be from one of the allowed domains (--allowed-media-domains %.200s); its domain is %.200s",
                      hop ? "a redirect" : "the URL", p->allowed_domains, host ? host : "(none)");
    curl_free(scheme);
    curl_free(host);
    return st;
}

static q35_status fetch_http(const q35_media_policy *p, const char *url0, uint8_t **out, size_t *n, q35_error *err) {
    double timeout = p && p->timeout_s > 0 ? p->timeout_s : Q35_MEDIA_DEFAULT_TIMEOUT_S;
    int max_redirects = p && p->max_redirects >= 0 ? p->max_redirects : Q35_MEDIA_DEFAULT_REDIRECTS;
    double deadline = now_s() + timeout;
    fetch_buf f = {.max = max_of(p)};
    char *url = strdup(url0);
    if (!url) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    q35_status st = Q35_OK;
    for (int hop = 0;; hop++) {
        if ((st = check_http(p, url, hop, err))) break;
        CURL *c = curl_easy_init();
        if (!c) { st = q35_fail(err, Q35_ERR_NOMEM, "out of memory"); break; }
        char ebuf[CURL_ERROR_SIZE] = "";
        long left_ms = (long)((deadline - now_s()) * 1000);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L); /* each hop is checked here first */
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, left_ms > 1 ? left_ms : 1L);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, left_ms > 1 ? left_ms : 1L);
        curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)f.max);
        curl_easy_setopt(c, CURLOPT_USERAGENT, "qwen35/" Q35_VERSION);
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ebuf);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &f);
        f.len = 0;
        f.over = 0;
        CURLcode rc = curl_easy_perform(c);
        long code = 0;
        char *loc = NULL;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        if (!rc && code >= 300 && code < 400) {
            curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &loc);
            loc = loc ? strdup(loc) : NULL;
        }
        curl_easy_cleanup(c);
        if (rc == CURLE_OPERATION_TIMEDOUT) {
            st = q35_fail(err, Q35_ERR_IO, "fetching the image timed out after %g s", timeout);
            break;
        }
        if (f.over || rc == CURLE_FILESIZE_EXCEEDED) {
            st = q35_fail(err, Q35_ERR_IO, "the image at the URL is over the limit of %zu bytes", f.max);
            break;
        }
        if (rc) { st = q35_fail(err, Q35_ERR_IO, "fetching the image failed: %s", *ebuf ? ebuf : curl_easy_strerror(rc)); break; }
        if (code >= 300 && code < 400) {
            if (!loc) { st = q35_fail(err, Q35_ERR_IO, "fetching the image failed: HTTP %ld without a Location", code); break; }
            if (hop >= max_redirects) {
                free(loc);
                st = q35_fail(err, Q35_ERR_IO, "fetching the image failed: more than %d redirects", max_redirects);
                break;
            }
            free(url);
            url = loc;
            continue;
        }
        if (code < 200 || code >= 300) { st = q35_fail(err, Q35_ERR_IO, "fetching the image failed: HTTP %ld", code); break; }
        if (!f.len) { st = q35_fail(err, Q35_ERR_IO, "fetching the image failed: the response is empty"); break; }
        break;
    }
    free(url);
    if (st) { free(f.data); return st; }
    *out = f.data;
    *n = f.len;
    return Q35_OK;
}

q35_status q35_media_load(const q35_media_policy *p, const char *s, uint8_t **out, size_t *n, q35_error *err) {
    const char *c = s;
    while (isalpha((unsigned char)*c) || (c > s && (isdigit((unsigned char)*c) || *c == '+' || *c == '-' || *c == '.'))) c++;
    bool url = !strncasecmp(s, "data:", 5) || (c > s && !strncmp(c, "://", 3));
    return url ? q35_media_load_url(p, s, out, n, err) : q35_media_load_path(p, s, out, n, err);
}

q35_status q35_media_load_url(const q35_media_policy *p, const char *url, uint8_t **out, size_t *n, q35_error *err) {
    *out = NULL;
    *n = 0;
    size_t len = strlen(url);
    if (len >= 5 && !strncasecmp(url, "data:", 5)) return q35_data_url_decode(url, len, max_of(p), out, n, err);
    char *scheme, *host, *path;
    int rc = url_parts(url, &scheme, &host, &path);
    if (rc)
        return q35_fail(err, Q35_ERR_ARG, "the URL must be an http(s), data or file URL; '%.64s' is not one (%s)", url,
                        curl_url_strerror((CURLUcode)rc));
    q35_status st;
    if (!strcmp(scheme, "http") || !strcmp(scheme, "https")) {
        st = fetch_http(p, url, out, n, err);
    } else if (!strcmp(scheme, "file")) {
        st = q35_media_load_path(p, path, out, n, err);
    } else {
        st = q35_fail(err, Q35_ERR_ARG, "the URL must be an http(s), data or file URL, got a %.32s: URL", scheme);
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(path);
    return st;
}
