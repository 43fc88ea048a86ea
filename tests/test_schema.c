/* Tests of src/text/schema.c, schema_match.c and token_trie.c: valid
 * documents are accepted whole, invalid ones refused at the first wrong
 * byte, random walks through the recogniser always reach a whole document
 * that parses, unsupported keywords and invalid schemas name the field, and
 * the trie's mask equals feeding each token on its own. The keywords past
 * the basic ones (pattern, format, numeric bounds, oneOf, allOf, $ref,
 * prefixItems, uniqueItems: schema_regex.c, schema_keywords.c) have their
 * own group, schema_keywords; the e2e schema suite validates generated
 * documents with the jsonschema package. */
#include "test.h"
#include "text/schema.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static q35_schema *compile(const char *text) {
    json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
    q35_schema *s = NULL;
    char where[128], msg[256];
    if (!j || q35_schema_compile(j, &s, where, sizeof where, msg, sizeof msg)) {
        q35_test_fail(__FILE__, __LINE__, "schema %s refused: %s: %s", text, where, msg);
        s = NULL;
    }
    json_decref(j);
    return s;
}

/* How many bytes of doc are accepted; -1: all, and the document is whole. */
static long accepted(const q35_schema *s, const char *doc) {
    q35_schema_state st;
    q35_schema_start(s, &st);
    for (size_t i = 0; doc[i]; i++)
        if (!q35_schema_byte(s, &st, (unsigned char)doc[i])) return (long)i;
    return q35_schema_complete(s, &st) ? -1 : (long)strlen(doc);
}

static const char OBJ[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bc\"]},\"minItems\":1,\"maxItems\":2},"
    "\"x\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}]},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"tags\"],\"additionalProperties\":false}";

TEST(schema, accepts_valid_documents) {
    q35_schema *s = compile(OBJ);
    REQUIRE(s);
    static const char *const good[] = {
        "{\"name\":\"Al\",\"tags\":[\"a\"]}",
        "{\"name\": \"Al\", \"age\": -12, \"tags\": [\"a\", \"bc\"], \"x\": 1.5e+3, \"ok\": true}",
        "{\"name\":\"\\\"\\n\",\"tags\":[\"bc\"],\"x\":null}",
        "{\"name\":\"h\xc3\xa9llo\",\"tags\":[\"a\"],\"ok\":false}",
        "{\"name\":\"\xf0\x9f\x98\x80\",\"age\":0,\"tags\":[\"a\"]}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECK_MSG(accepted(s, good[i]) == -1, "%s: %ld", good[i], accepted(s, good[i]));
    q35_schema_free(s);
}

TEST(schema, refuses_invalid_prefixes_at_the_first_wrong_byte) {
    q35_schema *s = compile(OBJ);
    REQUIRE(s);
    static const struct { const char *doc; long at; } bad[] = {
        {"[", 0},
        {"{\"age\":1", 2},                         /* name is required and comes first */
        {"{\"name\":\"abcdef\"", 14},             /* maxLength 5 */
        {"{\"name\":\"a\",\"tags\":[]", 20},       /* minItems 1 */
        {"{\"name\":\"a\",\"tags\":[\"a\",\"a\",", 27}, /* maxItems 2 */
        {"{\"name\":\"a\",\"tags\":[\"b\"", 22},     /* "b" starts "bc" only */
        {"{\"name\":\"a\",\"tags\":[\"a\"],\"age\":1", 26}, /* age comes before tags */
        {"{\"name\":\"a\",\"tags\":[\"a\"],\"ok\":1", 30},
        {"{\"name\":\"a\",\"tags\":[\"a\"],\"zz\":1", 26}, /* no additional keys */
        {"{\"name\":  \"a\"", 9},                  /* one space at most */
        {"{\"name\":\"a\"\n", 11},
        {"{\"name\":\"a\",\"age\":01", 19},          /* no leading zeros */
        {"{\"name\":\"a\",\"age\":1.5", 19},         /* an integer */
        {"{\"name\":\"\x01", 9},                   /* control characters must be escaped */
        {"{\"name\":\"\\u0041", 10},               /* no \\u escapes */
        {"{\"name\":\"\xc3(", 10},                 /* bad UTF-8 */
        {"{\"name\":\"\xed\xa0\x80", 10},          /* a surrogate */
        {"{\"name\":\"a\",\"tags\":[\"a\"]}x", 25},  /* nothing after the document */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(accepted(s, bad[i].doc) == bad[i].at, "%s: refused at %ld, not %ld", bad[i].doc, accepted(s, bad[i].doc), bad[i].at);
    q35_schema_free(s);
}

TEST(schema, keywords) {
    static const struct { const char *schema, *doc; long at; } cases[] = {
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"ab\"", -1},
        {"{\"type\":\"string\",\"minLength\":2}", "\"a\"", 2},
        {"{\"type\":\"string\",\"maxLength\":1}", "\"\xe6\x97\xa5\"", -1}, /* characters, not bytes */
        {"{\"const\":{\"a\":[1,2]}}", "{\"a\":[1,2]}", -1},
        {"{\"enum\":[1,12,\"x\"]}", "12", -1},
        {"{\"enum\":[1,12,\"x\"]}", "1", -1},
        {"{\"enum\":[1,12,\"x\"]}", "13", 1},
        {"{\"type\":[\"integer\",\"null\"]}", "null", -1},
        {"{\"type\":[\"integer\",\"null\"]}", "-7", -1},
        {"{\"type\":\"integer\",\"enum\":[1,\"a\",2.0]}", "\"a\"", 0}, /* values of other types are left out */
        {"{\"type\":\"number\"}", "-0.25E-7", -1},
        {"{\"type\":\"number\"}", "1234567890123456", 15}, /* at most 15 integer digits */
        {"{\"type\":\"boolean\"}", "fals", 4},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":0}", "[1", 1},
        {"{\"type\":\"array\"}", "[1, \"a\", null, true]", -1}, /* untyped items: scalars */
        {"{\"type\":\"array\"}", "[[", 1},
        {"{\"type\":\"object\"}", "{}", -1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":true}}", "{\"a\":\"x\", \"b\":3}", -1},
        {"{\"type\":\"object\",\"required\":[\"k\"]}", "{\"k\":false}", -1},
        {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}]}", "{\"a\":\"s\"}", -1},
        {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}]}", "{\"a\":7}", -1},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},{\"type\":\"boolean\"},{\"type\":\"array\"},"
         "{\"type\":\"object\"},{\"type\":\"null\"}]}", "null", -1}, /* the sixth alternative, past the thread cap */
        {"{\"type\":\"object\",\"properties\":{\"q\\\"k\":{\"type\":\"null\"}}}", "{\"q\\\"k\":null}", -1},
        {"{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"null\"},\"a\":{\"type\":\"null\"}}}", "{\"a\":null}", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        q35_schema *s = compile(cases[i].schema);
        if (!s) continue;
        long at = accepted(s, cases[i].doc);
        CHECK_MSG(at == cases[i].at, "%s with %s: %ld, not %ld", cases[i].schema, cases[i].doc, at, cases[i].at);
        q35_schema_free(s);
    }
}

TEST(schema, errors_name_the_field) {
    static const struct { const char *schema, *where, *says; } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", ".pattern", "not supported"},
        {"{\"properties\":{\"a\":{\"format\":\"date\",\"minLength\":3}}}", ".properties.a.format", "not supported"},
        {"{\"type\":\"strung\"}", ".type", "type name"},
        {"{\"type\":[\"string\",3]}", ".type[1]", "type name"},
        {"{\"type\":\"array\",\"minItems\":2,\"maxItems\":1}", ".minItems", "above"},
        {"{\"type\":\"string\",\"maxLength\":1.5}", ".maxLength", "non-negative integer"},
        {"{\"enum\":[]}", ".enum", "non-empty"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", "", "no value"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"oneOf\":[]}]}", ".anyOf[1].oneOf", "non-empty"},
        {"{\"type\":\"object\",\"required\":[1]}", ".required[0]", "names"},
        {"{\"type\":\"object\",\"properties\":[]}", ".properties", "object"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"multipleOf\":2}}", ".items.multipleOf", "not supported"},
        {"{\"type\":\"array\",\"items\":false,\"minItems\":1}", ".items", "minItems"},
        {"{\"anyOf\":[],\"type\":\"null\"}", ".anyOf", "non-empty"},
        {"3", "", "object or true"},
        {"false", "", "object or true"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *j = json_loads(cases[i].schema, JSON_DECODE_ANY, NULL);
        REQUIRE(j);
        q35_schema *s = (q35_schema *)1;
        char where[128], msg[256];
        CHECK(q35_schema_compile(j, &s, where, sizeof where, msg, sizeof msg) == -1);
        CHECK(s == NULL);
        CHECK_MSG(!strcmp(where, cases[i].where), "%s: at '%s', not '%s' (%s)", cases[i].schema, where, cases[i].where, msg);
        CHECK_MSG(strstr(msg, cases[i].says) != NULL, "%s: '%s' lacks '%s'", cases[i].schema, msg, cases[i].says);
        json_decref(j);
    }
    char deep[2048] = "";
    for (int i = 0; i < 20; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 20; i++) strcat(deep, "}");
    json_t *j = json_loads(deep, 0, NULL);
    q35_schema *s;
    char where[512], msg[256];
    CHECK(q35_schema_compile(j, &s, where, sizeof where, msg, sizeof msg) == -1 && strstr(msg, "deeper"));
    json_decref(j);
}

/* Random walks: from every state some byte goes on (or the document is
 * whole), and what the walk writes parses as JSON. */
TEST(schema, random_walks_end_in_documents_that_parse) {
    static const char *const schemas[] = {
        OBJ,
        "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\",\"maxLength\":3},"
        "\"v\":{\"anyOf\":[{\"type\":\"number\"},{\"enum\":[\"a\",1,[null]]},{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":2}]}}},\"maxItems\":3}",
        "{\"type\":[\"object\",\"string\",\"null\"],\"properties\":{\"a\":{\"type\":\"integer\"}},\"maxLength\":4}",
    };
    uint64_t rng = 12345;
    for (size_t k = 0; k < sizeof schemas / sizeof *schemas; k++) {
        q35_schema *s = compile(schemas[k]);
        REQUIRE(s);
        for (int walk = 0; walk < 300; walk++) {
            q35_schema_state st;
            q35_schema_start(s, &st);
            char doc[4096];
            size_t n = 0;
            while (n < sizeof doc - 1) {
                if (q35_schema_complete(s, &st) && (q35_schema_closed(s, &st) || rng % 4 == 0)) break;
                int ok[256], n_ok = 0;
                for (int c = 1; c < 256; c++) {
                    q35_schema_state t;
                    q35_schema_copy(&t, &st);
                    if (q35_schema_byte(s, &t, (unsigned char)c)) ok[n_ok++] = c;
                }
                REQUIRE_MSG(n_ok > 0, "stuck after '%.*s'", (int)n, doc);
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                /* favour the structural bytes, so walks end */
                int c = ok[(rng >> 33) % (uint64_t)n_ok];
                for (int i = 0; i < n_ok && (rng >> 20) % 3 == 0; i++)
                    if (ok[i] == '"' || ok[i] == ']' || ok[i] == '}' || ok[i] == ',') c = ok[i];
                REQUIRE(q35_schema_byte(s, &st, (unsigned char)c));
                doc[n++] = (char)c;
            }
            doc[n] = 0;
            REQUIRE_MSG(q35_schema_complete(s, &st), "not whole: %s", doc);
            json_error_t e;
            json_t *j = json_loads(doc, JSON_DECODE_ANY, &e);
            CHECK_MSG(j != NULL, "%s: %s", doc, e.text);
            json_decref(j);
        }
        q35_schema_free(s);
    }
}

/* The trie's mask after each prefix equals feeding each token on its own. */
static void check_masks(const q35_schema *s, const char *const *words, int32_t V, const char *const *prefixes, size_t n_prefixes) {
    size_t len[64];
    uint8_t live[64];
    if (V > 64) { q35_test_fail(__FILE__, __LINE__, "too many words"); return; }
    for (int32_t t = 0; t < V; t++) len[t] = strlen(words[t]);
    q35_token_trie *trie = q35_token_trie_new(words, len, V);
    if (!trie) { q35_test_fail(__FILE__, __LINE__, "no trie"); return; }
    for (size_t p = 0; p < n_prefixes; p++) {
        q35_schema_state st;
        q35_schema_start(s, &st);
        if (!q35_schema_feed(s, &st, prefixes[p], strlen(prefixes[p]))) { q35_test_fail(__FILE__, __LINE__, "prefix %s refused", prefixes[p]); continue; }
        int32_t n = q35_token_trie_mask(trie, s, &st, live), want = 0;
        for (int32_t t = 0; t < V; t++) {
            q35_schema_state one;
            q35_schema_copy(&one, &st);
            bool ok = len[t] && q35_schema_feed(s, &one, words[t], len[t]);
            want += ok;
            CHECK_MSG(live[t] == ok, "after '%s' token '%s': %d", prefixes[p], words[t], live[t]);
        }
        CHECK_EQ_INT(n, want);
    }
    q35_token_trie_free(trie);
}

TEST(schema, trie_mask_equals_feeding_each_token) {
    static const char *const words[] = {"{", "{\"", "\"", "\"name", "name", "\":", "\": \"", "a", "ab", "abc", "\\", "\\\"",
                                        "1", "12", ".5", "e", "}", "\"}", "\",", " ", ", \"", "tags", "\":[", "[", "]", "],",
                                        "true", "tr", "null", "\xc3", "\xa9", "\xc3\xa9", "", "\x01", "age", "\"age\":"};
    q35_schema *s = compile(OBJ);
    REQUIRE(s);
    static const char *const prefixes[] = {"", "{", "{\"name\":", "{\"name\":\"a", "{\"name\":\"\xc3", "{\"name\":\"a\",\"tags\":[",
                                           "{\"name\":\"a\",\"tags\":[\"a\"]", "{\"name\":\"a\",\"age\":1"};
    check_masks(s, words, (int32_t)(sizeof words / sizeof *words), prefixes, sizeof prefixes / sizeof *prefixes);
    q35_schema_free(s);
}

/* Inside a pattern's string the plain tokens are walked by the DFA alone (token_trie.c): the same mask. */
TEST(schema, trie_mask_in_a_pattern_string_equals_feeding_each_token) {
    static const char *const words[] = {"a", "ab", "abc", "abca", "b", "c", "x", "xa", "\xc3\xa9", "a\xc3\xa9", "\xc3", "\xa9", "\"",
                                        "a\"", "\\", "\",\"", "\", \"u\":\"", "zab", "z", "\xe6\x97\xa5", "b\"}", " ", "}", "\x01"};
    q35_schema *s = compile("{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"string\",\"pattern\":\"^[a-c]+.?$\","
                            "\"maxLength\":4},\"u\":{\"type\":\"string\",\"pattern\":\"ab\",\"maxLength\":6},\"w\":{\"type\":\"string\",\"pattern\":\"b\"}},"
                            "\"required\":[\"c\",\"u\",\"w\"]}");
    REQUIRE(s);
    static const char *const prefixes[] = {"{\"c\":\"", "{\"c\":\"a", "{\"c\":\"abc", "{\"c\":\"ab\xc3\xa9", "{\"c\":\"a\",\"u\":\"",
                                           "{\"c\":\"a\",\"u\":\"za", "{\"c\":\"a\",\"u\":\"zzzza", "{\"c\":\"a\",\"u\":\"ab",
                                           /* no maxLength: the mask of a state that comes back is the schema's cached one */
                                           "{\"c\":\"a\",\"u\":\"ab\",\"w\":\"", "{\"c\":\"a\",\"u\":\"ab\",\"w\":\"zz",
                                           "{\"c\":\"a\",\"u\":\"ab\",\"w\":\"zzz\xc3\xa9", "{\"c\":\"a\",\"u\":\"ab\",\"w\":\"ab",
                                           "{\"c\":\"a\",\"u\":\"ab\",\"w\":\"abab"};
    check_masks(s, words, (int32_t)(sizeof words / sizeof *words), prefixes, sizeof prefixes / sizeof *prefixes);
    q35_schema_free(s);
}

TEST(schema, tool_call_grammar) {
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"city\":{\"type\":\"string\",\"maxLength\":6},\"days\":{\"type\":\"integer\"},\"u\":{\"type\":\"string\",\"enum\":[\"c\",\"<x\"]},"
        "\"o\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}}}},\"required\":[\"city\",\"days\",\"u\",\"o\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]", 0, NULL);
    REQUIRE(tools);
    q35_schema *s;
    char where[256], msg[256];
    REQUIRE(q35_schema_compile_tool_call(tools, NULL, &s, where, sizeof where, msg, sizeof msg) == 0);
    static const char CALL[] = "<tool_call>\n<function=get>\n<parameter=city>\nPa ris\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                               "<parameter=u>\nc\n</parameter>\n<parameter=o>\n{\"a\":true}\n</parameter>\n</function>\n</tool_call>";
    CHECK_EQ_INT(accepted(s, CALL), -1);
    CHECK_EQ_INT(accepted(s, "<tool_call>\n<function=now>\n</function>\n</tool_call>"), -1);
    CHECK_EQ_INT(accepted(s, "<tool_call>\n<function=get>\n<parameter=days>"), 38);       /* city comes first */
    CHECK_EQ_INT(accepted(s, "<tool_call>\n<function=get>\n<parameter=city>\nNuLl\n"), 48); /* read back as null */
    CHECK(accepted(s, "<tool_call>\n<function=get>\n<parameter=city>\nnulls\n<") == 51); /* "nulls" is a string */
    CHECK_EQ_INT(accepted(s, "<tool_call>\n<function=get>\n<parameter=city>\na<"), 45);   /* no '<' in a raw string */
    CHECK_EQ_INT(accepted(s, "<tool_call>\n<function=get>\n<parameter=city>\nabcdefg"), 50); /* maxLength 6 */
    q35_schema_free(s);
    REQUIRE(q35_schema_compile_tool_call(tools, "now", &s, where, sizeof where, msg, sizeof msg) == 0);
    CHECK_EQ_INT(accepted(s, "<tool_call>\n<function=g"), 22);
    q35_schema_free(s);
    CHECK(q35_schema_compile_tool_call(tools, "nope", &s, where, sizeof where, msg, sizeof msg) == -1);
    json_decref(tools);
    tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"null\"}]}},"
                       "\"required\":[\"a\"]}}}]", 0, NULL);
    CHECK(q35_schema_compile_tool_call(tools, NULL, &s, where, sizeof where, msg, sizeof msg) == -1);
    CHECK_STR_EQ(where, "[0].function.parameters.properties.a.type");
    json_decref(tools);
}

/* The same inside a tool call's raw string parameter, where plain tokens take the shortcut. */
TEST(schema, trie_mask_in_a_raw_parameter_equals_feeding_each_token) {
    static const char *const words[] = {"a", "Pa", "ris", "\"", "\\", "<", "a<", "\n", "\n</", "\n</parameter>\n", "null", "nu",
                                        "ll", "l", "\xc3", "\xa9", "\xc3\xa9", " x", "\x01", "abcdefgh", "<tool_call>", "\n<"};
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\",\"properties\":{"
                               "\"city\":{\"type\":\"string\",\"maxLength\":7}},\"required\":[\"city\"]}}}]", 0, NULL);
    q35_schema *s;
    char where[256], msg[256];
    REQUIRE(tools && q35_schema_compile_tool_call(tools, NULL, &s, where, sizeof where, msg, sizeof msg) == 0);
    static const char *const prefixes[] = {"", "<tool_call>\n<function=get>\n<parameter=city>\n",
                                           "<tool_call>\n<function=get>\n<parameter=city>\nPa",
                                           "<tool_call>\n<function=get>\n<parameter=city>\nnul",
                                           "<tool_call>\n<function=get>\n<parameter=city>\nabcdef",
                                           "<tool_call>\n<function=get>\n<parameter=city>\n\xc3"};
    check_masks(s, words, (int32_t)(sizeof words / sizeof *words), prefixes, sizeof prefixes / sizeof *prefixes);
    q35_schema_free(s);
    json_decref(tools);
}

/* ---- pattern, format, bounds, oneOf, allOf, $ref, prefixItems, uniqueItems ---- */

TEST(schema_keywords, accept_and_refuse_at_the_first_wrong_byte) {
    static const struct { const char *schema, *doc; long at; } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^[a-c]+x$\"}", "\"abcx\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^[a-c]+x$\"}", "\"abd", 3},
        {"{\"type\":\"string\",\"pattern\":\"^[a-c]+x$\"}", "\"x\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", "\"zzabzz\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", "\"zza\"", 4},
        {"{\"type\":\"string\",\"pattern\":\"^a{2,3}$\"}", "\"aaaa", 4},
        {"{\"type\":\"string\",\"pattern\":\"^(?:ab|cd)*$\",\"maxLength\":4}", "\"abcd\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^(?:ab|cd)*$\",\"maxLength\":3}", "\"aba", 3},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\d\\\\w\\\\s.$\"}", "\"1_ \u00e9\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^[^a]$\"}", "\"\u00e9\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^.*$\"}", "\"a\\", 2},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-28\"", -1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-30\"", 9},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-13", 7},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-05-01T12:30:00Z\"", -1},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-05-01T12:30:00+02:00\"", -1},
        {"{\"type\":\"string\",\"format\":\"time\"}", "\"24", 2},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"", -1},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567e", 9},
        {"{\"type\":\"string\",\"format\":\"email\"}", "\"a.b@ex-ample.org\"", -1},
        {"{\"type\":\"string\",\"format\":\"email\"}", "\"a@b\"", 4},
        {"{\"type\":\"string\",\"format\":\"ipv4\"}", "\"192.168.0.255\"", -1},
        {"{\"type\":\"string\",\"format\":\"ipv4\"}", "\"256", 3},
        {"{\"type\":\"string\",\"format\":\"ipv4\"}", "\"01", 2},
        {"{\"type\":\"string\",\"format\":\"no-such-format\"}", "\"anything\"", -1},
        {"{\"type\":\"integer\",\"minimum\":-12,\"maximum\":305}", "-12", -1},
        {"{\"type\":\"integer\",\"minimum\":-12,\"maximum\":305}", "-13", 2},
        {"{\"type\":\"integer\",\"minimum\":-12,\"maximum\":305}", "305", -1},
        {"{\"type\":\"integer\",\"minimum\":-12,\"maximum\":305}", "306", 2},
        {"{\"type\":\"integer\",\"minimum\":-12,\"maximum\":305}", "1000", 3},
        {"{\"type\":\"integer\",\"minimum\":-12,\"maximum\":305}", "0", -1},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}", "0", 0},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}", "10", 1},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}", "9", -1},
        {"{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":true}", "5", 1}, /* 5 only begins 50 */
        {"{\"type\":\"integer\",\"minimum\":100}", "99", 2},
        {"{\"type\":\"integer\",\"minimum\":100}", "123456789012345", -1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.75", -1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1", -1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1.", 1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "-", 0},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-1}", "-2.7", 2}, /* -2.x may pass -2.5 */
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-1}", "-1.5", -1},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-1}", "-1", -1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-1,\"maximum\":0}", "-0.5", -1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-1,\"maximum\":0}", "-1", 1},
        {"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "7", -1},
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"x\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},\"y\":{\"type\":\"string\"}},\"required\":[\"kind\",\"y\"]}]}", "{\"kind\":\"b\",\"y\":\"s\"}", -1},
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"x\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},\"y\":{\"type\":\"string\"}},\"required\":[\"kind\",\"y\"]}]}", "{\"kind\":\"b\",\"x", 13},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}", "{\"a\":1,\"b\":\"x\"}", -1},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}", "{\"a\":1}", 6},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0}}},{\"properties\":{\"a\":{\"maximum\":9}}}],\"required\":[\"a\"]}", "{\"a\":10", 6},
        {"{\"$defs\":{\"pos\":{\"type\":\"integer\",\"minimum\":1}},\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/pos\"}}", "[1, 0", 4},
        {"{\"definitions\":{\"s\":{\"type\":\"string\",\"maxLength\":2}},\"$ref\":\"#/definitions/s\"}", "\"abc", 3},
        {"{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"$ref\":\"#\"}},\"required\":[\"v\"]}", "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3}}}", -1},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"}}", "[1, \"a\", true, false]", -1},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"}}", "[1, 2", 4},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":false}", "[1, ", 2},
        {"{\"type\":\"array\",\"uniqueItems\":true,\"maxItems\":1}", "[1]", -1},

    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        q35_schema *s = compile(cases[i].schema);
        if (!s) continue;
        long at = accepted(s, cases[i].doc);
        CHECK_MSG(at == cases[i].at, "%s with %s: %ld, not %ld", cases[i].schema, cases[i].doc, at, cases[i].at);
        q35_schema_free(s);
    }
}

TEST(schema_keywords, errors_name_the_field) {
    static const struct { const char *schema, *where, *says; } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", ".pattern", "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"a\\\\bb\"}", ".pattern", "not supported"},
        {"{\"type\":\"string\",\"pattern\":\"a{1,100}\"}", ".pattern", "above 64"},
        {"{\"type\":\"string\",\"pattern\":\"[a\"}", ".pattern", "not closed"},
        {"{\"type\":\"string\",\"pattern\":\"a^b\"}", ".pattern", "start"},
        {"{\"type\":\"string\",\"pattern\":\"\\u00e9\"}", ".pattern", "non-ASCII"},
        {"{\"type\":\"string\",\"pattern\":\"^\\\"$\"}", ".pattern", "matches no string"},
        {"{\"type\":\"string\",\"pattern\":\"(a|b|c|d){30}(e|f|g){30}x{60}[a-z]{60}[0-9a-f]{60}q{60}[a-z]{60}.{60}z{60}\"}", ".pattern", "more than"},
        {"{\"type\":\"string\",\"pattern\":\"^abcdef$\",\"maxLength\":3}", ".pattern", "maxLength"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"format\":\"date\"}", ".pattern", "together"},
        {"{\"type\":\"integer\",\"minimum\":10,\"maximum\":2}", "", "no integer"},
        {"{\"type\":\"integer\",\"minimum\":\"1\"}", "", "must be numbers"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", ".uniqueItems", "not supported"},
        {"{\"type\":\"array\",\"prefixItems\":{}}", ".prefixItems", "list"},
        {"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"maxLength\":3}]}", ".oneOf", "may both hold"},
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"}}}]}", ".oneOf", "may both hold"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", ".allOf", "disagree on 'type'"},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":false},{\"properties\":{\"b\":{}},\"required\":[\"b\"]}]}", ".allOf", "forbids"},
        {"{\"$ref\":\"#/$defs/missing\"}", ".$ref", "does not name"},
        {"{\"$ref\":\"http://example.com/s.json\"}", ".$ref", "does not name"},
        {"{\"$ref\":\"#/$defs/a\",\"type\":\"string\",\"$defs\":{\"a\":{}}}", ".$ref", "beside"},
        {"{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"c\":{\"$ref\":\"#/$defs/t\"}},\"required\":[\"c\"]}},\"$ref\":\"#/$defs/t\"}", "", "no document within"},

    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *j = json_loads(cases[i].schema, JSON_DECODE_ANY, NULL);
        REQUIRE(j);
        q35_schema *s = (q35_schema *)1;
        char where[128], msg[256];
        CHECK_MSG(q35_schema_compile(j, &s, where, sizeof where, msg, sizeof msg) == -1, "%s compiled", cases[i].schema);
        CHECK(s == NULL);
        CHECK_MSG(!strcmp(where, cases[i].where), "%s: at '%s', not '%s' (%s)", cases[i].schema, where, cases[i].where, msg);
        CHECK_MSG(strstr(msg, cases[i].says) != NULL, "%s: '%s' lacks '%s'", cases[i].schema, msg, cases[i].says);
        json_decref(j);
    }
}
