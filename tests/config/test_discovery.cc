// tests/config/test_discovery.cc: the config's "discovery" section: kept values, defaults, file paths resolved
// against the config's folder, and each bad value named.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <unistd.h>

extern "C" {
#include "config/config.h"
}

namespace {

struct Parsed {
  cfg_cluster *c = nullptr;
  char err[512] = "";
  int rc = 0;
  explicit Parsed(const std::string &json, const char *path = "/etc/dserve/c.json") {
    rc = cfg_parse(json.data(), json.size(), path, &c, err, sizeof err);
  }
  ~Parsed() { cfg_free(c); }
};

std::string with(const std::string &discovery, const std::string &workers = "") {
  return R"({"model": "m.gguf", "discovery": )" + discovery + (workers.empty() ? "" : R"(, "workers": )" + workers) +
         "}";
}

const char *kOk = R"({"etcd": ["http://10.0.0.5:2379", "https://10.0.0.6:2379"], "cluster": "prod-a"})";

} // namespace

TEST(ConfigDiscovery, ValuesDefaultsAndNoWorkersNeeded) {
  Parsed p(with(kOk));
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_TRUE(p.c->has_discovery);
  EXPECT_EQ(p.c->n_workers, 0);
  EXPECT_EQ(p.c->discovery.n_etcd, 2);
  EXPECT_STREQ(p.c->discovery.etcd[1], "https://10.0.0.6:2379");
  EXPECT_STREQ(p.c->discovery.cluster, "prod-a");
  EXPECT_EQ(p.c->discovery.lease_ttl_s, CFG_DEF_LEASE_TTL_S);
  EXPECT_STREQ(p.c->discovery.user, "");
  Parsed empty(with(kOk, "[]"));
  EXPECT_EQ(empty.rc, 0) << empty.err;
  Parsed prefill_alone(with(kOk, R"([{"name": "p0", "role": "prefill", "port": 9100}])"));
  EXPECT_EQ(prefill_alone.rc, 0) << "its decode workers come from etcd: " << prefill_alone.err;
}

TEST(ConfigDiscovery, WithoutItNothingChanges) {
  Parsed p(R"({"model": "m.gguf", "workers": []})");
  EXPECT_NE(p.rc, 0);
  EXPECT_NE(std::string(p.err).find("workers"), std::string::npos) << p.err;
  Parsed q(R"({"model": "m.gguf", "workers": [{"name": "w0", "port": 9100}]})");
  ASSERT_EQ(q.rc, 0) << q.err;
  EXPECT_FALSE(q.c->has_discovery);
}

TEST(ConfigDiscovery, TlsAndAuthFilesResolveAgainstTheConfigFolder) {
  Parsed p(with(R"({"etcd": ["https://e:2379"], "cluster": "c", "lease_ttl_s": 5, "ca_file": "ca.pem",
                    "cert_file": "/abs/client.pem", "key_file": "k/client.key", "user": "dserve",
                    "password_file": "etcd.pw"})"));
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_EQ(p.c->discovery.lease_ttl_s, 5);
  EXPECT_STREQ(p.c->discovery.ca_file, "/etc/dserve/ca.pem");
  EXPECT_STREQ(p.c->discovery.cert_file, "/abs/client.pem");
  EXPECT_STREQ(p.c->discovery.key_file, "/etc/dserve/k/client.key");
  EXPECT_STREQ(p.c->discovery.user, "dserve");
  EXPECT_STREQ(p.c->discovery.password_file, "/etc/dserve/etcd.pw");
}

// The launcher hands its children the effective text (config/override.c) from a folder of its own: discovery's files
// must still mean the config file's folder.
TEST(ConfigDiscovery, EffectiveTextKeepsTheFilesFolder) {
  char *json = nullptr;
  char err[512];
  const char *base = R"({"model": "/m.gguf", "discovery": {"etcd": ["https://e:2379"], "cluster": "c",
                         "ca_file": "ca.pem", "cert_file": "c.pem", "key_file": "c.key", "user": "u",
                         "password_file": "pw"}})";
  ASSERT_EQ(cfg_effective_json(nullptr, base, nullptr, 0, &json, err, sizeof err), 0) << err;
  Parsed p(json, "/elsewhere/effective.json");
  free(json);
  ASSERT_EQ(p.rc, 0) << p.err;
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  EXPECT_EQ(std::string(p.c->discovery.ca_file), std::string(cwd) + "/ca.pem");
  EXPECT_EQ(std::string(p.c->discovery.cert_file), std::string(cwd) + "/c.pem");
  EXPECT_EQ(std::string(p.c->discovery.key_file), std::string(cwd) + "/c.key");
  EXPECT_EQ(std::string(p.c->discovery.password_file), std::string(cwd) + "/pw");
}

TEST(ConfigDiscovery, BadValuesNameTheField) {
  struct Case {
    const char *json, *field;
  } cases[] = {
      {R"({"cluster": "c"})", "discovery.etcd"},
      {R"({"etcd": [], "cluster": "c"})", "discovery.etcd"},
      {R"({"etcd": ["10.0.0.5:2379"], "cluster": "c"})", "discovery.etcd[0]"},
      {R"({"etcd": [5], "cluster": "c"})", "discovery.etcd[0]"},
      {R"({"etcd": ["http://e:1","http://e:2","http://e:3","http://e:4","http://e:5","http://e:6","http://e:7",
                    "http://e:8","http://e:9"], "cluster": "c"})", "discovery.etcd"},
      {R"({"etcd": ["http://e:2379"]})", "discovery.cluster"},
      {R"({"etcd": ["http://e:2379"], "cluster": "a/b"})", "discovery.cluster"},
      {R"({"etcd": ["http://e:2379"], "cluster": ".."})", "discovery.cluster"},
      {R"({"etcd": ["http://e:2379"], "cluster": "c", "lease_ttl_s": 1})", "discovery.lease_ttl_s"},
      {R"({"etcd": ["http://e:2379"], "cluster": "c", "lease_ttl_s": 2.5})", "discovery.lease_ttl_s"},
      {R"({"etcd": ["http://e:2379"], "cluster": "c", "cert_file": "x.pem"})", "discovery.cert_file"},
      {R"({"etcd": ["http://e:2379"], "cluster": "c", "user": "u"})", "discovery.user"},
      {R"({"etcd": ["http://e:2379"], "cluster": "c", "password": "p"})", "discovery.password"},
      {R"({"etcd": ["http://e:2379"], "cluster": "c", "ca_file": ""})", "discovery.ca_file"},
      {R"("etcd")", "discovery"},
  };
  for (const Case &k : cases) {
    Parsed p(with(k.json), "t.json");
    EXPECT_NE(p.rc, 0) << k.json;
    EXPECT_NE(std::string(p.err).find(std::string("t.json: ") + k.field), std::string::npos) << k.json << " -> " << p.err;
  }
}
