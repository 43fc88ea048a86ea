/* Tests of config.json parsing: nesting, defaults that transformers applies,
 * and the layer pattern rules. */
#include "model/model.h"
#include "test.h"

static const char *base_text =
    "{\"vocab_size\": 100, \"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 6,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"linear_num_key_heads\": 2,"
    " \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8,"
    " \"linear_conv_kernel_dim\": 4 %s}";

static q35_status parse(const char *extra, q35_config *c, q35_error *err) {
    char buf[2048];
    snprintf(buf, sizeof buf, base_text, extra);
    return q35_config_parse(buf, strlen(buf), "config.json", c, err);
}

TEST(config, transformers_defaults_when_absent) {
    q35_config c;
    q35_error err;
    REQUIRE(parse("", &c, &err) == Q35_OK);
    CHECK_NEAR(c.rope_theta, 10000.0, 0);
    CHECK_NEAR(c.partial_rotary_factor, 0.25, 0);
    CHECK_EQ_INT(c.rotary_dim, 4);
    CHECK_NEAR(c.rms_norm_eps, 1e-6, 1e-12);
    CHECK_EQ_INT(c.tie_word_embeddings, 0);
    CHECK_EQ_INT(c.eos_token_id, -1);
    /* full_attention_interval defaults to 4: layer 3 only among 6 */
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(c.layer_is_full[i], i == 3);
}

TEST(config, rope_parameters_and_interval) {
    q35_config c;
    q35_error err;
    REQUIRE(parse(", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e7, \"partial_rotary_factor\": 0.5},"
                  " \"full_attention_interval\": 3, \"eos_token_id\": [7, 9]", &c, &err) == Q35_OK);
    CHECK_NEAR(c.rope_theta, 1e7, 1);
    CHECK_EQ_INT(c.rotary_dim, 8);
    CHECK_EQ_INT(c.eos_token_id, 7);
    CHECK_EQ_INT(c.n_layer_full, 2);
    CHECK(c.layer_is_full[2] && c.layer_is_full[5] && !c.layer_is_full[0]);
    CHECK(parse(", \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1e7}", &c, &err) == Q35_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "yarn") != NULL);
    CHECK(parse(", \"partial_rotary_factor\": 0.01", &c, &err) == Q35_ERR_UNSUPPORTED);
}

TEST(config, wrapper_with_text_config) {
    const char *t = "{\"model_type\": \"qwen3_5\", \"tie_word_embeddings\": true, \"text_config\": {\"model_type\": \"qwen3_5_text\","
                    " \"vocab_size\": 10, \"hidden_size\": 8, \"intermediate_size\": 8, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8, \"linear_num_key_heads\": 1,"
                    " \"linear_num_value_heads\": 1, \"linear_key_head_dim\": 4, \"linear_value_head_dim\": 4,"
                    " \"linear_conv_kernel_dim\": 4, \"layer_types\": [\"linear_attention\", \"full_attention\"],"
                    " \"mtp_num_hidden_layers\": 1}}";
    q35_config c;
    q35_error err;
    REQUIRE(q35_config_parse(t, strlen(t), "config.json", &c, &err) == Q35_OK);
    CHECK_EQ_INT(c.tie_word_embeddings, 1);
    CHECK_EQ_INT(c.mtp_num_hidden_layers, 1);
    CHECK(!c.layer_is_full[0] && c.layer_is_full[1]);
    CHECK(q35_config_parse("[1,2]", 5, "config.json", &c, &err) == Q35_ERR_FORMAT);
    CHECK(q35_config_parse("{\"model_type\": \"llama\"}", 23, "config.json", &c, &err) == Q35_ERR_UNSUPPORTED);
}
