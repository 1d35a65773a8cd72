// tests/kvstore/test_kvstore.cc: the shared KV block tier against real redis-server processes (one server, and a
// three-master Redis Cluster): round trips, misses, forged and mismatched values, auth, outages, the write queue, TTL.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/kvs_int.h"
#include "kvstore/kvstore.h"
#include "tests/kvstore/redis_util.h"

using kvs_test::Redis;
using kvs_test::wait_for;

namespace {

constexpr int kTokens = 4;
constexpr size_t kBytes = 1000;

// A chain of n blocks: keys from seed, each the parent of the next, tokens and payload from the key.
struct Chain {
  std::vector<std::vector<int32_t>> toks;
  std::vector<std::vector<uint8_t>> pay, out;
  std::vector<kvs_block> b;
  std::vector<void *> dst;
  Chain(int n, uint64_t seed) : toks(n), pay(n), out(n), b(n), dst(n) {
    uint64_t parent = 0;
    for (int i = 0; i < n; i++) {
      uint64_t key = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xC2B2AE3D27D4EB4Full + 1;
      toks[i] = {(int32_t)i, (int32_t)(key & 0xffff), 7, (int32_t)seed};
      pay[i].resize(kBytes);
      for (size_t j = 0; j < kBytes; j++) pay[i][j] = (uint8_t)(key >> (j % 8 * 8)) ^ (uint8_t)j;
      out[i].assign(kBytes, 0);
      b[i] = {key, parent, toks[i].data()};
      dst[i] = out[i].data();
      parent = key;
    }
  }
  int read(kvs *s, int n = -1) { return kvs_read_run(s, b.data(), n < 0 ? (int)b.size() : n, dst.data()); }
  int write(kvs *s, int from = 0, int to = -1) {
    int queued = 0;
    for (int i = from; i < (to < 0 ? (int)b.size() : to); i++) queued += kvs_write(s, &b[i], pay[i].data()) == 1;
    return queued;
  }
};

struct Cfg {
  std::vector<std::string> eps;
  std::vector<const char *> ptrs;
  kvs_config c = {};
  explicit Cfg(const std::vector<int> &ports, int cluster = 0) {
    for (int p : ports) eps.push_back("127.0.0.1:" + std::to_string(p));
    for (auto &e : eps) ptrs.push_back(e.c_str());
    c.endpoints = ptrs.data();
    c.n_endpoints = (int)ptrs.size();
    c.cluster = cluster;
    c.read_timeout_ms = 500 * DSERVE_TIMEOUT_SCALE; // a loaded CI machine must not read as a slow store
    c.block_bytes = kBytes;
    c.block_tokens = kTokens;
    memset(c.mac_key, 0x11, 32);
    memset(c.space, 0x22, 32);
  }
};

kvs_stats stats(kvs *s) {
  kvs_stats st;
  kvs_stats_get(s, &st);
  return st;
}

// Opens c; with up, waits until the store answered (kvs_open's own probe gives up after 500 ms, which a sanitizer or
// valgrind build's TLS handshake can take; the background probe then gets there).
kvs *open_ok(const kvs_config &c, bool up = true) {
  kvs *s = nullptr;
  char err[256] = "";
  EXPECT_EQ(kvs_open(&c, &s, err, sizeof err), 0) << err;
  if (s && up) {
    EXPECT_TRUE(wait_for([&] { return stats(s).up == 1; })) << "the store never answered";
  }
  return s;
}

std::string key_of(const kvs_config &c, uint64_t key) {
  char name[KVS_KEY_LEN + 1];
  kvs_key_name(c.space, key, name);
  return name;
}

} // namespace

TEST(Kvstore, ConfigErrors) {
  Cfg f({6379});
  kvs *s = nullptr;
  char err[512];
  kvs_config c = f.c;
  c.tls_ca = "/nonexistent/ca.pem";
  EXPECT_EQ(kvs_open(&c, &s, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("tls_ca '/nonexistent/ca.pem'"), std::string::npos) << err;
  c = f.c;
  c.tls_cert = "/nonexistent/cli.crt";
  EXPECT_EQ(kvs_open(&c, &s, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("tls_cert and tls_key"), std::string::npos) << err;
  c = f.c;
  const char *bad[] = {"localhost"};
  c.endpoints = bad;
  EXPECT_EQ(kvs_open(&c, &s, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("endpoints[0]"), std::string::npos) << err;
  c = f.c;
  c.write_queue_bytes = 10;
  EXPECT_EQ(kvs_open(&c, &s, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("write_queue_bytes"), std::string::npos) << err;
  c = f.c;
  c.block_tokens = 0;
  EXPECT_EQ(kvs_open(&c, &s, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("block_tokens"), std::string::npos) << err;
  EXPECT_EQ(s, nullptr);
}

TEST(Kvstore, KeySlotsMatchRedis) {
  REQUIRE_REDIS();
  Redis r; // CLUSTER KEYSLOT needs cluster support, not slots
  ASSERT_TRUE(r.start({"--cluster-enabled", "yes", "--cluster-config-file", r.dir + "/nodes.conf"}));
  EXPECT_EQ(kvs_crc16("123456789", 9), 0x31C3); // the XMODEM check value
  Cfg f({r.port});
  std::vector<std::string> keys = {key_of(f.c, 1), key_of(f.c, 2), "{user1000}.following", "foo{}{bar}",
                                   "foo{{bar}}zap", "foo{bar}{zap}", "a{b"};
  for (auto &k : keys)
    EXPECT_EQ(std::to_string(kvs_key_slot(k.data(), k.size())), r.cli("CLUSTER KEYSLOT '" + k + "'")) << k;
}

TEST(Kvstore, RoundTripAndStopAtFirstMiss) {
  REQUIRE_REDIS();
  Redis r;
  ASSERT_TRUE(r.start());
  Cfg f({r.port});
  kvs *s = open_ok(f.c);
  Chain ch(8, 1);
  EXPECT_EQ(ch.write(s, 0, 3) + ch.write(s, 4), 7); // block 3 is never written
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(ch.read(s, 3), 3);
  for (int i = 0; i < 3; i++) EXPECT_EQ(ch.out[i], ch.pay[i]) << i;
  std::fill(ch.out[4].begin(), ch.out[4].end(), 0);
  EXPECT_EQ(ch.read(s), 3); // stops at 3 though 4..7 are there
  EXPECT_EQ(ch.out[4], std::vector<uint8_t>(kBytes, 0)) << "a block past the run was written";
  EXPECT_EQ(ch.write(s, 3, 4), 1);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(ch.read(s), 8);
  for (int i = 0; i < 8; i++) EXPECT_EQ(ch.out[i], ch.pay[i]) << i;
  EXPECT_EQ(r.cli("DBSIZE"), "8");
  EXPECT_EQ(ch.write(s, 0, 8), 0); // all known present now
  kvs_stats st = stats(s);
  EXPECT_EQ(st.write_blocks, 8u);
  EXPECT_EQ(st.write_bytes, 8u * kBytes);
  EXPECT_EQ(st.read_bytes, (3u + 3u + 8u) * kBytes);
  EXPECT_EQ(st.write_skipped, 8u);
  EXPECT_EQ(st.read_blocks, 3u + 3u + 8u);
  EXPECT_EQ(st.read_misses, 1u);
  EXPECT_EQ(st.errors + st.timeouts + st.mac_failures + st.mismatches + st.queue_drops, 0u);
  EXPECT_EQ(st.up, 1);
  kvs_close(s);
}

TEST(Kvstore, MismatchedValuesAreMisses) {
  REQUIRE_REDIS();
  Redis r;
  ASSERT_TRUE(r.start());
  Cfg f({r.port});
  kvs *s = open_ok(f.c);
  Chain ch(3, 2);
  // Another parent, other tokens: the same key (the chain key alone names it), a genuine MAC, the wrong block.
  Chain other = ch;
  other.b[0].parent = 12345;
  other.toks[1][2] = 99;
  for (int i = 0; i < 3; i++) other.b[i].toks = other.toks[i].data();
  ASSERT_EQ(other.write(s), 3);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_EQ(stats(s).mismatches, 1u);
  Chain ch1 = ch; // from block 1 on: its parent matches, its tokens do not
  ch1.b.erase(ch1.b.begin());
  ch1.dst.erase(ch1.dst.begin());
  EXPECT_EQ(ch1.read(s), 0);
  EXPECT_EQ(stats(s).mismatches, 2u);
  // Another space: a value copied under this space's key is genuine but of another model.
  Cfg g({r.port});
  memset(g.c.space, 0x33, 32);
  kvs *t = open_ok(g.c);
  Chain ch2(1, 3);
  ASSERT_EQ(ch2.write(t), 1);
  ASSERT_EQ(kvs_flush(t, 10000), 0);
  EXPECT_EQ(r.cli("RENAME " + key_of(g.c, ch2.b[0].key) + " " + key_of(f.c, ch2.b[0].key)), "OK");
  EXPECT_EQ(ch2.read(s), 0);
  EXPECT_EQ(stats(s).mismatches, 3u);
  EXPECT_EQ(stats(s).mac_failures, 0u);
  kvs_close(t);
  kvs_close(s);
}

TEST(Kvstore, ForgedValuesAreDetected) {
  REQUIRE_REDIS();
  Redis r;
  ASSERT_TRUE(r.start());
  Cfg f({r.port}), g({r.port});
  memset(g.c.mac_key, 0x44, 32); // another cluster's secret
  kvs *s = open_ok(f.c), *t = open_ok(g.c);
  Chain ch(2, 4);
  ASSERT_EQ(ch.write(t), 2);
  ASSERT_EQ(kvs_flush(t, 10000), 0);
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_EQ(stats(s).mac_failures, 1u);
  EXPECT_EQ(ch.read(t), 2); // its own key reads it
  // Raw bytes with a plain SET, short and long.
  EXPECT_EQ(r.cli("SET " + key_of(f.c, ch.b[0].key) + " forged"), "OK");
  EXPECT_EQ(ch.read(s), 0);
  std::string big(kvs_value_len(kTokens, kBytes), 'x');
  EXPECT_EQ(r.cli("SET " + key_of(f.c, ch.b[0].key) + " " + big), "OK");
  EXPECT_EQ(ch.read(s), 0);
  kvs_stats st = stats(s);
  EXPECT_EQ(st.mac_failures, 3u);
  EXPECT_EQ(st.read_blocks, 0u);
  EXPECT_EQ(st.mismatches, 0u);
  // The recomputed blocks' writes replace what was refused (block 0); block 1, never read, is checked as usual
  // (EXISTS: there, skipped), and stays t's.
  EXPECT_EQ(ch.write(s), 2);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(stats(s).write_blocks, 1u);
  EXPECT_EQ(stats(s).write_skipped, 1u);
  EXPECT_EQ(ch.read(s, 1), 1) << "the forged value healed";
  EXPECT_EQ(ch.read(s), 1);
  EXPECT_EQ(stats(s).mac_failures, 4u);
  kvs_close(t);
  kvs_close(s);
}

TEST(Kvstore, WrongPasswordIsCountedNotFatal) {
  REQUIRE_REDIS();
  Redis r;
  r.password = "right-secret";
  ASSERT_TRUE(r.start());
  Cfg f({r.port});
  f.c.password = "wrong";
  testing::internal::CaptureStderr();
  kvs *s = open_ok(f.c, false);
  Chain ch(2, 5);
  EXPECT_EQ(ch.write(s), 0); // dropped: the store is down for us
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_TRUE(wait_for([&] { return stats(s).auth_failures >= 2; })) << "the probe retries";
  kvs_close(s);
  std::string log = testing::internal::GetCapturedStderr();
  std::string who = "127.0.0.1:" + std::to_string(r.port) + " refused the password";
  size_t at = log.find(who);
  EXPECT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find(who, at + 1), std::string::npos) << "logged more than once: " << log;
  Cfg none({r.port}); // no password at all: NOAUTH, the same
  s = open_ok(none.c, false);
  EXPECT_TRUE(wait_for([&] { return stats(s).auth_failures >= 1; }));
  EXPECT_EQ(ch.read(s), 0);
  kvs_close(s);
  Cfg ok({r.port});
  ok.c.password = "right-secret";
  s = open_ok(ok.c);
  EXPECT_EQ(ch.write(s), 2);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(ch.read(s), 2);
  EXPECT_EQ(stats(s).auth_failures, 0u);
  kvs_close(s);
}

TEST(Kvstore, DownAtOpenThenBack) {
  REQUIRE_REDIS();
  Redis r; // not started yet
  Cfg f({r.port});
  testing::internal::CaptureStderr();
  kvs *s = open_ok(f.c, false);
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("127.0.0.1:" + std::to_string(r.port) + " unavailable"), std::string::npos) << log;
  Chain ch(3, 6);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "a down store must not be waited on";
  EXPECT_EQ(ch.write(s), 0);
  kvs_stats st = stats(s);
  EXPECT_EQ(st.read_skipped, 2u);
  EXPECT_EQ(st.queue_drops, 3u);
  EXPECT_GE(st.errors, 1u);
  EXPECT_EQ(st.up, 0);
  ASSERT_TRUE(r.start());
  EXPECT_TRUE(wait_for([&] { return stats(s).up == 1; })) << "the background probe reaches the store";
  EXPECT_EQ(ch.write(s), 3);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(ch.read(s), 3);
  kvs_close(s);
}

TEST(Kvstore, KilledMidRun) {
  REQUIRE_REDIS();
  Redis r;
  ASSERT_TRUE(r.start());
  Cfg f({r.port});
  kvs *s = open_ok(f.c);
  Chain ch(4, 7);
  ASSERT_EQ(ch.write(s), 4);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  ASSERT_EQ(ch.read(s), 4);
  r.stop();
  EXPECT_EQ(ch.read(s), 0);
  kvs_stats st = stats(s);
  EXPECT_GE(st.errors + st.timeouts, 1u);
  EXPECT_EQ(st.up, 0);
  EXPECT_EQ(ch.read(s), 0); // backing off: not even a connect
  EXPECT_EQ(stats(s).read_skipped, st.read_skipped + 1);
  ASSERT_TRUE(r.start()); // empty again (no persistence)
  EXPECT_TRUE(wait_for([&] { return stats(s).up == 1; }));
  st = stats(s);
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_EQ(stats(s).errors, st.errors) << "a miss on a fresh connection, not a failure on the old one";
  EXPECT_EQ(ch.write(s), 4) << "the store came back (maybe empty): blocks known present are checked again";
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(ch.read(s), 4);
  kvs_close(s);
}

// A fake store on loopback: answers PING, and to the first pipelined GETs sends `reply` and closes (close) or stays
// silent until the client goes.
struct FakeStore {
  int lfd = -1, port = 0;
  std::atomic<int> gets{0};
  std::thread srv;
  FakeStore(std::string reply, bool close_after) {
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(lfd, (sockaddr *)&a, sizeof a) || listen(lfd, 8) || getsockname(lfd, (sockaddr *)&a, &al)) return;
    port = ntohs(a.sin_port);
    srv = std::thread([this, reply, close_after] {
      std::vector<std::thread> conns;
      for (int fd; (fd = accept(lfd, nullptr, nullptr)) >= 0;) {
        conns.emplace_back([this, fd, reply, close_after] {
          std::string in;
          char buf[4096];
          for (ssize_t k; (k = read(fd, buf, sizeof buf)) > 0;) {
            in.append(buf, (size_t)k);
            if (in.find("PING") != std::string::npos) {
              in.clear();
              if (write(fd, "+PONG\r\n", 7) != 7) break;
            } else if (in.find("GET") != std::string::npos && gets++ == 0) {
              for (size_t off = 0; off < reply.size();) {
                ssize_t w = write(fd, reply.data() + off, reply.size() - off);
                if (w <= 0) break;
                off += (size_t)w;
              }
              if (close_after) break;
            }
          }
          close(fd);
        });
      }
      for (auto &t : conns) t.join();
    });
  }
  ~FakeStore() {
    shutdown(lfd, SHUT_RDWR);
    close(lfd);
    if (srv.joinable()) srv.join();
  }
};

// What a read of a fake store's reply does: 0 blocks, ended well before its 5 s budget, one error, no timeout.
void read_fails_fast(const std::string &reply, bool close_after, const char *why) {
  FakeStore fake(reply, close_after);
  ASSERT_GT(fake.port, 0);
  Cfg f({fake.port});
  f.c.read_timeout_ms = 5000 * DSERVE_TIMEOUT_SCALE;
  kvs *s = open_ok(f.c);
  Chain ch(3, 14);
  testing::internal::CaptureStderr();
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ch.read(s), 0) << why;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4)) << why << ": not ended by the budget";
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("unavailable (a read failed)"), std::string::npos) << why << ": " << log;
  EXPECT_EQ(fake.gets.load(), 1) << why;
  kvs_stats st = stats(s);
  EXPECT_EQ(st.errors, 1u) << why;
  EXPECT_EQ(st.timeouts, 0u) << why;
  kvs_close(s);
}

// A store that dies in the middle of a reply: half of one value, then the close.
TEST(Kvstore, DiesMidReply) {
  read_fails_fast("$" + std::to_string(kvs_value_len(kTokens, kBytes)) + "\r\n" + std::string(100, 'x'), true,
                  "half a value");
}

// Replies no store of ours sends, which hiredis alone would buffer or allocate for: an array declared with two
// billion elements (16 GB of pointers, asked for by 14 bytes), and a value far larger than a block, streaming.
TEST(Kvstore, RefusesOversizedReplies) {
  read_fails_fast("*2000000000\r\n", false, "a huge array");
  read_fails_fast("$1000000000\r\n" + std::string((size_t)6 << 20, 'x'), false, "a huge value");
}

TEST(Kvstore, WriteQueueOverflowDrops) {
  REQUIRE_REDIS();
  Redis r;
  ASSERT_TRUE(r.start());
  Cfg f({r.port});
  f.c.write_queue_bytes = 3 * (kBytes + 4 * kTokens);
  kvs *s = open_ok(f.c);
  // Writes stall in the store, so nothing leaves the queue while we fill it.
  ASSERT_EQ(r.cli("CLIENT PAUSE 20000 WRITE"), "OK");
  Chain ch(10, 8);
  int queued = ch.write(s);
  EXPECT_EQ(queued, 3);
  EXPECT_EQ(stats(s).queue_drops, 7u);
  ASSERT_EQ(r.cli("CLIENT UNPAUSE"), "OK");
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(ch.read(s), 3);
  EXPECT_EQ(stats(s).write_blocks, 3u);
  kvs_close(s);
}

TEST(Kvstore, SlowStoreTimesOut) {
  REQUIRE_REDIS();
  Redis r;
  ASSERT_TRUE(r.start());
  Cfg f({r.port});
  f.c.read_timeout_ms = 100;
  kvs *s = open_ok(f.c);
  Chain ch(2, 11);
  ASSERT_EQ(ch.write(s), 2);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  // Every command waits 1.5 s: a store too slow for the budget. (No UNPAUSE: redis-cli itself would wait.)
  ASSERT_EQ(r.cli("CLIENT PAUSE 1500 ALL"), "OK");
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "the budget bounds the wait";
  EXPECT_EQ(stats(s).timeouts, 1u);
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_EQ(stats(s).read_skipped, 1u) << "backing off: answered at once";
  EXPECT_TRUE(wait_for([&] { return ch.read(s) == 2; }));
  kvs_close(s);
}

TEST(Kvstore, TtlApplied) {
  REQUIRE_REDIS();
  Redis r;
  ASSERT_TRUE(r.start());
  Cfg f({r.port}), g({r.port});
  f.c.ttl_s = 100;
  memset(g.c.space, 0x55, 32);
  kvs *s = open_ok(f.c), *t = open_ok(g.c);
  Chain ch(1, 9);
  ASSERT_EQ(ch.write(s), 1);
  ASSERT_EQ(ch.write(t), 1);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  ASSERT_EQ(kvs_flush(t, 10000), 0);
  int ttl = std::stoi(r.cli("TTL " + key_of(f.c, ch.b[0].key)));
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 100);
  EXPECT_EQ(r.cli("TTL " + key_of(g.c, ch.b[0].key)), "-1"); // ttl_s 0: no expiry
  kvs_close(t);
  kvs_close(s);
}

// Three masters, slots spread by redis-cli --cluster create. Three nodes' worth of blocks; one master dies.
TEST(Kvstore, ClusterSpreadsAndSurvivesADeadMaster) {
  REQUIRE_REDIS();
  Redis n[3];
  std::string create = "redis-cli --cluster create";
  for (auto &r : n) {
    // full coverage off: the live masters keep serving their slots while one is dead
    ASSERT_TRUE(r.start({"--cluster-enabled", "yes", "--cluster-config-file", r.dir + "/nodes.conf",
                         "--cluster-node-timeout", "5000", "--cluster-require-full-coverage", "no"}));
    create += " 127.0.0.1:" + std::to_string(r.port);
  }
  std::string out = kvs_test::run(create + " --cluster-replicas 0 --cluster-yes");
  ASSERT_NE(out.find("All 16384 slots covered"), std::string::npos) << out;
  for (auto &r : n)
    ASSERT_TRUE(wait_for([&] { return r.cli("CLUSTER INFO").find("cluster_state:ok") != std::string::npos; }));
  Cfg f({n[0].port}, 1); // one seed: the rest come from CLUSTER SLOTS
  kvs *s = open_ok(f.c);
  Chain ch(30, 10);
  ASSERT_EQ(ch.write(s), 30);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(ch.read(s), 30);
  for (int i = 0; i < 30; i++) ASSERT_EQ(ch.out[i], ch.pay[i]) << i;
  int owner[30], total = 0;
  auto owners = [&] {
    for (int k = 0; k < 3; k++) {
      std::string keys = n[k].cli("KEYS 'dsv:*'");
      for (int i = 0; i < 30; i++)
        if (keys.find(key_of(f.c, ch.b[i].key)) != std::string::npos) owner[i] = k;
    }
  };
  owners();
  for (int k = 0; k < 3; k++) {
    int keys = std::stoi(n[k].cli("DBSIZE"));
    EXPECT_GT(keys, 0) << "node " << k << " holds none";
    total += keys;
  }
  EXPECT_EQ(total, 30);
  EXPECT_EQ(stats(s).errors, 0u);

  // Resharding: block 0's slot moves from its node a to b. While it migrates (the key already on b) a answers ASK;
  // once b owns the slot, a answers MOVED. Both are followed, within the run.
  int a = owner[0], b = (a + 1) % 3;
  std::string k0 = key_of(f.c, ch.b[0].key), slot = std::to_string(kvs_key_slot(k0.data(), k0.size()));
  std::string ida = n[a].cli("CLUSTER MYID"), idb = n[b].cli("CLUSTER MYID");
  ASSERT_EQ(n[b].cli("CLUSTER SETSLOT " + slot + " IMPORTING " + ida), "OK");
  ASSERT_EQ(n[a].cli("CLUSTER SETSLOT " + slot + " MIGRATING " + idb), "OK");
  ASSERT_EQ(n[a].cli("MIGRATE 127.0.0.1 " + std::to_string(n[b].port) + " " + k0 + " 0 5000"), "OK");
  ASSERT_EQ(n[a].cli("GET " + k0).rfind("ASK", 0), 0u) << n[a].cli("GET " + k0);
  std::fill(ch.out[0].begin(), ch.out[0].end(), 0);
  EXPECT_EQ(ch.read(s), 30) << "ASK followed";
  EXPECT_EQ(ch.out[0], ch.pay[0]);
  // A write of a block in the migrating slot goes through ASK too.
  Chain extra(2, 13);
  for (uint64_t k = 1000;; k++) { // a chain key whose block falls in the slot
    std::string name = key_of(f.c, k);
    if (std::to_string(kvs_key_slot(name.data(), name.size())) == slot) {
      extra.b[0].key = k;
      break;
    }
  }
  extra.b[1].parent = extra.b[0].key;
  ASSERT_EQ(extra.write(s, 0, 1), 1);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  for (int k = 0; k < 3; k++) ASSERT_EQ(n[k].cli("CLUSTER SETSLOT " + slot + " NODE " + idb), "OK");
  EXPECT_EQ(n[b].cli("EXISTS " + key_of(f.c, extra.b[0].key)), "1") << "written through ASK";
  ASSERT_EQ(n[a].cli("GET " + k0).rfind("MOVED", 0), 0u) << n[a].cli("GET " + k0);
  std::fill(ch.out[0].begin(), ch.out[0].end(), 0);
  uint64_t loads = stats(s).map_loads;
  EXPECT_GE(loads, 1u);
  EXPECT_EQ(ch.read(s), 30) << "MOVED followed";
  EXPECT_EQ(ch.out[0], ch.pay[0]);
  EXPECT_TRUE(wait_for([&] { return stats(s).map_loads > loads; })) << "a MOVED reloads the map";
  EXPECT_EQ(ch.read(s), 30) << "after the map's reload";
  // A write to a node that gave its (empty) slot away since the map was loaded: MOVED, followed.
  std::string k1 = key_of(f.c, extra.b[1].key), slot1 = std::to_string(kvs_key_slot(k1.data(), k1.size()));
  int x = 0;
  while (x < 3 && n[x].cli("GET " + k1).rfind("MOVED", 0) == 0) x++; // the owner answers nil
  ASSERT_LT(x, 3);
  int y = (x + 1) % 3;
  std::string idy = n[y].cli("CLUSTER MYID");
  for (int k = 0; k < 3; k++) ASSERT_EQ(n[k].cli("CLUSTER SETSLOT " + slot1 + " NODE " + idy), "OK");
  loads = stats(s).map_loads;
  uint64_t written = stats(s).write_blocks;
  ASSERT_EQ(extra.write(s, 1, 2), 1);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(n[y].cli("EXISTS " + k1), "1") << "written through MOVED";
  EXPECT_EQ(stats(s).write_blocks, written + 1);
  EXPECT_EQ(stats(s).queue_drops, 0u);
  EXPECT_TRUE(wait_for([&] { return stats(s).map_loads > loads; })) << "the write's MOVED reloads the map";
  EXPECT_EQ(stats(s).errors, 0u);
  owners();
  ASSERT_EQ(owner[0], b);
  // Kill the master of the first block that is not on block 0's node: the run ends right before it.
  int j = 1;
  while (j < 30 && owner[j] == owner[0]) j++;
  ASSERT_LT(j, 30);
  int dead = owner[j];
  n[dead].stop();
  for (auto &o : ch.out) std::fill(o.begin(), o.end(), 0);
  EXPECT_EQ(ch.read(s), j);
  for (int i = 0; i < j; i++) EXPECT_EQ(ch.out[i], ch.pay[i]) << i;
  EXPECT_EQ(ch.read(s), j) << "again, the dead node skipped";
  // A run that starts past the dead node's first block still reads from the live ones.
  int live = j + 1;
  while (live < 30 && owner[live] == dead) live++;
  if (live < 30) {
    Chain tail = ch;
    tail.b.erase(tail.b.begin(), tail.b.begin() + live);
    tail.dst.erase(tail.dst.begin(), tail.dst.begin() + live);
    int want = 0;
    while (live + want < 30 && owner[live + want] != dead) want++;
    EXPECT_EQ(tail.read(s), want);
  }
  kvs_stats st = stats(s);
  EXPECT_EQ(st.mac_failures + st.mismatches, 0u);
  kvs_close(s);
}

TEST(Kvstore, Tls) {
  REQUIRE_REDIS();
  Redis r;
  r.tls = true;
  ASSERT_TRUE(kvs_test::make_certs(r.dir))
      << "the openssl command could not make the test certificates: run scripts/setup.sh (it installs openssl)";
  ASSERT_TRUE(r.start());
  std::string ca = r.dir + "/ca.crt", cert = r.dir + "/cli.crt", key = r.dir + "/cli.key";
  Cfg f({r.port});
  f.c.tls_ca = ca.c_str();
  f.c.tls_cert = cert.c_str();
  f.c.tls_key = key.c_str();
  kvs *s = open_ok(f.c);
  Chain ch(20, 12);
  EXPECT_EQ(ch.write(s), 20);
  ASSERT_EQ(kvs_flush(s, 10000), 0);
  EXPECT_EQ(ch.read(s), 20);
  for (int i = 0; i < 20; i++) EXPECT_EQ(ch.out[i], ch.pay[i]) << i;
  EXPECT_EQ(r.cli("DBSIZE"), "20");
  kvs_close(s);
  // A store whose certificate does not chain to our CA is not the store: unavailable, logged, counted.
  std::string other = r.dir + "/other.crt";
  Cfg g = f;
  g.c.tls_ca = other.c_str();
  testing::internal::CaptureStderr();
  s = open_ok(g.c, false);
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("certificate verify failed"), std::string::npos) << log;
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_GE(stats(s).errors, 1u);
  kvs_close(s);
  // Plain TCP to a TLS port: no answer that parses, no crash.
  Cfg plain({r.port});
  plain.c.read_timeout_ms = 100;
  testing::internal::CaptureStderr();
  s = open_ok(plain.c, false);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(ch.read(s), 0);
  EXPECT_EQ(stats(s).up, 0);
  kvs_close(s);
}
