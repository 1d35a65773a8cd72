// tests/config/test_null_config.cc: the null model in a config: asked for by name only, its keys and their bounds.
#include <gtest/gtest.h>

#include <string>

extern "C" {
#include "config/config.h"
}

namespace {

struct NullCfg {
  cfg_cluster *c = nullptr;
  char err[512] = "";
  int rc = 0;
  explicit NullCfg(const std::string &json, const char *path = "/etc/d/t.json") {
    rc = cfg_parse(json.data(), json.size(), path, &c, err, sizeof err);
  }
  ~NullCfg() { cfg_free(c); }
};

std::string cfg_with(const char *model, const char *worker_extra) {
  return std::string(R"({"model": ")") + model + R"(", "workers": [{"name": "w0", "port": 9100)" + worker_extra +
         "}]}";
}

TEST(NullConfig, NullByNameIsNotAPathAndHasDefaults) {
  NullCfg c(cfg_with("null", ""));
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(c.c->model_null, 1);
  EXPECT_STREQ(c.c->model_path, "null"); // not /etc/d/null
  EXPECT_DOUBLE_EQ(c.c->workers[0].null_step_ms, CFG_DEF_NULL_STEP_MS);
  EXPECT_DOUBLE_EQ(c.c->workers[0].null_prefill_us_per_token, CFG_DEF_NULL_PREFILL_US_PER_TOKEN);
  EXPECT_EQ(c.c->workers[0].null_kv_bytes_per_token, CFG_DEF_NULL_KV_BYTES_PER_TOKEN);
}

TEST(NullConfig, KeysTakeTheirValues) {
  NullCfg c(cfg_with("null", R"(, "null_step_ms": 5, "null_prefill_us_per_token": 0, "null_kv_bytes_per_token": 2048)"));
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_DOUBLE_EQ(c.c->workers[0].null_step_ms, 5);
  EXPECT_DOUBLE_EQ(c.c->workers[0].null_prefill_us_per_token, 0);
  EXPECT_EQ(c.c->workers[0].null_kv_bytes_per_token, 2048);
}

TEST(NullConfig, AFileNamedNullOrAMissingFileIsNeverTheNullModel) {
  for (const char *m : {"./null", "null.gguf", "Null", "null ", "/no/such/null", "missing.gguf"}) {
    NullCfg c(cfg_with(m, ""));
    ASSERT_EQ(c.rc, 0) << m << ": " << c.err;
    EXPECT_EQ(c.c->model_null, 0) << m;
    EXPECT_STRNE(c.c->model_path, "null") << m;
  }
}

TEST(NullConfig, NullKeysOnARealModelAreRefusedNamingTheKey) {
  for (const char *k : {"null_step_ms", "null_prefill_us_per_token", "null_kv_bytes_per_token"}) {
    NullCfg c(cfg_with("m.gguf", (std::string(", \"") + k + "\": 1024").c_str()));
    EXPECT_NE(c.rc, 0) << k;
    EXPECT_NE(std::string(c.err).find(std::string("workers[0].") + k), std::string::npos) << c.err;
    EXPECT_NE(std::string(c.err).find("\"null\" only"), std::string::npos) << c.err;
  }
}

TEST(NullConfig, OutOfRangeValuesAreRefusedNamingTheKey) {
  struct {
    const char *extra, *key;
  } bad[] = {{R"(, "null_step_ms": -1)", "null_step_ms"},
             {R"(, "null_step_ms": "fast")", "null_step_ms"},
             {R"(, "null_prefill_us_per_token": -5)", "null_prefill_us_per_token"},
             {R"(, "null_kv_bytes_per_token": 1000)", "null_kv_bytes_per_token"},
             {R"(, "null_kv_bytes_per_token": 36865)", "null_kv_bytes_per_token"},
             {R"(, "null_kv_bytes_per_token": 0)", "null_kv_bytes_per_token"}};
  for (auto &b : bad) {
    NullCfg c(cfg_with("null", b.extra));
    EXPECT_NE(c.rc, 0) << b.extra;
    EXPECT_NE(std::string(c.err).find(std::string("workers[0].") + b.key), std::string::npos) << c.err;
  }
}

TEST(NullConfig, CodeMadeSectionsGetTheKvDefault) {
  cfg_worker w{};
  cfg_worker_defaults(&w);
  EXPECT_EQ(w.null_kv_bytes_per_token, CFG_DEF_NULL_KV_BYTES_PER_TOKEN);
}

} // namespace
