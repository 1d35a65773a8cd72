// tests/config/test_kvstore.cc: the "kvstore" section (the shared KV tier on Redis): defaults, values, strict errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <cstring>
#include <string>
#include <unistd.h>

extern "C" {
#include "config/config.h"
}

namespace {

struct Cfg {
  cfg_cluster *c = nullptr;
  char err[512] = "";
  int rc = 0;
  explicit Cfg(const std::string &kvstore, const char *path = "/etc/dserve/t.json") {
    std::string json = R"({"model": "m.gguf", )" + kvstore + R"("workers": [{"name": "w0", "port": 9100}]})";
    rc = cfg_parse(json.data(), json.size(), path, &c, err, sizeof err);
  }
  ~Cfg() { cfg_free(c); }
};

TEST(ConfigKvstore, AbsentMeansNoStore) {
  Cfg x("");
  ASSERT_EQ(x.rc, 0) << x.err;
  EXPECT_EQ(x.c->has_kvstore, 0);
  EXPECT_EQ(x.c->kvstore.n_endpoints, 0);
}

TEST(ConfigKvstore, Defaults) {
  Cfg x(R"("kvstore": {"type": "redis", "endpoints": ["127.0.0.1:6379"]}, )");
  ASSERT_EQ(x.rc, 0) << x.err;
  ASSERT_EQ(x.c->has_kvstore, 1);
  const cfg_kvstore &k = x.c->kvstore;
  EXPECT_STREQ(k.type, "redis");
  ASSERT_EQ(k.n_endpoints, 1);
  EXPECT_STREQ(k.endpoints[0], "127.0.0.1:6379");
  EXPECT_EQ(k.cluster, 0);
  EXPECT_EQ(k.read_timeout_ms, CFG_DEF_KVSTORE_READ_TIMEOUT_MS);
  EXPECT_EQ(k.read_timeout_ms, 50);
  EXPECT_EQ(k.ttl_s, 0);
  EXPECT_EQ(k.write_queue_mb, (double)CFG_DEF_KVSTORE_WRITE_QUEUE_MB);
  EXPECT_STREQ(k.password_file, "");
  EXPECT_STREQ(k.tls_ca, "");
}

TEST(ConfigKvstore, ValuesKeptAndFilesResolved) {
  Cfg x(R"("kvstore": {"type": "redis", "endpoints": ["r1:7000", "r2.example:7001", "[::1]:7002"], "cluster": true,
    "password_file": "redis.pass", "tls_ca": "/pki/ca.pem", "tls_cert": "c.pem", "tls_key": "k.pem",
    "read_timeout_ms": 20, "ttl_s": 3600, "write_queue_mb": 8.5}, )");
  ASSERT_EQ(x.rc, 0) << x.err;
  const cfg_kvstore &k = x.c->kvstore;
  ASSERT_EQ(k.n_endpoints, 3);
  EXPECT_STREQ(k.endpoints[1], "r2.example:7001");
  EXPECT_STREQ(k.endpoints[2], "[::1]:7002");
  EXPECT_EQ(k.cluster, 1);
  EXPECT_STREQ(k.password_file, "/etc/dserve/redis.pass"); // against the config file's folder
  EXPECT_STREQ(k.tls_ca, "/pki/ca.pem");                    // absolute stays
  EXPECT_STREQ(k.tls_cert, "/etc/dserve/c.pem");
  EXPECT_STREQ(k.tls_key, "/etc/dserve/k.pem");
  EXPECT_EQ(k.read_timeout_ms, 20);
  EXPECT_EQ(k.ttl_s, 3600);
  EXPECT_EQ(k.write_queue_mb, 8.5);
}

TEST(ConfigKvstore, BadInputsNameTheField) {
  const char *bad[][2] = {
      {R"("kvstore": "redis://h:1")", "kvstore: expected an object"},
      {R"("kvstore": {"endpoints": ["h:1"]})", "kvstore.type: missing"},
      {R"("kvstore": {"type": "memcached", "endpoints": ["h:1"]})", "kvstore.type: \"memcached\" is not one of: redis"},
      {R"("kvstore": {"type": "redis"})", "kvstore.endpoints: expected an array"},
      {R"("kvstore": {"type": "redis", "endpoints": []})", "kvstore.endpoints: expected an array"},
      {R"("kvstore": {"type": "redis", "endpoints": "h:1"})", "kvstore.endpoints: expected an array"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h"]})", "kvstore.endpoints[0]: expected \"host:port\""},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1", "h:0"]})", "kvstore.endpoints[1]"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:65536"]})", "kvstore.endpoints[0]"},
      {R"("kvstore": {"type": "redis", "endpoints": ["redis://h:1"]})", "kvstore.endpoints[0]"},
      {R"("kvstore": {"type": "redis", "endpoints": [7]})", "kvstore.endpoints[0]"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1"], "cluster": 1})", "kvstore.cluster: expected true or false"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1"], "read_timeout_ms": 0})", "kvstore.read_timeout_ms"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1"], "read_timeout_ms": 2.5})", "kvstore.read_timeout_ms"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1"], "ttl_s": -1})", "kvstore.ttl_s"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1"], "write_queue_mb": 0})", "kvstore.write_queue_mb"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1"], "password_file": ""})", "kvstore.password_file"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1"], "tls_cert": "c"})", "tls_cert and tls_key go together"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1"], "tls_key": "k"})", "tls_cert and tls_key go together"},
      {R"("kvstore": {"type": "redis", "endpoints": ["h:1"], "timeout": 5})", "kvstore.timeout"},
  };
  for (auto &b : bad) {
    Cfg x(std::string(b[0]) + ", ");
    EXPECT_NE(x.rc, 0) << b[0];
    EXPECT_EQ(x.c, nullptr) << b[0];
    EXPECT_NE(std::string(x.err).find(b[1]), std::string::npos) << b[0] << "\ngot: " << x.err;
  }
}

// dserve launch's flags make an effective config read from elsewhere: the section's files still mean the file's folder.
TEST(ConfigKvstore, EffectiveConfigKeepsTheFilesFolder) {
  char dir[] = "/tmp/dserve_kvs_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/c.json";
  std::ofstream(path) << R"({"model": "m.gguf", "workers": [{"name": "w0", "port": 9100}],
    "kvstore": {"type": "redis", "endpoints": ["h:1"], "password_file": "redis.pass", "tls_ca": "pki/ca.pem"}})";
  char err[512] = "", *json = nullptr;
  cfg_set set = {"kvstore.ttl_s", "60", CFG_SET_JSON};
  ASSERT_EQ(cfg_effective_json(path.c_str(), nullptr, &set, 1, &json, err, sizeof err), 0) << err;
  cfg_cluster *c = nullptr;
  ASSERT_EQ(cfg_parse(json, strlen(json), "/elsewhere/effective.json", &c, err, sizeof err), 0) << err;
  EXPECT_EQ(std::string(c->kvstore.password_file), std::string(dir) + "/redis.pass");
  EXPECT_EQ(std::string(c->kvstore.tls_ca), std::string(dir) + "/pki/ca.pem");
  EXPECT_EQ(c->kvstore.ttl_s, 60);
  cfg_free(c);
  free(json);
  unlink(path.c_str());
  rmdir(dir);
}

} // namespace
