// tests/config/test_config.cc: the cluster config parser: shipped configs, defaults, path resolution, strict errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#include <fstream>
#include <sys/stat.h>

extern "C" {
#include "config/config.h"
#include "ctl/secret.h"
}

namespace {

std::string src(const char *rel) { return std::string(DSERVE_SOURCE_DIR) + "/" + rel; }

struct Cfg {
  cfg_cluster *c = nullptr;
  char err[512] = "";
  int rc = 0;
  Cfg(const std::string &json, const char *path = "t.json") {
    rc = cfg_parse(json.data(), json.size(), path, &c, err, sizeof err);
  }
  ~Cfg() { cfg_free(c); }
};

const char *kMin = R"({"model": "m.gguf", "workers": [{"name": "w0", "port": 9100}]})";

// No secret in this process's environment (the tests that need one set it themselves).
void clear_secret_env() {
  unsetenv("DSERVE_SECRET");
  unsetenv("DSERVE_SECRET_FILE");
}

// A temp folder with files in it, removed at the end.
struct Dir {
  std::string path;
  Dir() {
    char t[] = "/tmp/dserve_cfg_XXXXXX";
    path = mkdtemp(t);
  }
  ~Dir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string write(const std::string &name, const std::string &text, mode_t mode = 0600) {
    std::string p = path + "/" + name;
    std::ofstream(p) << text;
    chmod(p.c_str(), mode);
    return p;
  }
};

struct Loaded {
  cfg_cluster *c = nullptr;
  char err[1024] = "";
  int rc;
  explicit Loaded(const std::string &path) { rc = cfg_load(path.c_str(), &c, err, sizeof err); }
  ~Loaded() { cfg_free(c); }
};

const char *kHex = "0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0"; // 64 hex digits
std::string one_node(const std::string &host, const std::string &top = "") {
  return R"({"model": "m.gguf", )" + top + R"("workers": [{"name": "w0", "host": ")" + host + R"(", "port": 9100}]})";
}

TEST(Config, ShippedLocal) {
  clear_secret_env();
  cfg_cluster *c = nullptr;
  char err[512] = "";
  std::string p = src("configs/local.json");
  ASSERT_EQ(cfg_load(p.c_str(), &c, err, sizeof err), 0) << err;
  EXPECT_TRUE(c->has_router);
  EXPECT_STREQ(c->router.node, "local");
  EXPECT_STREQ(c->router.host, "127.0.0.1");
  EXPECT_EQ(c->router.port, 8000);
  ASSERT_EQ(c->n_workers, 1);
  EXPECT_EQ(c->workers[0].role, CFG_ROLE_BOTH);
  EXPECT_EQ(c->workers[0].threads, 2);
  ASSERT_EQ(c->n_nodes, 1);
  EXPECT_STREQ(c->nodes[0], "local");
  EXPECT_EQ(std::string(c->model_path), src("configs/../models/weights/SmolLM2-135M-Instruct.Q4_1.gguf"));
  EXPECT_STREQ(c->path, p.c_str());
  // llama-server's sampling defaults, shipped explicitly
  EXPECT_TRUE(c->sampling.has_temperature && c->sampling.has_top_k && c->sampling.has_top_p &&
              c->sampling.has_min_p && c->sampling.has_repetition_penalty);
  EXPECT_EQ(c->sampling.temperature, 0.8);
  EXPECT_EQ(c->sampling.top_k, 40);
  EXPECT_EQ(c->sampling.top_p, 0.95);
  EXPECT_EQ(c->sampling.min_p, 0.05);
  EXPECT_EQ(c->sampling.repetition_penalty, 1.0);
  // No inline secret: `dserve launch` makes a per-launch one; a role started by hand without one refuses to start.
  EXPECT_STREQ(c->secret, "");
  EXPECT_EQ(c->secret_from, CTL_SECRET_NONE);
  EXPECT_STREQ(c->remote_field, "");
  EXPECT_EQ(cfg_require_secret(c, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("no shared secret"), std::string::npos) << err;
  cfg_free(c);
}

TEST(Config, ShippedGemma) { // Gemma 3's GGUF ships no chat template: the config names its family
  clear_secret_env();
  cfg_cluster *c = nullptr;
  char err[512] = "";
  std::string p = src("configs/gemma.json");
  ASSERT_EQ(cfg_load(p.c_str(), &c, err, sizeof err), 0) << err;
  EXPECT_STREQ(c->chat_template, "gemma");
  EXPECT_STREQ(c->model_name, "gemma-3-270m");
  EXPECT_EQ(std::string(c->model_path), src("configs/../models/weights/gemma-3-270m-q4_k_m.gguf"));
  ASSERT_EQ(c->n_workers, 1);
  EXPECT_EQ(c->workers[0].role, CFG_ROLE_BOTH);
  cfg_free(c);
}

TEST(Config, Shipped1P1D) {
  clear_secret_env();
  cfg_cluster *c = nullptr;
  char err[512] = "";
  ASSERT_EQ(cfg_load(src("configs/1p1d.json").c_str(), &c, err, sizeof err), 0) << err;
  ASSERT_EQ(c->n_workers, 2);
  const cfg_worker *p = cfg_find_worker(c, "p0"), *d = cfg_find_worker(c, "d0");
  ASSERT_TRUE(p && d);
  EXPECT_EQ(p->role, CFG_ROLE_PREFILL);
  EXPECT_EQ(d->role, CFG_ROLE_DECODE);
  EXPECT_STREQ(p->kvx_backend, "shm");
  EXPECT_STREQ(p->host, "127.0.0.1");
  EXPECT_STREQ(d->kvx_host, "127.0.0.1");
  EXPECT_EQ(cfg_find_worker(c, "nobody"), nullptr);
  EXPECT_EQ(c->secret_from, CTL_SECRET_NONE);
  EXPECT_TRUE(c->sampling.has_temperature && c->sampling.has_top_k);
  EXPECT_EQ(c->sampling.temperature, 0.8);
  EXPECT_EQ(c->sampling.top_k, 40);
  EXPECT_EQ(c->sampling.top_p, 0.95);
  EXPECT_EQ(c->sampling.min_p, 0.05);
  cfg_free(c);
}

TEST(Config, ShippedCluster) {
  clear_secret_env();
  cfg_cluster *c = nullptr;
  char err[1024] = "";
  // As shipped it needs its secret_file (configs/README.md says how to make one): without it, a clear refusal.
  ASSERT_EQ(cfg_load(src("configs/cluster.json").c_str(), &c, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("secret_file: cannot open"), std::string::npos) << err;
  // A copy next to a good secret file loads.
  Dir d;
  std::ifstream in(src("configs/cluster.json"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string cfg = d.write("cluster.json", text, 0644);
  d.write("cluster.secret", std::string(kHex) + "\n");
  ASSERT_EQ(cfg_load(cfg.c_str(), &c, err, sizeof err), 0) << err;
  EXPECT_EQ(c->secret_from, CTL_SECRET_CONFIG_FILE);
  EXPECT_STREQ(c->secret, kHex);
  EXPECT_EQ(std::string(c->secret_file), d.path + "/cluster.secret");
  EXPECT_STREQ(c->remote_field, "router.host \"10.77.0.1\"");
  ASSERT_EQ(c->n_nodes, 3);
  EXPECT_STREQ(c->nodes[0], "router");
  EXPECT_STREQ(c->nodes[1], "prefill");
  EXPECT_STREQ(c->nodes[2], "decode");
  EXPECT_TRUE(cfg_has_node(c, "decode"));
  EXPECT_FALSE(cfg_has_node(c, "local"));
  EXPECT_STREQ(c->router.host, "10.77.0.1");
  int np = 0, nd = 0;
  for (int i = 0; i < c->n_workers; i++) {
    const cfg_worker *w = &c->workers[i];
    EXPECT_STREQ(w->kvx_backend, "tcp");
    if (w->role == CFG_ROLE_PREFILL) {
      np++;
      EXPECT_STREQ(w->node, "prefill");
      EXPECT_STREQ(w->host, "10.77.0.2"); // from the node's host
      EXPECT_STREQ(w->kvx_host, "10.77.0.2");
    } else {
      nd++;
      EXPECT_EQ(w->role, CFG_ROLE_DECODE);
      EXPECT_STREQ(w->host, "10.77.0.3");
    }
  }
  EXPECT_EQ(np, 2);
  EXPECT_EQ(nd, 2);
  cfg_free(c);
}

// ---- the shared secret (ctl/secret.c) ----

TEST(ConfigSecret, Loopback) {
  for (const char *h : {"127.0.0.1", "127.1.2.3", "localhost", "::1"}) EXPECT_TRUE(ctl_host_is_loopback(h)) << h;
  for (const char *h : {"0.0.0.0", "::", "10.0.0.1", "127.0.0", "127.0.0.1x", "128.0.0.1", "example.com", ""})
    EXPECT_FALSE(ctl_host_is_loopback(h)) << h;
}

TEST(ConfigSecret, PlaceholdersAndWeakSecretsAreRefusedEverywhere) {
  char why[512];
  for (const char *s : {"change-me", "changeme", "CHANGE_ME", "secret", "Secret!", "password", "example", "s3cret",
                        "please-change-me-0123456789", "your-secret-here-xyz", "aaaaaaaaaaaaaaaaaaaaaaaa",
                        "abababababababababababab", "abcdefghijklmnopqrstuvwx", "0123456789012345678901234",
                        "short1", "has space in it 0123456789", ""})
    for (int remote : {0, 1}) EXPECT_EQ(ctl_secret_check(s, remote, why, sizeof why), -1) << s;
  // 16 random characters: enough on loopback, too weak when other hosts can connect
  EXPECT_EQ(ctl_secret_check("k2Pq9xZ7mW4nT1vB", 0, why, sizeof why), 0) << why;
  EXPECT_EQ(ctl_secret_check("k2Pq9xZ7mW4nT1vB", 1, why, sizeof why), -1);
  EXPECT_NE(std::string(why).find("too weak"), std::string::npos) << why;
  EXPECT_EQ(ctl_secret_check(std::string(kHex).substr(0, 62).c_str(), 1, why, sizeof why), -1); // 248 bits
  EXPECT_EQ(ctl_secret_check(kHex, 1, why, sizeof why), 0) << why;
  EXPECT_DOUBLE_EQ(ctl_secret_bits(kHex), 256);
}

TEST(ConfigSecret, GeneratedSecretsAreStrongAndDiffer) {
  char a[65], b[65], err[256], why[256];
  ASSERT_EQ(ctl_secret_generate(a, err, sizeof err), 0) << err;
  ASSERT_EQ(ctl_secret_generate(b, err, sizeof err), 0) << err;
  EXPECT_EQ(strlen(a), 64u);
  EXPECT_STRNE(a, b);
  EXPECT_EQ(ctl_secret_check(a, 1, why, sizeof why), 0) << why;
}

TEST(ConfigSecret, ResolutionOrder) {
  clear_secret_env();
  Dir d;
  std::string inline_s = "inline-0123456789-abcdefXYZ";
  std::string f1 = d.write("one.secret", std::string("file-one-0123456789-QRSTUV") + "\n");
  std::string f2 = d.write("two.secret", "file-two-0123456789-QRSTUV");
  // inline only
  std::string cfg = d.write("a.json", one_node("127.0.0.1", R"("secret": ")" + inline_s + R"(", )"), 0644);
  {
    Loaded l(cfg);
    ASSERT_EQ(l.rc, 0) << l.err;
    EXPECT_EQ(l.c->secret_from, CTL_SECRET_INLINE);
    EXPECT_EQ(std::string(l.c->secret), inline_s);
  }
  // the environment's value beats inline, the environment's file beats the value
  setenv("DSERVE_SECRET", "env-value-0123456789-KLMNOP", 1);
  {
    Loaded l(cfg);
    ASSERT_EQ(l.rc, 0) << l.err;
    EXPECT_EQ(l.c->secret_from, CTL_SECRET_ENV);
    EXPECT_STREQ(l.c->secret, "env-value-0123456789-KLMNOP");
  }
  setenv("DSERVE_SECRET_FILE", f2.c_str(), 1);
  {
    Loaded l(cfg);
    ASSERT_EQ(l.rc, 0) << l.err;
    EXPECT_EQ(l.c->secret_from, CTL_SECRET_ENV_FILE);
    EXPECT_STREQ(l.c->secret, "file-two-0123456789-QRSTUV");
  }
  // the config's secret_file (relative to the config's folder) beats the environment
  std::string cfg2 = d.write("b.json", one_node("127.0.0.1", R"("secret_file": "one.secret", )"), 0644);
  {
    Loaded l(cfg2);
    ASSERT_EQ(l.rc, 0) << l.err;
    EXPECT_EQ(l.c->secret_from, CTL_SECRET_CONFIG_FILE);
    EXPECT_STREQ(l.c->secret, "file-one-0123456789-QRSTUV"); // trailing newline dropped
    EXPECT_EQ(std::string(l.c->secret_file), f1);
  }
  clear_secret_env();
}

TEST(ConfigSecret, FileProblemsAreClear) {
  clear_secret_env();
  Dir d;
  d.write("open.secret", kHex, 0644);
  d.write("empty.secret", "\n");
  struct {
    std::string top, want;
  } cases[] = {
      {R"("secret_file": "missing.secret", )", "secret_file: cannot open"},
      {R"("secret_file": "open.secret", )", "chmod 600"},
      {R"("secret_file": "empty.secret", )", "is empty"},
      {R"("secret_file": "", )", "secret_file: must not be empty"},
      {R"("secret_file": "open.secret", "secret": "x", )", "not both"},
  };
  for (auto &c : cases) {
    Loaded l(d.write("c.json", one_node("127.0.0.1", c.top), 0644));
    EXPECT_EQ(l.rc, -1) << c.top;
    EXPECT_NE(std::string(l.err).find(c.want), std::string::npos) << c.top << ": " << l.err;
  }
  setenv("DSERVE_SECRET_FILE", (d.path + "/open.secret").c_str(), 1);
  Loaded l(d.write("c.json", one_node("127.0.0.1"), 0644));
  EXPECT_EQ(l.rc, -1);
  EXPECT_NE(std::string(l.err).find("DSERVE_SECRET_FILE"), std::string::npos) << l.err;
  clear_secret_env();
}

TEST(ConfigSecret, NonLoopbackNeedsAStrongSecretFromAFileOrTheEnvironment) {
  clear_secret_env();
  Dir d;
  std::string strong = d.write("strong.secret", kHex);
  d.write("weak.secret", "k2Pq9xZ7mW4nT1vB");
  struct {
    std::string json, want;
  } refused[] = {
      {one_node("10.0.0.5"), "workers[0].host \"10.0.0.5\" is not a loopback address"},
      {one_node("0.0.0.0", R"("secret": ")" + std::string(kHex) + R"(", )"), "inline secret is refused"},
      {one_node("127.0.0.1", R"("secret_file": "weak.secret", "router": {"host": "0.0.0.0"}, )"), "too weak"},
      {R"({"model": "m", "secret_file": "strong.secret", "nodes": {"a": {"host": "10.1.1.1"}}, "workers": [{"port": 1,
          "host": "127.0.0.1", "kvxfer": {"host": "192.168.1.9"}}]})",
       ""}, // (accepted: below)
      {R"({"model": "m", "secret": "change-me", "workers": [{"port": 1, "kvxfer": {"host": "192.168.1.9"}}]})",
       "inline secret is refused"},
      {R"({"model": "m", "secret": "change-me", "workers": [{"port": 1}]})", "placeholder"},
  };
  for (auto &c : refused) {
    Loaded l(d.write("c.json", c.json, 0644));
    if (c.want.empty()) {
      EXPECT_EQ(l.rc, 0) << l.err;
      continue;
    }
    EXPECT_EQ(l.rc, -1) << c.json;
    EXPECT_NE(std::string(l.err).find(c.want), std::string::npos) << c.json << ": " << l.err;
  }
  // a kvxfer host alone makes the cluster non-loopback
  {
    Loaded l(d.write("c.json", R"({"model": "m", "workers": [{"port": 1, "kvxfer": {"host": "192.168.1.9"}}]})", 0644));
    EXPECT_EQ(l.rc, -1);
    EXPECT_NE(std::string(l.err).find("workers[0].kvxfer.host"), std::string::npos) << l.err;
  }
  // the environment (value or file) is accepted, when strong
  setenv("DSERVE_SECRET", kHex, 1);
  {
    Loaded l(d.write("c.json", one_node("10.0.0.5"), 0644));
    EXPECT_EQ(l.rc, 0) << l.err;
    EXPECT_EQ(l.c->secret_from, CTL_SECRET_ENV);
  }
  setenv("DSERVE_SECRET", "k2Pq9xZ7mW4nT1vB", 1);
  {
    Loaded l(d.write("c.json", one_node("10.0.0.5"), 0644));
    EXPECT_EQ(l.rc, -1);
    EXPECT_NE(std::string(l.err).find("DSERVE_SECRET: refused: too weak"), std::string::npos) << l.err;
  }
  setenv("DSERVE_SECRET_FILE", strong.c_str(), 1);
  {
    Loaded l(d.write("c.json", one_node("10.0.0.5"), 0644));
    EXPECT_EQ(l.rc, 0) << l.err;
    EXPECT_EQ(l.c->secret_from, CTL_SECRET_ENV_FILE);
  }
  clear_secret_env();
}

TEST(Config, Defaults) {
  Cfg x(kMin, "dir/sub/t.json");
  ASSERT_EQ(x.rc, 0) << x.err;
  const cfg_cluster *c = x.c;
  EXPECT_STREQ(c->model_path, "dir/sub/m.gguf");
  EXPECT_STREQ(c->model_name, "");
  EXPECT_STREQ(c->chat_template, ""); // recognise the GGUF's (router/http.c)
  EXPECT_STREQ(c->secret, "");
  EXPECT_FALSE(c->has_router);
  EXPECT_EQ(c->router.port, 8000);
  EXPECT_STREQ(c->router.host, "127.0.0.1");
  EXPECT_STREQ(c->router.node, "local");
  EXPECT_EQ(c->router.n_api_keys, 0);
  EXPECT_EQ(c->router.max_body_bytes, (size_t)1 << 20);
  EXPECT_EQ(c->router.conn_timeout_s, 60);
  EXPECT_EQ(c->router.queue_limit, 256);
  EXPECT_EQ(c->router.max_tokens_limit, 0);
  EXPECT_EQ(c->router.max_n, 8);
  EXPECT_EQ(c->router.max_stop, 8);
  EXPECT_EQ(c->router.request_timeout_ms, 600000);
  EXPECT_EQ(c->router.body_timeout_s, 30);
  EXPECT_EQ(c->router.max_choices, 64);
  EXPECT_EQ(c->router.max_request_tokens, 0);
  // no "sampling" section: nothing given (the router falls back to the GGUF, then to llama-server's defaults)
  EXPECT_FALSE(c->sampling.has_temperature || c->sampling.has_top_k || c->sampling.has_top_p ||
               c->sampling.has_min_p || c->sampling.has_repetition_penalty);
  EXPECT_EQ(c->router.disagg_threshold, 128);
  EXPECT_EQ(c->router.disagg_policy, CFG_DISAGG_AUTO);
  EXPECT_EQ(c->router.disagg_max_prefill_queue, 2);
  EXPECT_EQ(c->router.link_dead_ms, 15000);
  EXPECT_EQ(c->router.migration_limit, 2);
  EXPECT_EQ(c->router.migration_wait_ms, 10000);
  EXPECT_EQ(c->router.migrate_silent_ms, 2000);
  EXPECT_EQ(c->router.stream_flush_ms, 0);
  EXPECT_EQ(c->router.prefix_fetch, 0);
  EXPECT_EQ(c->router.prefix_fetch_min_blocks, 4);
  EXPECT_EQ(c->router.drain_timeout_s, 30);
  EXPECT_DOUBLE_EQ(c->router.w_overlap, 1.0);
  EXPECT_DOUBLE_EQ(c->router.w_queue, 0.5);
  EXPECT_DOUBLE_EQ(c->router.w_free, 0.2);
  ASSERT_EQ(c->n_workers, 1);
  const cfg_worker &w = c->workers[0];
  EXPECT_STREQ(w.name, "w0");
  EXPECT_STREQ(w.node, "local");
  EXPECT_EQ(w.role, CFG_ROLE_BOTH);
  EXPECT_STREQ(w.host, "127.0.0.1");
  EXPECT_EQ(w.port, 9100);
  EXPECT_EQ(w.threads, (int)sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_STREQ(w.kernels, "auto");
  EXPECT_STREQ(w.device, "cpu");
  EXPECT_DOUBLE_EQ(w.kv_budget_mb, 256);
  EXPECT_EQ(w.block_size, 16);
  EXPECT_STREQ(w.kv_type, "f16");
  EXPECT_EQ(w.max_seqs, 64);
  EXPECT_EQ(w.max_batch_tokens, 256);
  EXPECT_STREQ(w.kvx_backend, "auto");
  EXPECT_STREQ(w.kvx_host, "127.0.0.1");
  EXPECT_EQ(w.kvx_port, 0);
  ASSERT_EQ(c->n_nodes, 1);
  EXPECT_STREQ(c->nodes[0], "local");
}

// router.max_choices defaults to 64, or to max_n when that is larger (a single prompt's n is never refused by it);
// one given stands as given.
TEST(Config, MaxChoicesAtLeastMaxN) {
  Cfg a(R"({"model": "m.gguf", "router": {"max_n": 100}, "workers": [{"port": 1}]})");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.c->router.max_choices, 100);
  Cfg b(R"({"model": "m.gguf", "router": {"max_choices": 16, "max_request_tokens": 5000, "body_timeout_s": 5},
           "workers": [{"port": 1}]})");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(b.c->router.max_choices, 16);
  EXPECT_EQ(b.c->router.max_request_tokens, 5000);
  EXPECT_EQ(b.c->router.body_timeout_s, 5);
  Cfg c(R"({"model": "m.gguf", "router": {"body_timeout_s": 0}, "workers": [{"port": 1}]})");
  EXPECT_NE(c.rc, 0);
  EXPECT_NE(std::string(c.err).find("router.body_timeout_s"), std::string::npos) << c.err;
  Cfg d(R"({"model": "m.gguf", "router": {"max_choices": 0}, "workers": [{"port": 1}]})");
  EXPECT_NE(d.rc, 0);
  EXPECT_NE(std::string(d.err).find("router.max_choices"), std::string::npos) << d.err;
  Cfg f(R"({"model": "m.gguf", "router": {"stream_flush_ms": 40}, "workers": [{"port": 1}]})");
  ASSERT_EQ(f.rc, 0) << f.err;
  EXPECT_EQ(f.c->router.stream_flush_ms, 40);
  Cfg g(R"({"model": "m.gguf", "router": {"stream_flush_ms": 1001}, "workers": [{"port": 1}]})");
  EXPECT_NE(g.rc, 0);
  EXPECT_NE(std::string(g.err).find("router.stream_flush_ms"), std::string::npos) << g.err;
}

TEST(Config, ModelPaths) {
  {
    Cfg x(R"({"model": "/abs/m.gguf", "workers": [{"port": 1}]})", "some/dir/c.json");
    ASSERT_EQ(x.rc, 0) << x.err;
    EXPECT_STREQ(x.c->model_path, "/abs/m.gguf");
    EXPECT_STREQ(x.c->workers[0].name, "w0"); // default name
  }
  {
    Cfg x(R"({"model": "../w/m.gguf", "workers": [{"port": 1}]})", "/etc/dserve/c.json");
    ASSERT_EQ(x.rc, 0) << x.err;
    EXPECT_STREQ(x.c->model_path, "/etc/dserve/../w/m.gguf");
  }
  {
    Cfg x(R"({"model": "m.gguf", "workers": [{"port": 1}]})", "c.json"); // file in the working folder
    ASSERT_EQ(x.rc, 0) << x.err;
    EXPECT_STREQ(x.c->model_path, "m.gguf");
  }
}

// chat_template_file (--chat-template-file): resolved as the model is, next to chat_template; "" and non-strings refused.
TEST(Config, ChatTemplateFile) {
  Cfg x(R"({"model": "m.gguf", "chat_template_file": "t/qwen3.jinja", "workers": [{"port": 1}]})", "/etc/d/c.json");
  ASSERT_EQ(x.rc, 0) << x.err;
  EXPECT_STREQ(x.c->chat_template_file, "/etc/d/t/qwen3.jinja");
  EXPECT_STREQ(x.c->chat_template, "");
  Cfg none(kMin);
  ASSERT_EQ(none.rc, 0) << none.err;
  EXPECT_STREQ(none.c->chat_template_file, "");
  for (const char *bad : {R"("chat_template_file": "")", R"("chat_template_file": 3)"}) {
    Cfg b(std::string(R"({"model": "m.gguf", )") + bad + R"(, "workers": [{"port": 1}]})");
    EXPECT_NE(b.rc, 0) << bad;
    EXPECT_NE(std::string(b.err).find("chat_template_file"), std::string::npos) << b.err;
  }
}

TEST(Config, NodeDefaults) {
  Cfg x(R"({"model": "m", "nodes": {"n1": {"host": "10.1.2.3"}}, "router": {},
           "workers": [{"port": 5, "kvxfer": {"port": 6}}, {"port": 7, "host": "0.0.0.0"}]})");
  ASSERT_EQ(x.rc, 0) << x.err;
  EXPECT_STREQ(x.c->router.node, "n1"); // the only node
  EXPECT_STREQ(x.c->router.host, "10.1.2.3");
  EXPECT_STREQ(x.c->workers[0].node, "n1");
  EXPECT_STREQ(x.c->workers[0].host, "10.1.2.3");
  EXPECT_STREQ(x.c->workers[1].host, "0.0.0.0");
  EXPECT_STREQ(x.c->workers[1].kvx_host, "0.0.0.0"); // follows the worker's host
  // the same port on two different nodes is fine
  Cfg y(R"({"model": "m", "nodes": {"a": {}, "b": {}}, "router": {"node": "a"},
           "workers": [{"node": "a", "port": 9}, {"node": "b", "port": 9}]})");
  ASSERT_EQ(y.rc, 0) << y.err;
  EXPECT_EQ(y.c->n_nodes, 2);
}

TEST(Config, ValuesKept) {
  Cfg x(R"({"model": "m", "model_name": "x", "chat_template": "gemma", "secret": "s",
    "router": {"api_keys": ["k1", "k2"], "port": 0, "max_tokens_limit": 100, "routing": {"free": 3},
               "prefix_fetch": true, "prefix_fetch_min_blocks": 2},
    "workers": [{"name": "a", "role": "prefill", "port": 0, "device": "cuda", "kv_budget_mb": 0.5, "cuda_graphs": "on",
                 "kv_type": "q8_0",
                 "kvxfer": {"backend": "rdma", "host": "10.0.0.9", "port": 7000, "staging": "off", "encrypt": false}},
                {"name": "b", "role": "decode", "port": 0, "device": "cuda:3", "kernels": "avx512", "kv_type": "f32",
                 "tpot_target_ms": 95.5, "spec": "off"}]})");
  ASSERT_EQ(x.rc, 0) << x.err;
  const cfg_cluster *c = x.c;
  EXPECT_TRUE(c->has_router);
  ASSERT_EQ(c->router.n_api_keys, 2);
  EXPECT_STREQ(c->router.api_keys[1], "k2");
  EXPECT_EQ(c->router.max_tokens_limit, 100);
  EXPECT_STREQ(c->chat_template, "gemma"); // a family name: the router checks it (models/chat.h)
  EXPECT_DOUBLE_EQ(c->router.w_free, 3);
  EXPECT_DOUBLE_EQ(c->router.w_queue, 0.5);
  EXPECT_EQ(c->router.prefix_fetch, 1);
  EXPECT_EQ(c->router.prefix_fetch_min_blocks, 2);
  EXPECT_STREQ(c->workers[0].device, "cuda:0");
  EXPECT_DOUBLE_EQ(c->workers[0].kv_budget_mb, 0.5);
  EXPECT_STREQ(c->workers[0].kvx_host, "10.0.0.9");
  EXPECT_EQ(c->workers[0].kvx_port, 7000);
  EXPECT_STREQ(c->workers[1].device, "cuda:3");
  EXPECT_STREQ(c->workers[1].kernels, "avx512");
  EXPECT_STREQ(c->workers[0].kv_type, "q8_0");
  EXPECT_STREQ(c->workers[1].kv_type, "f32");
  EXPECT_STREQ(cfg_role_name(c->workers[1].role), "decode");
  EXPECT_STREQ(c->workers[0].kvx_staging, "off");
  EXPECT_STREQ(c->workers[1].kvx_staging, "auto"); // the default
  EXPECT_EQ(c->workers[0].kvx_plaintext, 1);       // kvxfer.encrypt false
  EXPECT_EQ(c->workers[1].kvx_plaintext, 0);       // the default: sealed
  EXPECT_STREQ(c->workers[0].cuda_graphs, "on");
  EXPECT_STREQ(c->workers[1].cuda_graphs, "off"); // the default
  EXPECT_DOUBLE_EQ(c->workers[1].tpot_target_ms, 95.5);
  EXPECT_DOUBLE_EQ(c->workers[0].tpot_target_ms, 0); // the default: off
  EXPECT_STREQ(c->workers[1].spec, "off");
  EXPECT_STREQ(c->workers[0].spec, CFG_DEF_SPEC); // the default: auto
  EXPECT_STREQ(CFG_DEF_SPEC, "auto");
}

// A section made in code gets what cfg_parse gives an absent key for every field that may not be 0; what is set stays,
// and fields where 0 means something (drain_timeout_s, migration_limit, max_tokens_limit) stay 0.
TEST(Config, DefaultsFillAZeroedSection) {
  cfg_router r{};
  r.max_n = 3;
  cfg_router_defaults(&r);
  EXPECT_EQ(r.max_n, 3);
  EXPECT_EQ(r.max_stop, CFG_DEF_MAX_STOP);
  EXPECT_EQ(r.request_timeout_ms, CFG_DEF_REQUEST_TIMEOUT_MS);
  EXPECT_EQ(r.conn_timeout_s, CFG_DEF_CONN_TIMEOUT_S);
  EXPECT_EQ(r.link_dead_ms, CFG_DEF_LINK_DEAD_MS);
  EXPECT_EQ(r.max_connections, CFG_DEF_MAX_CONNECTIONS);
  EXPECT_EQ(r.max_connections_per_client, CFG_DEF_MAX_CONNECTIONS_PER_CLIENT);
  EXPECT_EQ(r.header_timeout_s, CFG_DEF_HEADER_TIMEOUT_S);
  EXPECT_EQ(r.body_timeout_s, CFG_DEF_BODY_TIMEOUT_S);
  EXPECT_EQ(r.max_choices, CFG_DEF_MAX_CHOICES);
  EXPECT_EQ(r.max_request_tokens, 0);
  EXPECT_EQ(r.drain_timeout_s, 0);
  EXPECT_EQ(r.migration_limit, 0);
  EXPECT_EQ(r.max_tokens_limit, 0);
  cfg_worker w{};
  w.max_seqs = 5;
  cfg_worker_defaults(&w);
  EXPECT_EQ(w.max_seqs, 5);
  EXPECT_EQ(w.block_size, CFG_DEF_BLOCK_SIZE);
  EXPECT_EQ(w.max_batch_tokens, CFG_DEF_MAX_BATCH_TOKENS);
}

TEST(Config, DeviceOverride) { // the command line's --device
  Cfg x(kMin);
  ASSERT_EQ(x.rc, 0) << x.err;
  char err[256];
  EXPECT_STREQ(cfg_find_worker(x.c, "w0")->device, "cpu");
  ASSERT_EQ(cfg_set_device(x.c, "w0", "cuda:2", err, sizeof err), 0) << err;
  EXPECT_STREQ(cfg_find_worker(x.c, "w0")->device, "cuda:2");
  ASSERT_EQ(cfg_set_device(x.c, "w0", "cuda", err, sizeof err), 0) << err;
  EXPECT_STREQ(cfg_find_worker(x.c, "w0")->device, "cuda:0");
  EXPECT_EQ(cfg_set_device(x.c, "w0", "gpu0", err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("gpu0"), std::string::npos) << err;
  EXPECT_STREQ(cfg_find_worker(x.c, "w0")->device, "cuda:0"); // unchanged by the refused value
  EXPECT_EQ(cfg_set_device(x.c, "nobody", "cpu", err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("nobody"), std::string::npos) << err;
}

struct BadCase {
  const char *json;
  const char *needle; // must appear in the message, after the file name
};

// Each case fails, and the message names the field.
const BadCase kBad[] = {
    {R"([1, 2])", "t.json: expected a JSON object"},
    {R"({"model": "m", "workers": [{"port": 1}]} x)", "t.json: "},
    {R"({"model": "m", "workers": [{"port": 1}], )", "not valid JSON"},
    {R"({"workers": [{"port": 1}]})", "t.json: model: missing"},
    {R"({"model": 3, "workers": [{"port": 1}]})", "t.json: model: expected a string"},
    {R"({"model": "m", "chat_template": 1, "workers": [{"port": 1}]})", "t.json: chat_template: expected a string"},
    {R"({"model": "", "workers": [{"port": 1}]})", "t.json: model: must not be empty"},
    {R"({"model": "m", "wrokers": []})", "t.json: wrokers: unknown key"},
    {R"({"model": "m", "model": "n", "workers": [{"port": 1}]})", "t.json: model: duplicate key (line 1, column 16)"},
    {R"({"model": "m"})", "t.json: workers: missing"},
    {R"({"model": "m", "workers": []})", "t.json: workers: expected at least one worker"},
    {R"({"model": "m", "workers": {}})", "t.json: workers: expected an array"},
    {R"({"model": "m", "workers": [7]})", "t.json: workers[0]: expected an object"},
    {R"({"model": "m", "workers": [{"port": 1}, {"port": 70000}]})", "t.json: workers[1].port: expected an integer 0..65535"},
    {R"({"model": "m", "workers": [{"port": 1}, {"port": "2"}]})", "t.json: workers[1].port: expected an integer 0..65535"},
    {R"({"model": "m", "workers": [{"port": 1.5}]})", "t.json: workers[0].port: expected an integer"},
    {R"({"model": "m", "workers": [{"port": -1}]})", "t.json: workers[0].port: expected an integer"},
    {R"({"model": "m", "workers": [{"name": "w"}]})", "t.json: workers[0].port: missing"},
    {R"({"model": "m", "workers": [{"port": 1, "prot": 2}]})", "t.json: workers[0].prot: unknown key"},
    {R"({"model": "m", "workers": [{"name": "a", "port": 1}, {"name": "a", "port": 2}]})", "t.json: workers[1].name: \"a\" is already the name of workers[0]"},
    {R"({"model": "m", "workers": [{"name": "a b", "port": 1}]})", "t.json: workers[0].name: \"a b\" is not a valid name"},
    {R"({"model": "m", "workers": [{"role": "mixed", "port": 1}]})", "t.json: workers[0].role: \"mixed\" is not one of: both, prefill, decode"},
    {R"({"model": "m", "workers": [{"role": "prefill", "port": 1}, {"role": "both", "port": 2}]})", "t.json: workers[0].role: a prefill worker needs a decode worker"},
    {R"({"model": "m", "workers": [{"port": 1, "kv_budget_mb": 0}]})", "t.json: workers[0].kv_budget_mb: expected a number > 0"},
    {R"({"model": "m", "workers": [{"port": 1, "kv_budget_mb": -5}]})", "t.json: workers[0].kv_budget_mb: expected a number > 0"},
    {R"({"model": "m", "workers": [{"port": 1, "threads": 0}]})", "t.json: workers[0].threads: expected an integer 1..1024"},
    {R"({"model": "m", "workers": [{"port": 1, "threads": 1025}]})", // the thread pool's limit, not more
     "t.json: workers[0].threads: expected an integer 1..1024"},
    {R"({"model": "m", "workers": [{"port": 1, "kernels": "neon"}]})", "t.json: workers[0].kernels: \"neon\" is not one of"},
    {R"({"model": "m", "router": {"disagg_policy": "always"}, "workers": [{"port": 1}]})",
     "t.json: router.disagg_policy: \"always\" is not one of: auto, threshold"},
    {R"({"model": "m", "router": {"disagg_max_prefill_queue": -1}, "workers": [{"port": 1}]})",
     "t.json: router.disagg_max_prefill_queue"},
    {R"({"model": "m", "workers": [{"port": 1, "device": "gpu"}]})", "t.json: workers[0].device: \"gpu\" is not one of"},
    {R"({"model": "m", "workers": [{"port": 1, "device": "cuda:x"}]})", "t.json: workers[0].device:"},
    {R"({"model": "m", "workers": [{"port": 1, "kv_type": "q8"}]})", "t.json: workers[0].kv_type: \"q8\" is not one of: f16, f32, q8_0"},
    {R"({"model": "m", "workers": [{"port": 1, "block_size": 0}]})", "t.json: workers[0].block_size: expected an integer 1..1024"},
    {R"({"model": "m", "workers": [{"port": 1, "max_seqs": 0}]})", "t.json: workers[0].max_seqs:"},
    {R"({"model": "m", "workers": [{"port": 1, "max_batch_tokens": true}]})", "t.json: workers[0].max_batch_tokens:"},
    {R"({"model": "m", "workers": [{"port": 1, "tpot_target_ms": -1}]})", "t.json: workers[0].tpot_target_ms:"},
    {R"({"model": "m", "workers": [{"port": 1, "tpot_target_ms": "100"}]})", "t.json: workers[0].tpot_target_ms:"},
    {R"({"model": "m", "workers": [{"port": 1, "kvxfer": {"backend": "udp"}}]})", "t.json: workers[0].kvxfer.backend: \"udp\" is not one of: auto, tcp, shm, rdma, nccl, nixl"},
    {R"({"model": "m", "workers": [{"port": 1, "kvxfer": {"bakend": "tcp"}}]})", "t.json: workers[0].kvxfer.bakend: unknown key"},
    {R"({"model": "m", "workers": [{"port": 1, "kvxfer": "tcp"}]})", "t.json: workers[0].kvxfer: expected an object"},
    {R"({"model": "m", "workers": [{"port": 1, "cuda_graphs": true}]})", "t.json: workers[0].cuda_graphs: expected a string"},
    {R"({"model": "m", "workers": [{"port": 1, "cuda_graphs": "yes"}]})", "t.json: workers[0].cuda_graphs: \"yes\" is not one of: off, on"},
    {R"({"model": "m", "workers": [{"port": 1, "spec": "on"}]})", "t.json: workers[0].spec: \"on\" is not one of: auto, off"},
    {R"({"model": "m", "workers": [{"port": 1, "spec": false}]})", "t.json: workers[0].spec: expected a string"},
    {R"({"model": "m", "workers": [{"port": 1, "kvxfer": {"staging": "yes"}}]})", "t.json: workers[0].kvxfer.staging: \"yes\" is not one of: auto, on, off"},
    {R"({"model": "m", "workers": [{"port": 1, "kvxfer": {"encrypt": "no"}}]})", "t.json: workers[0].kvxfer.encrypt: expected true or false, got a string"},
    {R"({"model": "m", "workers": [{"port": 1, "kvxfer": {"port": 65536}}]})", "t.json: workers[0].kvxfer.port: expected an integer 0..65535"},
    {R"({"model": "m", "workers": [{"port": 1, "host": ""}]})", "t.json: workers[0].host: must not be empty"},
    {R"({"model": "m", "workers": [{"port": 9000}, {"port": 9000}]})", "t.json: workers[1].port: 9000 on 127.0.0.1 is already used by workers[0].port"},
    {R"({"model": "m", "router": {"port": 9000}, "workers": [{"port": 1, "kvxfer": {"port": 9000}}]})", "t.json: workers[0].kvxfer.port: 9000 on 127.0.0.1 is already used by router.port"},
    {R"({"model": "m", "router": {"port": 80000}, "workers": [{"port": 1}]})", "t.json: router.port: expected an integer 0..65535"},
    {R"({"model": "m", "router": {"colour": 1}, "workers": [{"port": 1}]})", "t.json: router.colour: unknown key"},
    {R"({"model": "m", "router": [], "workers": [{"port": 1}]})", "t.json: router: expected an object"},
    {R"({"model": "m", "router": {"api_keys": "k"}, "workers": [{"port": 1}]})", "t.json: router.api_keys: expected an array"},
    {R"({"model": "m", "router": {"api_keys": ["a", 2]}, "workers": [{"port": 1}]})", "t.json: router.api_keys[1]: expected a string"},
    {R"({"model": "m", "router": {"api_keys": [""]}, "workers": [{"port": 1}]})", "t.json: router.api_keys[0]: must not be empty"},
    {R"({"model": "m", "router": {"max_n": 0}, "workers": [{"port": 1}]})", "t.json: router.max_n: expected an integer 1..1024"},
    {R"({"model": "m", "router": {"drain_timeout_s": 3601}, "workers": [{"port": 1}]})", "t.json: router.drain_timeout_s: expected an integer 0..3600"},
    {R"({"model": "m", "router": {"queue_limit": 0}, "workers": [{"port": 1}]})", "t.json: router.queue_limit:"},
    {R"({"model": "m", "router": {"link_dead_ms": 1000}, "workers": [{"port": 1}]})", "t.json: router.link_dead_ms: expected an integer 2000..3600000"},
    {R"({"model": "m", "router": {"routing": {"overlap": -1}}, "workers": [{"port": 1}]})", "t.json: router.routing.overlap: expected a number >= 0"},
    {R"({"model": "m", "router": {"routing": {"prefix": 1}}, "workers": [{"port": 1}]})", "t.json: router.routing.prefix: unknown key"},
    {R"({"model": "m", "router": {"prefix_fetch": 1}, "workers": [{"port": 1}]})", "t.json: router.prefix_fetch: expected true or false, got a number"},
    {R"({"model": "m", "router": {"prefix_fetch_min_blocks": 0}, "workers": [{"port": 1}]})", "t.json: router.prefix_fetch_min_blocks: expected an integer 1..1048576"},
    {R"({"model": "m", "nodes": {"a": {}}, "router": {"node": "b"}, "workers": [{"node": "a", "port": 1}]})", "t.json: router.node: \"b\" is not a node named in \"nodes\""},
    {R"({"model": "m", "nodes": {"a": {}}, "workers": [{"node": "c", "port": 1}]})", "t.json: workers[0].node: \"c\" is not a node named in \"nodes\""},
    {R"({"model": "m", "nodes": {"a": {"addr": "x"}}, "workers": [{"node": "a", "port": 1}]})", "t.json: nodes.a.addr: unknown key"},
    {R"({"model": "m", "nodes": {"a": 1}, "workers": [{"node": "a", "port": 1}]})", "t.json: nodes.a: expected an object"},
    {R"({"model": "m", "nodes": {}, "workers": [{"port": 1}]})", "t.json: nodes: expected at least one node"},
    {R"({"model": "m", "nodes": {"a": {}, "a": {}}, "workers": [{"node": "a", "port": 1}]})", "t.json: nodes.a: duplicate key (line 1, column 35)"},
    {R"({"model": "m", "nodes": {"a": {}, "b": {}}, "workers": [{"port": 1}]})", "t.json: workers[0].node: missing"},
    {R"({"model": "m", "nodes": {"a": {}, "b": {}}, "router": {}, "workers": [{"node": "a", "port": 1}]})", "t.json: router.node: missing"},
    {R"({"model": "m", "secret": null, "workers": [{"port": 1}]})", "t.json: secret: expected a string, got null"},
    {R"({"model": "m", "sampling": [], "workers": [{"port": 1}]})", "t.json: sampling: expected an object"},
    {R"({"model": "m", "sampling": {"temp": 1}, "workers": [{"port": 1}]})", "t.json: sampling.temp: unknown key (allowed: temperature, top_k, top_p, min_p, repetition_penalty)"},
    {R"({"model": "m", "sampling": {"top_k": 1, "top_k": 2}, "workers": [{"port": 1}]})", "t.json: sampling.top_k: duplicate key"},
    {R"({"model": "m", "sampling": {"temperature": 2.5}, "workers": [{"port": 1}]})", "t.json: sampling.temperature: expected a number >= 0 and <= 2"},
    {R"({"model": "m", "sampling": {"temperature": -0.1}, "workers": [{"port": 1}]})", "t.json: sampling.temperature: expected a number >= 0"},
    {R"({"model": "m", "sampling": {"temperature": "0.8"}, "workers": [{"port": 1}]})", "t.json: sampling.temperature: expected a number"},
    {R"({"model": "m", "sampling": {"top_k": 4.5}, "workers": [{"port": 1}]})", "t.json: sampling.top_k: expected an integer -1..1000000"},
    {R"({"model": "m", "sampling": {"top_k": -2}, "workers": [{"port": 1}]})", "t.json: sampling.top_k: expected an integer -1..1000000"},
    {R"({"model": "m", "sampling": {"top_p": 0}, "workers": [{"port": 1}]})", "t.json: sampling.top_p: expected a number > 0 and <= 1"},
    {R"({"model": "m", "sampling": {"top_p": 1.01}, "workers": [{"port": 1}]})", "t.json: sampling.top_p: expected a number > 0 and <= 1"},
    {R"({"model": "m", "sampling": {"min_p": 1.5}, "workers": [{"port": 1}]})", "t.json: sampling.min_p: expected a number >= 0 and <= 1"},
    {R"({"model": "m", "sampling": {"min_p": null}, "workers": [{"port": 1}]})", "t.json: sampling.min_p: expected a number"},
    {R"({"model": "m", "sampling": {"repetition_penalty": 0}, "workers": [{"port": 1}]})", "t.json: sampling.repetition_penalty: expected a number > 0 and <= 2"},
    {R"({"model": "m", "workers": [{"port": 1, "name": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]})", "t.json: workers[0].name: too long"},
};

TEST(Config, SamplingSection) {
  Cfg all(R"({"model": "m", "sampling": {"temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0,
    "repetition_penalty": 2}, "workers": [{"port": 1}]})");
  ASSERT_EQ(all.rc, 0) << all.err;
  const cfg_sampling *s = &all.c->sampling;
  EXPECT_TRUE(s->has_temperature && s->has_top_k && s->has_top_p && s->has_min_p && s->has_repetition_penalty);
  EXPECT_EQ(s->temperature, 0.0); // greedy by default is allowed
  EXPECT_EQ(s->top_k, 0);
  EXPECT_EQ(s->top_p, 1.0);
  EXPECT_EQ(s->min_p, 0.0);
  EXPECT_EQ(s->repetition_penalty, 2.0);
  // only the keys given are set; the others stay unset for the GGUF's values or the shipped ones
  Cfg some(R"({"model": "m", "sampling": {"top_k": -1, "min_p": 0.1}, "workers": [{"port": 1}]})");
  ASSERT_EQ(some.rc, 0) << some.err;
  s = &some.c->sampling;
  EXPECT_FALSE(s->has_temperature || s->has_top_p || s->has_repetition_penalty);
  EXPECT_TRUE(s->has_top_k && s->has_min_p);
  EXPECT_EQ(s->top_k, -1);
  EXPECT_EQ(s->min_p, 0.1);
  Cfg empty(R"({"model": "m", "sampling": {}, "workers": [{"port": 1}]})");
  ASSERT_EQ(empty.rc, 0) << empty.err;
  EXPECT_FALSE(empty.c->sampling.has_temperature || empty.c->sampling.has_top_k);
}

// "logging", "tracing" and router.metrics_public (docs/observability.md): defaults when absent, values kept, errors
// that name the field.
TEST(Config, ObservabilitySections) {
  Cfg none(kMin);
  ASSERT_EQ(none.rc, 0) << none.err;
  EXPECT_STREQ(none.c->logging.format, "text");
  EXPECT_EQ(none.c->logging.stats_interval_s, CFG_DEF_STATS_INTERVAL_S);
  EXPECT_STREQ(none.c->tracing.endpoint, ""); // tracing off
  EXPECT_EQ(none.c->router.metrics_public, 0); // secure by default
  Cfg all(R"({"model": "m", "router": {"metrics_public": true}, "logging": {"format": "json", "stats_interval_s": 0},
    "tracing": {"endpoint": "http://otel:4318/v1/traces", "service_name": "llm", "sample_ratio": 0.25,
    "queue_spans": 100, "flush_ms": 50}, "workers": [{"port": 1}]})");
  ASSERT_EQ(all.rc, 0) << all.err;
  EXPECT_EQ(all.c->router.metrics_public, 1);
  EXPECT_STREQ(all.c->logging.format, "json");
  EXPECT_EQ(all.c->logging.stats_interval_s, 0);
  EXPECT_STREQ(all.c->tracing.endpoint, "http://otel:4318/v1/traces");
  EXPECT_STREQ(all.c->tracing.service_name, "llm");
  EXPECT_EQ(all.c->tracing.sample_ratio, 0.25);
  EXPECT_EQ(all.c->tracing.queue_spans, 100);
  EXPECT_EQ(all.c->tracing.flush_ms, 50);
  Cfg dflt(R"({"model": "m", "tracing": {"endpoint": "http://127.0.0.1:4318/v1/traces"}, "workers": [{"port": 1}]})");
  ASSERT_EQ(dflt.rc, 0) << dflt.err;
  EXPECT_STREQ(dflt.c->tracing.service_name, "dserve");
  EXPECT_EQ(dflt.c->tracing.sample_ratio, 1.0);
  EXPECT_EQ(dflt.c->tracing.queue_spans, CFG_DEF_TRACE_QUEUE_SPANS);
  EXPECT_EQ(dflt.c->tracing.flush_ms, CFG_DEF_TRACE_FLUSH_MS);
  const char *bad[][2] = {
      {R"("logging": {"format": "xml"})", "logging.format: \"xml\" is not one of: text, json"},
      {R"("logging": {"stats_interval_s": -1})", "logging.stats_interval_s"},
      {R"("logging": {"level": "debug"})", "logging.level"},
      {R"("tracing": {})", "tracing.endpoint: missing"},
      {R"("tracing": {"endpoint": "https://otel/v1/traces"})", "tracing.endpoint: expected http://"},
      {R"("tracing": {"endpoint": "http://otel:70000/x"})", "tracing.endpoint: the port"},
      {R"("tracing": {"endpoint": "http://o/x", "sample_ratio": 2})", "tracing.sample_ratio"},
      {R"("tracing": {"endpoint": "http://o/x", "service_name": ""})", "tracing.service_name"},
      {R"("tracing": {"endpoint": "http://o/x", "queue_spans": 1})", "tracing.queue_spans"},
      {R"("router": {"metrics_public": "yes"})", "router.metrics_public: expected true or false"}};
  for (auto &b : bad) {
    Cfg x(std::string(R"({"model": "m", )") + b[0] + R"(, "workers": [{"port": 1}]})");
    EXPECT_NE(x.rc, 0) << b[0];
    EXPECT_NE(std::string(x.err).find(b[1]), std::string::npos) << b[0] << "\ngot: " << x.err;
  }
}

// issue 45: max_model_len (dserve serve -c) and router.strict_model_name: defaults, values kept, strict errors
TEST(Config, ContextBoundAndModelNames) {
  Cfg none(kMin);
  ASSERT_EQ(none.rc, 0) << none.err;
  EXPECT_EQ(none.c->max_model_len, 0);             // the GGUF's context
  EXPECT_EQ(none.c->router.strict_model_name, 0);  // any name is the one model
  Cfg set(R"({"model": "m", "max_model_len": 4096, "router": {"strict_model_name": true}, "workers": [{"port": 1}]})");
  ASSERT_EQ(set.rc, 0) << set.err;
  EXPECT_EQ(set.c->max_model_len, 4096);
  EXPECT_EQ(set.c->router.strict_model_name, 1);
  const char *bad[][2] = {{R"("max_model_len": -1)", "max_model_len"},
                          {R"("max_model_len": 1.5)", "max_model_len"},
                          {R"("max_model_len": "4k")", "max_model_len"},
                          {R"("router": {"strict_model_name": 1})", "router.strict_model_name: expected true or false"}};
  for (auto &b : bad) {
    Cfg x(std::string(R"({"model": "m", )") + b[0] + R"(, "workers": [{"port": 1}]})");
    EXPECT_NE(x.rc, 0) << b[0];
    EXPECT_NE(std::string(x.err).find(b[1]), std::string::npos) << b[0] << "\ngot: " << x.err;
  }
}

TEST(Config, BadInputsNameTheField) {
  for (const BadCase &b : kBad) {
    Cfg x(b.json);
    EXPECT_NE(x.rc, 0) << b.json;
    EXPECT_EQ(x.c, nullptr) << b.json;
    EXPECT_NE(std::string(x.err).find(b.needle), std::string::npos)
        << "json: " << b.json << "\nwant: " << b.needle << "\ngot:  " << x.err;
  }
}

TEST(Config, LoadErrors) {
  cfg_cluster *c = nullptr;
  char err[512] = "";
  EXPECT_NE(cfg_load("/nonexistent/dir/x.json", &c, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("/nonexistent/dir/x.json: cannot open"), std::string::npos) << err;
  EXPECT_EQ(c, nullptr);
  char tmpl[] = "/tmp/dserve_cfg_XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const char *txt = "{\n  \"model\": \"m\",\n  \"workers\": [ {\"port\": 1,} ]\n}\n";
  ASSERT_EQ(write(fd, txt, strlen(txt)), (ssize_t)strlen(txt));
  close(fd);
  EXPECT_NE(cfg_load(tmpl, &c, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("not valid JSON (near line 3"), std::string::npos) << err;
  unlink(tmpl);
  cfg_free(nullptr); // no-op
  EXPECT_NE(cfg_parse(nullptr, 0, "t.json", &c, err, sizeof err), 0);
}

} // namespace
