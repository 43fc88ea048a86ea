/* tests/test_media_source.c: where image bytes come from (src/media/source.c):
 * base64 and data: URLs byte for byte against known encodings, every
 * refusal with the rule it names, the domain list, and file: URLs and local
 * paths inside and outside the allowed directory, symlinks included. The
 * http(s) fetches against a live server are in tests/e2e/test_serve_images.py;
 * here only the refusals that come before any connection. */
#include "test.h"

#include "media/source.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static int b64(const char *s, uint8_t **out, size_t *n, q35_error *err) {
    return q35_base64_decode(s, strlen(s), 1 << 20, out, n, err);
}

TEST(media_source, base64_decodes_rfc4648_vectors_with_and_without_padding) {
    static const char *const enc[] = {"Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy", "Zg", "Zm8", "Zm9vYg"};
    static const char *const dec[] = {"f", "fo", "foo", "foob", "fooba", "foobar", "f", "fo", "foob"};
    for (size_t i = 0; i < sizeof enc / sizeof *enc; i++) {
        uint8_t *o;
        size_t n;
        q35_error err = {0};
        REQUIRE_MSG(b64(enc[i], &o, &n, &err) == Q35_OK, "%s: %s", enc[i], err.msg);
        CHECK_EQ_INT(n, strlen(dec[i]));
        CHECK(!memcmp(o, dec[i], n));
        free(o);
    }
    /* every byte value survives, and whitespace anywhere is skipped (MIME line wrapping) */
    uint8_t *o;
    size_t n;
    q35_error err;
    REQUIRE(b64(" AAEC\r\n/f7/\tgA = = ", &o, &n, &err) == Q35_OK);
    static const uint8_t want[] = {0, 1, 2, 0xfd, 0xfe, 0xff, 0x80};
    CHECK_EQ_INT(n, sizeof want);
    CHECK(!memcmp(o, want, sizeof want));
    free(o);
}

TEST(media_source, base64_refuses_bad_bytes_padding_and_length_naming_the_offset) {
    static const struct { const char *in, *msg; q35_status st; } bad[] = {
        {"Zm9v!mFy", "invalid base64 character '!' at offset 4", Q35_ERR_FORMAT},
        {"Zm9v\x01", "invalid base64 byte 0x01 at offset 4", Q35_ERR_FORMAT},
        {"Zm-v", "invalid base64 character '-' at offset 2", Q35_ERR_FORMAT}, /* the URL-safe alphabet is not base64 */
        {"Zg==Zg==", "base64 data after the '=' padding at offset 4", Q35_ERR_FORMAT},
        {"Z===", "bad base64 padding at offset 1", Q35_ERR_FORMAT},
        {"=Zg", "bad base64 padding at offset 0", Q35_ERR_FORMAT},
        {"Zm9=v", "base64 data after the '=' padding at offset 4", Q35_ERR_FORMAT},
        {"Zg=", "bad base64 padding at the end", Q35_ERR_FORMAT},
        {"Zm9vY", "one character left over", Q35_ERR_FORMAT},
        {"", "empty", Q35_ERR_FORMAT},
        {" \n ", "empty", Q35_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint8_t *o = (uint8_t *)1;
        size_t n = 7;
        q35_error err = {0};
        CHECK_EQ_INT(b64(bad[i].in, &o, &n, &err), bad[i].st);
        CHECK_MSG(strstr(err.msg, bad[i].msg), "'%s': got '%s'", bad[i].in, err.msg);
        CHECK(o == NULL && n == 0);
    }
    /* the size limit counts decoded bytes */
    uint8_t *o;
    size_t n;
    q35_error err;
    CHECK_EQ_INT(q35_base64_decode("Zm9vYmFy", 8, 6, &o, &n, &err), Q35_OK);
    free(o);
    CHECK_EQ_INT(q35_base64_decode("Zm9vYmFy", 8, 5, &o, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "over the limit of 5 bytes"));
    CHECK_EQ_INT(q35_base64_decode("Zm9vYg", 6, 3, &o, &n, &err), Q35_ERR_ARG);
}

static q35_status data_url(const char *u, uint8_t **o, size_t *n, q35_error *err) {
    return q35_data_url_decode(u, strlen(u), 1 << 20, o, n, err);
}

TEST(media_source, data_urls_take_image_types_parameters_and_base64_only) {
    static const char *const ok[] = {"data:image/png;base64,Zm9v", "DATA:Image/JPEG;BASE64,Zm9v", "data:;base64,Zm9v",
                                     "data:image/webp;name=a.webp;base64,Zm9v", "data:application/octet-stream;base64,Zm9v",
                                     "data:image/png;base64, Zm9v\n"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        uint8_t *o;
        size_t n;
        q35_error err = {0};
        REQUIRE_MSG(data_url(ok[i], &o, &n, &err) == Q35_OK, "%s: %s", ok[i], err.msg);
        CHECK(n == 3 && !memcmp(o, "foo", 3));
        free(o);
    }
    static const struct { const char *in, *msg; q35_status st; } bad[] = {
        {"data:image/png,Zm9v", "only base64 data: URLs", Q35_ERR_ARG},
        {"data:image/png;charset=utf-8,Zm9v", "only base64 data: URLs", Q35_ERR_ARG},
        {"data:image/png;base64", "needs a ','", Q35_ERR_ARG},
        {"data:text/plain;base64,Zm9v", "'text/plain' is not an image type", Q35_ERR_ARG},
        {"data:video/mp4;base64,Zm9v", "not an image type", Q35_ERR_ARG},
        {"data:image;base64,Zm9v", "is not type/subtype", Q35_ERR_ARG},
        {"data:image/;base64,Zm9v", "has no subtype", Q35_ERR_ARG},
        {"data:image/png;;base64,Zm9v", "an empty parameter", Q35_ERR_ARG},
        {"data:image/png;base64;x=1,Zm9v", "has no value", Q35_ERR_ARG},
        {"data:image/png;x=,Zm9v", "has an empty value", Q35_ERR_ARG},
        {"data:image/png base64,Zm9v", "unexpected ' '", Q35_ERR_ARG},
        {"data:image/png;base64,Zm9v$", "bad base64 in the data: URL: invalid base64 character '$' at offset 4", Q35_ERR_FORMAT},
        {"data:image/png;base64,", "the base64 payload is empty", Q35_ERR_FORMAT},
        {"http://x/y", "not a data: URL", Q35_ERR_ARG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint8_t *o;
        size_t n;
        q35_error err = {0};
        CHECK_EQ_INT(data_url(bad[i].in, &o, &n, &err), bad[i].st);
        CHECK_MSG(strstr(err.msg, bad[i].msg), "'%s': got '%s'", bad[i].in, err.msg);
    }
}

TEST(media_source, the_domain_list_matches_whole_host_names_only) {
    q35_media_policy p = {.allowed_domains = "example.com, Images.Example.org,127.0.0.1 ::1 [fe80::2]"};
    CHECK(q35_media_domain_allowed(&p, "[::1]")); /* libcurl's host of http://[::1]/ */
    CHECK(q35_media_domain_allowed(&p, "[fe80::2]"));
    CHECK(q35_media_domain_allowed(&p, "fe80::2"));
    CHECK(!q35_media_domain_allowed(&p, "[::2]"));
    CHECK(q35_media_domain_allowed(&p, "example.com"));
    CHECK(q35_media_domain_allowed(&p, "EXAMPLE.com"));
    CHECK(q35_media_domain_allowed(&p, "images.example.org"));
    CHECK(q35_media_domain_allowed(&p, "127.0.0.1"));
    CHECK(!q35_media_domain_allowed(&p, "evil.example.com"));
    CHECK(!q35_media_domain_allowed(&p, "example.co"));
    CHECK(!q35_media_domain_allowed(&p, "example.com.evil"));
    CHECK(!q35_media_domain_allowed(&p, ""));
    q35_media_policy none = {0};
    CHECK(!q35_media_domain_allowed(&none, "example.com"));
}

TEST(media_source, http_urls_are_refused_before_any_connection_unless_the_host_is_listed) {
    static const struct { const char *domains, *url, *msg; } cases[] = {
        {NULL, "http://example.com/a.png", "not allowed on this server (start it with --allowed-media-domains)"},
        {"", "https://example.com/a.png", "not allowed on this server"},
        {"example.com", "http://other.example/a.png", "its domain is other.example"},
        {"example.com", "http://example.com.evil/a.png", "its domain is example.com.evil"},
        {"example.com", "http://user@other.example/a.png", "its domain is other.example"},
        {"example.com", "ftp://example.com/a.png", "got a ftp: URL"},
        {"example.com", "gopher://example.com/", "got a gopher: URL"},
        {"example.com", "example.com/a.png", "must be an http(s), data or file URL"},
        {"example.com", "not a url at all", "must be an http(s), data or file URL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        q35_media_policy p = {.allowed_domains = cases[i].domains};
        uint8_t *o;
        size_t n;
        q35_error err = {0};
        CHECK_EQ_INT(q35_media_load_url(&p, cases[i].url, &o, &n, &err), Q35_ERR_ARG);
        CHECK_MSG(strstr(err.msg, cases[i].msg), "'%s': got '%s'", cases[i].url, err.msg);
    }
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

TEST(media_source, local_files_load_only_strictly_inside_the_allowed_directory) {
    const char *tmp = q35_test_tmpdir();
    char root[1024], inner[1100], outside[1100], link_out[1100], link_in[1100], url[1200], sibling[1100], sib_file[1200];
    snprintf(root, sizeof root, "%s/allowed", tmp);
    snprintf(sibling, sizeof sibling, "%s/allowed-not", tmp);
    REQUIRE(mkdir(root, 0700) == 0 && mkdir(sibling, 0700) == 0);
    snprintf(inner, sizeof inner, "%s/in.png", root);
    snprintf(outside, sizeof outside, "%s/out.png", tmp);
    snprintf(sib_file, sizeof sib_file, "%s/x.png", sibling);
    snprintf(link_out, sizeof link_out, "%s/escape.png", root);
    snprintf(link_in, sizeof link_in, "%s/alias.png", root);
    write_file(inner, "inside");
    write_file(outside, "outside");
    write_file(sib_file, "sibling");
    REQUIRE(symlink(outside, link_out) == 0 && symlink(inner, link_in) == 0);
    q35_media_policy p = {.allowed_local_path = root};
    uint8_t *o;
    size_t n;
    q35_error err = {0};

    snprintf(url, sizeof url, "file://%s", inner);
    REQUIRE_MSG(q35_media_load_url(&p, url, &o, &n, &err) == Q35_OK, "%s", err.msg);
    CHECK(n == 6 && !memcmp(o, "inside", 6));
    free(o);
    REQUIRE(q35_media_load_path(&p, inner, &o, &n, &err) == Q35_OK);
    free(o);
    /* a symlink that stays inside is fine; one that leads out is not */
    snprintf(url, sizeof url, "file://localhost%s", link_in);
    CHECK_EQ_INT(q35_media_load_url(&p, url, &o, &n, &err), Q35_OK);
    free(o);
    snprintf(url, sizeof url, "file://%s", link_out);
    CHECK_EQ_INT(q35_media_load_url(&p, url, &o, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "must be a subpath of --allowed-local-media-path"));
    /* .. out of it, a sibling whose name starts the same, the directory itself */
    snprintf(url, sizeof url, "file://%s/../out.png", root);
    CHECK_EQ_INT(q35_media_load_url(&p, url, &o, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "must be a subpath"));
    CHECK_EQ_INT(q35_media_load_path(&p, sib_file, &o, &n, &err), Q35_ERR_ARG);
    /* outside, a missing file is refused as an existing one is: no answer about the file system */
    snprintf(url, sizeof url, "file://%s/../nothing-here.png", root);
    CHECK_EQ_INT(q35_media_load_url(&p, url, &o, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "must be a subpath"));
    CHECK_EQ_INT(q35_media_load_path(&p, "/nonexistent-dir/x.png", &o, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "must be a subpath"));
    /* "." and repeated slashes inside are fine */
    snprintf(url, sizeof url, "%s/./sub/..//in.png", root);
    CHECK_EQ_INT(q35_media_load_path(&p, url, &o, &n, &err), Q35_OK);
    free(o);
    CHECK_EQ_INT(q35_media_load_path(&p, root, &o, &n, &err), Q35_ERR_ARG);
    /* percent-encoding is decoded before the check */
    snprintf(url, sizeof url, "file://%s/%%2e%%2e/out.png", root);
    CHECK_EQ_INT(q35_media_load_url(&p, url, &o, &n, &err), Q35_ERR_ARG);
    /* a host, a missing file, a relative path, no allowed directory */
    snprintf(url, sizeof url, "file://example.com%s", inner);
    CHECK_EQ_INT(q35_media_load_url(&p, url, &o, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "Bad file:// URL"));
    snprintf(url, sizeof url, "file://%s/missing.png", root);
    CHECK_EQ_INT(q35_media_load_url(&p, url, &o, &n, &err), Q35_ERR_IO);
    CHECK(strstr(err.msg, "No such file"));
    /* a relative path is the working directory's (the runner's: not the allowed one) */
    CHECK_EQ_INT(q35_media_load_path(&p, "in.png", &o, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "must be a subpath"));
    /* the command line's form: a URL or a path */
    REQUIRE(q35_media_load(&p, inner, &o, &n, &err) == Q35_OK);
    CHECK(n == 6);
    free(o);
    snprintf(url, sizeof url, "file://%s", inner);
    REQUIRE(q35_media_load(&p, url, &o, &n, &err) == Q35_OK);
    free(o);
    REQUIRE(q35_media_load(&p, "data:image/png;base64,Zm9v", &o, &n, &err) == Q35_OK);
    CHECK(n == 3);
    free(o);
    CHECK_EQ_INT(q35_media_load(&p, "http://example.com/a.png", &o, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "not allowed on this server"));
    q35_media_policy none = {0};
    snprintf(url, sizeof url, "file://%s", inner);
    CHECK_EQ_INT(q35_media_load_url(&none, url, &o, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "cannot load local files without --allowed-local-media-path"));
    /* the size limit */
    q35_media_policy small = {.allowed_local_path = root, .max_bytes = 5};
    CHECK_EQ_INT(q35_media_load_path(&small, inner, &o, &n, &err), Q35_ERR_IO);
    CHECK(strstr(err.msg, "over the limit of 5"));
}
