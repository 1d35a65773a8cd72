// tests/config/test_override.cc: command-line overrides (cfg_effective_json), api_keys_file and kv_budget_tokens.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

extern "C" {
#include "config/config.h"
}

namespace {

struct Dir {
  std::string path;
  Dir() {
    char t[] = "/tmp/dserve_ovr_XXXXXX";
    path = mkdtemp(t);
    char real[PATH_MAX];
    if (realpath(path.c_str(), real)) path = real;
  }
  ~Dir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string write(const std::string &name, const std::string &text) {
    std::string p = path + "/" + name;
    std::ofstream(p) << text;
    chmod(p.c_str(), 0600);
    return p;
  }
};

// The effective text of path with sets, parsed back as the children will read it.
struct Effective {
  char err[1024] = "";
  char *json = nullptr;
  cfg_cluster *c = nullptr;
  int rc;
  Effective(const char *path, const char *base, std::initializer_list<cfg_set> sets) {
    rc = cfg_effective_json(path, base, sets.begin(), (int)sets.size(), &json, err, sizeof err);
    if (rc == 0) rc = cfg_parse(json, strlen(json), "/elsewhere/effective.json", &c, err, sizeof err);
  }
  ~Effective() {
    free(json);
    cfg_free(c);
  }
};

const char *kTwo = R"({"model": "../w/m.gguf", "secret_file": "s.secret",
  "router": {"port": 8000, "api_keys": ["k0"]},
  "workers": [{"name": "a", "port": 9100, "threads": 1, "prefix_disk_mb": 1, "prefix_disk_path": "cache/a.bin"},
              {"name": "b", "port": 9101, "threads": 1}]})";

TEST(ConfigOverride, SetsApplyAndPathsBecomeAbsoluteAgainstTheFilesFolder) {
  Dir d;
  std::string p = d.write("c.json", kTwo);
  Effective e(p.c_str(), nullptr,
              {{"router.port", "8080", CFG_SET_JSON},
               {"workers.*.threads", "3", CFG_SET_JSON},
               {"router.api_keys", "k1", CFG_SET_APPEND},
               {"chat_template", "gemma", CFG_SET_STRING},
               {"sampling.temperature", "0", CFG_SET_JSON}});
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_EQ(e.c->router.port, 8080);
  EXPECT_EQ(e.c->workers[0].threads, 3);
  EXPECT_EQ(e.c->workers[1].threads, 3);
  ASSERT_EQ(e.c->router.n_api_keys, 2); // the file's key, then the flag's
  EXPECT_STREQ(e.c->router.api_keys[0], "k0");
  EXPECT_STREQ(e.c->router.api_keys[1], "k1");
  EXPECT_STREQ(e.c->chat_template, "gemma");
  EXPECT_TRUE(e.c->sampling.has_temperature);
  // read from another folder, the paths still mean the file's folder
  EXPECT_EQ(std::string(e.c->model_path), d.path + "/../w/m.gguf");
  EXPECT_EQ(std::string(e.c->secret_file), d.path + "/s.secret");
  EXPECT_EQ(std::string(e.c->workers[0].prefix_disk_path), d.path + "/cache/a.bin");
}

TEST(ConfigOverride, BaseTextResolvesAgainstTheWorkingDirectory) {
  char cwd[PATH_MAX];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  Effective e(nullptr, R"({"workers": [{"port": 1}]})", {{"model", "rel/m.gguf", CFG_SET_STRING}});
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_EQ(std::string(e.c->model_path), std::string(cwd) + "/rel/m.gguf");
}

TEST(ConfigOverride, BadOverridesAreErrorsNamingTheKey) {
  Dir d;
  std::string p = d.write("c.json", kTwo);
  {
    Effective e(p.c_str(), nullptr, {{"router.port", "80x", CFG_SET_JSON}});
    EXPECT_NE(e.rc, 0);
    EXPECT_NE(std::string(e.err).find("router.port"), std::string::npos) << e.err;
  }
  {
    Effective e(p.c_str(), nullptr, {{"model.x", "1", CFG_SET_JSON}}); // through a string
    EXPECT_NE(e.rc, 0);
    EXPECT_NE(std::string(e.err).find("model.x"), std::string::npos) << e.err;
  }
  {
    Effective e(p.c_str(), nullptr, {{"router.port", "70000", CFG_SET_JSON}}); // applied, then judged by cfg_parse
    EXPECT_NE(e.rc, 0);
    EXPECT_NE(std::string(e.err).find("router.port"), std::string::npos) << e.err;
  }
  {
    Effective e(nullptr, R"({"model": "m.gguf"})", {{"workers.*.threads", "2", CFG_SET_JSON}});
    EXPECT_NE(e.rc, 0);
    EXPECT_NE(std::string(e.err).find("no workers"), std::string::npos) << e.err;
  }
  {
    Effective e((d.path + "/missing.json").c_str(), nullptr, {});
    EXPECT_NE(e.rc, 0);
    EXPECT_NE(std::string(e.err).find("missing.json"), std::string::npos) << e.err;
  }
}

TEST(ConfigOverride, ApiKeysFile) {
  Dir d;
  d.write("keys", "# the team's keys\n  alpha  \n\nbeta\r\n");
  d.write("empty", "# nothing\n\n");
  std::string ok = d.write("ok.json", R"({"model": "m.gguf", "router": {"api_keys": ["k0"], "api_keys_file": "keys"},
    "workers": [{"port": 1}]})");
  cfg_cluster *c = nullptr;
  char err[1024];
  ASSERT_EQ(cfg_load(ok.c_str(), &c, err, sizeof err), 0) << err;
  ASSERT_EQ(c->router.n_api_keys, 3);
  EXPECT_STREQ(c->router.api_keys[1], "alpha");
  EXPECT_STREQ(c->router.api_keys[2], "beta");
  cfg_free(c);
  for (const char *file : {"empty", "absent"}) {
    std::string bad = d.write(std::string("bad-") + file + ".json",
                              std::string(R"({"model": "m.gguf", "router": {"api_keys_file": ")") + file +
                                  R"("}, "workers": [{"port": 1}]})");
    EXPECT_NE(cfg_load(bad.c_str(), &c, err, sizeof err), 0) << file;
    EXPECT_NE(std::string(err).find("api_keys_file"), std::string::npos) << err;
    EXPECT_EQ(c, nullptr);
  }
}

TEST(ConfigOverride, KvBudgetTokens) {
  const char *j = R"({"model": "m.gguf", "workers": [{"port": 1, "kv_budget_tokens": 4096}]})";
  cfg_cluster *c = nullptr;
  char err[512];
  ASSERT_EQ(cfg_parse(j, strlen(j), "t.json", &c, err, sizeof err), 0) << err;
  EXPECT_EQ(c->workers[0].kv_budget_tokens, 4096);
  cfg_free(c);
  const char *bad = R"({"model": "m.gguf", "workers": [{"port": 1, "kv_budget_tokens": -1}]})";
  EXPECT_NE(cfg_parse(bad, strlen(bad), "t.json", &c, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("kv_budget_tokens"), std::string::npos) << err;
}

} // namespace
