// tests/kvxfer/test_seal.cc: sealed tcp connections: transfers of many sizes arrive intact, a relay in the middle sees no plaintext and cannot alter, repeat or forge a record, and the sealing settings and handshake versions are negotiated.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "kvx_test_util.h"

using namespace kvxt;

namespace {

const char MARKER[] = "KVSEAL-MARKER-0123456789";

void fill_marker(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)MARKER[i % (sizeof MARKER - 1)];
}

bool has(const std::string &hay, const std::string &needle) { return hay.find(needle) != std::string::npos; }

int listen_lo(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (sockaddr *)&sa, sizeof sa) || listen(fd, 4)) return -1;
  socklen_t sl = sizeof sa;
  getsockname(fd, (sockaddr *)&sa, &sl);
  *port = ntohs(sa.sin_port);
  return fd;
}

// A man in the middle: forwards the bytes of one connection between the agents, keeps a copy of each direction,
// and may change them: flip one byte at an offset of a direction, or send one record of the client's twice.
struct Relay {
  enum Mode { PASS, FLIP_CS, FLIP_SC, DUP_CS };
  int lfd = -1, port = 0;
  Mode mode;
  size_t at;  // FLIP_*: the byte's offset in its direction; DUP_CS: the record's index after the handshake
  size_t hello;  // DUP_CS: bytes of the client's hello (then records)
  std::thread th;
  std::atomic<bool> stop{false};
  std::mutex m;
  std::string seen[2];  // client to server, server to client
  Relay(int to_port, Mode md = PASS, size_t where = 0, size_t hello_len = 0) : mode(md), at(where), hello(hello_len) {
    lfd = listen_lo(&port);
    th = std::thread([this, to_port] { run(to_port); });
  }
  void run(int to_port) {
    int c = accept(lfd, nullptr, nullptr);
    char err[256];
    int s = c >= 0 ? kvx_tcp_connect("127.0.0.1", to_port, 2000, err, sizeof err) : -1;
    size_t off[2] = {0, 0};
    std::string held;  // DUP_CS: client bytes not yet forwarded (a record is forwarded whole)
    size_t rec = 0;
    std::vector<char> buf(1 << 16);
    while (c >= 0 && s >= 0 && !stop) {
      pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
      if (poll(p, 2, 50) <= 0) continue;
      bool done = false;
      for (int k = 0; k < 2 && !done; k++) {
        if (!p[k].revents) continue;
        ssize_t n = recv(p[k].fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n <= 0) {
          done = true;
          break;
        }
        std::string b(buf.data(), (size_t)n);
        if ((mode == FLIP_CS && k == 0) || (mode == FLIP_SC && k == 1))
          if (at >= off[k] && at < off[k] + b.size()) b[at - off[k]] ^= 0x01;
        off[k] += b.size();
        {
          std::lock_guard<std::mutex> g(m);
          seen[k] += b;
        }
        if (mode != DUP_CS || k == 1) {
          kvx_fd_send_all(p[1 - k].fd, b.data(), b.size(), 2000);
          continue;
        }
        held += b;
        for (;;) {  // forward the hello, then whole records; record `at` twice
          size_t len;
          if (hello) {
            if (held.size() < hello) break;
            len = hello;
            hello = 0;
          } else {
            uint32_t l;
            if (held.size() < 4) break;
            memcpy(&l, held.data(), 4);
            len = 4 + (size_t)l + 16;
            if (held.size() < len) break;
            if (rec++ == at) kvx_fd_send_all(s, held.data(), len, 2000);
          }
          kvx_fd_send_all(s, held.data(), len, 2000);
          held.erase(0, len);
        }
      }
      if (done) break;
    }
    if (c >= 0) close(c);
    if (s >= 0) close(s);
  }
  std::string dir(int k) {
    std::lock_guard<std::mutex> g(m);
    return seen[k];
  }
  ~Relay() {
    stop = true;
    shutdown(lfd, SHUT_RDWR);
    th.join();
    close(lfd);
  }
};

struct Pair {
  LogCap la, lb;
  kvx_agent *a = nullptr, *b = nullptr;
  std::vector<uint8_t> src, dst;
  kvx_region *rs = nullptr, *rd = nullptr;
  Pair(size_t len, bool a_plain = false, bool b_plain = false) : src(len), dst(len) {
    a = agent("a", "tcp", &la, "s3cret", 3000, nullptr, a_plain);
    b = agent("b", "tcp", &lb, "s3cret", 3000, nullptr, b_plain);
    char err[256];
    if (!a || !b || kvx_register(a, src.data(), len, KVX_MEM_HOST, &rs, err, sizeof err) ||
        kvx_register(b, dst.data(), len, KVX_MEM_HOST, &rd, err, sizeof err) || !learn(a, b))
      ADD_FAILURE() << "pair set-up: " << err;
  }
  ~Pair() {
    kvx_agent_free(a);
    kvx_agent_free(b);
  }
  uint64_t s(size_t off = 0) { return (uint64_t)(uintptr_t)src.data() + off; }
  uint64_t d(size_t off = 0) { return (uint64_t)(uintptr_t)dst.data() + off; }
  // One request of a's; its final state (error text in *why).
  int xfer(int op, std::vector<kvx_desc> l, std::vector<kvx_desc> r, const char *notif, std::string *why = nullptr) {
    kvx_xfer *x = nullptr;
    char err[256];
    if (kvx_xfer_new(a, op, l.data(), l.size(), r.data(), r.size(), "b", notif, notif ? strlen(notif) : 0, &x, err,
                     sizeof err)) {
      ADD_FAILURE() << err;
      return -100;
    }
    post_xfer(x); // a failed post shows in wait_xfer
    int st = wait_xfer(a, x, 10000);
    if (why) *why = kvx_xfer_error(x);
    kvx_xfer_free(x);
    return st;
  }
};

// Sizes around the record size (64 KiB) and well past it, one descriptor or many (more than one frame's 512), WRITE
// then READ back, each WRITE's notification after its bytes: all over sealed connections.
TEST(KvxSeal, SealedTransfersOfManySizesArriveIntact) {
  const size_t cap = 6u << 20;
  Pair p(cap);
  ASSERT_TRUE(p.a && p.b);
  fill(p.src.data(), cap, 11);
  std::vector<uint8_t> back(cap);
  kvx_region *rb;
  char err[256];
  ASSERT_EQ(kvx_register(p.a, back.data(), cap, KVX_MEM_HOST, &rb, err, sizeof err), 0) << err;
  uint64_t bk = (uint64_t)(uintptr_t)back.data();
  int k = 0;
  for (size_t len : {(size_t)1, (size_t)7, (size_t)4095, (size_t)65516, (size_t)65535, (size_t)65536, (size_t)65537,
                     (size_t)(1 << 20) + 3, (size_t)5 << 20}) {
    std::string notif = "w" + std::to_string(k++);
    memset(p.dst.data(), 0, cap);
    ASSERT_EQ(p.xfer(KVX_WRITE, {{p.s(), len}}, {{p.d(), len}}, notif.c_str()), KVX_DONE) << len;
    auto ns = wait_notifs(p.b, 1, 5000);
    ASSERT_EQ(ns.size(), 1u) << len;
    EXPECT_EQ(ns[0], notif);
    ASSERT_EQ(memcmp(p.src.data(), p.dst.data(), len), 0) << len;
    memset(back.data(), 0, len);
    kvx_desc l = {bk, len}, r = {p.d(), len};
    kvx_xfer *x;
    ASSERT_EQ(kvx_xfer_new(p.a, KVX_READ, &l, 1, &r, 1, "b", nullptr, 0, &x, err, sizeof err), 0) << err;
    post_xfer(x); // a failed post shows in wait_xfer
    ASSERT_EQ(wait_xfer(p.a, x, 10000), KVX_DONE) << kvx_xfer_error(x);
    kvx_xfer_free(x);
    ASSERT_EQ(memcmp(back.data(), p.src.data(), len), 0) << len;
  }
  // 1500 scattered blocks of 1..4096 bytes (three frames), WRITE and READ, pipelined with a standalone notification.
  Blocks bl(p.s(), p.d(), 1500, 4096, 3);
  memset(p.dst.data(), 0, cap);
  ASSERT_EQ(p.xfer(KVX_WRITE, bl.src, bl.dst, "many"), KVX_DONE);
  ASSERT_EQ(kvx_notify(p.a, "b", "after", 5, err, sizeof err), 0) << err;
  auto ns = wait_notifs(p.b, 2, 5000);
  ASSERT_EQ(ns.size(), 2u);
  EXPECT_EQ(ns[0], "many");
  EXPECT_EQ(ns[1], "after");
  EXPECT_TRUE(blocks_equal(bl, 0, 0));
  Blocks rbl(bk, p.d(), 1500, 4096, 4);
  ASSERT_EQ(p.xfer(KVX_READ, rbl.src, rbl.dst, nullptr), KVX_DONE);
  EXPECT_TRUE(blocks_equal(rbl, 0, 0));
  EXPECT_EQ(kvx_auth_failures(p.a) + kvx_auth_failures(p.b), 0u);
}

// What a relay between the agents sees: with sealing, neither the payload (both ways: WRITE and READ) nor the
// notification; with both agents plaintext, all of it (so the check can fail).
void relay_sees(bool plain, bool *payload, bool *notif) {
  const size_t len = 256 << 10;
  Pair p(len, plain, plain);
  ASSERT_TRUE(p.a && p.b);
  fill_marker(p.src.data(), len / 2);
  fill_marker(p.dst.data() + len / 2, len / 2);
  Relay r(kvx_agent_port(p.b));
  char err[256];
  ASSERT_EQ(kvx_set_peer_endpoint(p.a, "b", "127.0.0.1", r.port, err, sizeof err), 0) << err;
  ASSERT_EQ(p.xfer(KVX_WRITE, {{p.s(), len / 2}}, {{p.d(), len / 2}}, "notif-KVSEAL-MARKER"), KVX_DONE);
  ASSERT_EQ(wait_notifs(p.b, 1, 5000).size(), 1u);
  ASSERT_EQ(p.xfer(KVX_READ, {{p.s(len / 2), len / 2}}, {{p.d(len / 2), len / 2}}, nullptr), KVX_DONE);
  EXPECT_EQ(memcmp(p.src.data(), p.dst.data(), len), 0);
  std::string cs = r.dir(0), sc = r.dir(1);
  EXPECT_GT(cs.size(), len / 2);
  EXPECT_GT(sc.size(), len / 2);
  *payload = has(cs, MARKER) || has(sc, MARKER);
  EXPECT_EQ(has(cs, MARKER), has(sc, MARKER)) << "one direction sealed, the other not";
  *notif = has(cs, "notif-KVSEAL");
}

TEST(KvxSeal, RelaySeesNoPlaintextWhenSealed) {
  bool payload = true, notif = true;
  relay_sees(false, &payload, &notif);
  EXPECT_FALSE(payload) << "the payload crossed the relay in the clear";
  EXPECT_FALSE(notif) << "the notification crossed the relay in the clear";
  relay_sees(true, &payload, &notif);
  EXPECT_TRUE(payload) << "encrypt off: the relay should see the payload (else this test cannot fail)";
  EXPECT_TRUE(notif);
}

// One byte flipped by the relay, client to server, inside the WRITE's first record: the receiver refuses the
// record, says why, counts it, delivers no notification; the sender's request fails. A new connection works.
TEST(KvxSeal, FlippedByteToReceiverFailsTheTransfer) {
  const size_t len = 1 << 20;
  Pair p(len);
  ASSERT_TRUE(p.a && p.b);
  fill(p.src.data(), len, 5);
  std::string why;
  {
    Relay r(kvx_agent_port(p.b), Relay::FLIP_CS, 2000);
    char err[256];
    ASSERT_EQ(kvx_set_peer_endpoint(p.a, "b", "127.0.0.1", r.port, err, sizeof err), 0) << err;
    EXPECT_LT(p.xfer(KVX_WRITE, {{p.s(), len}}, {{p.d(), len}}, "must-not-arrive", &why), 0);
  }
  EXPECT_TRUE(has(why, "'b'")) << why;
  EXPECT_TRUE(has(why, "sealed record failed to open")) << why;
  EXPECT_EQ(wait_notifs(p.b, 1, 300).size(), 0u) << "a notification came for an altered write";
  for (int i = 0; i < 100 && kvx_auth_failures(p.b) < 1; i++) usleep(10000);
  EXPECT_EQ(kvx_auth_failures(p.b), 1u);
  EXPECT_TRUE(p.lb.has("closing connection from 'a': a sealed record failed to open")) << p.lb.all();
  char err[256];
  ASSERT_EQ(kvx_set_peer_endpoint(p.a, "b", "127.0.0.1", kvx_agent_port(p.b), err, sizeof err), 0) << err;
  ASSERT_EQ(p.xfer(KVX_WRITE, {{p.s(), len}}, {{p.d(), len}}, "direct"), KVX_DONE);
  EXPECT_EQ(p.src, p.dst);
  EXPECT_EQ(wait_notifs(p.b, 1, 5000), std::vector<std::string>{"direct"});
}

// One byte flipped server to client, in the record that carries the ACK (right after the 80 bytes of greeting and
// reply): the sender's reader refuses it and the request fails with why; the sender counts it.
TEST(KvxSeal, FlippedByteToSenderFailsTheConnection) {
  Pair p(4096);
  ASSERT_TRUE(p.a && p.b);
  std::string why;
  Relay r(kvx_agent_port(p.b), Relay::FLIP_SC, 36 + 44 + 10);
  char err[256];
  ASSERT_EQ(kvx_set_peer_endpoint(p.a, "b", "127.0.0.1", r.port, err, sizeof err), 0) << err;
  EXPECT_LT(p.xfer(KVX_WRITE, {{p.s(), 4096}}, {{p.d(), 4096}}, nullptr, &why), 0);
  EXPECT_TRUE(has(why, "sealed record failed to open")) << why;
  EXPECT_EQ(kvx_auth_failures(p.a), 1u);
  const char *line = "connection to 'b' closed: a sealed record failed to open";  // logged after the requests failed
  for (int i = 0; i < 100 && !p.la.has(line); i++) usleep(10000);
  EXPECT_TRUE(p.la.has(line)) << p.la.all();
}

// A record the relay sends twice (a replay) fails to open: its sequence number is spent. The first copy landed; the
// second kills the connection before the notification behind it.
TEST(KvxSeal, RepeatedRecordIsRefused) {
  const size_t len = 1 << 20;
  Pair p(len);
  ASSERT_TRUE(p.a && p.b);
  fill(p.src.data(), len, 6);
  std::string why;
  {
    // The client's hello: magic, name length, "a", nonce, setting, MAC.
    Relay r(kvx_agent_port(p.b), Relay::DUP_CS, 3, 4 + 2 + 1 + 32 + 1 + 32);
    char err[256];
    ASSERT_EQ(kvx_set_peer_endpoint(p.a, "b", "127.0.0.1", r.port, err, sizeof err), 0) << err;
    EXPECT_LT(p.xfer(KVX_WRITE, {{p.s(), len}}, {{p.d(), len}}, "must-not-arrive", &why), 0);
  }
  EXPECT_TRUE(has(why, "sealed record failed to open")) << why;
  EXPECT_EQ(wait_notifs(p.b, 1, 300).size(), 0u);
  for (int i = 0; i < 100 && kvx_auth_failures(p.b) < 1; i++) usleep(10000);
  EXPECT_EQ(kvx_auth_failures(p.b), 1u);
}

// Sealing on one side, off on the other: refused at the handshake, the error naming both settings, on either side.
TEST(KvxSeal, MismatchedSettingsAreRefused) {
  for (bool a_plain : {false, true}) {
    Pair p(4096, a_plain, !a_plain);
    ASSERT_TRUE(p.a && p.b);
    std::string why;
    EXPECT_LT(p.xfer(KVX_WRITE, {{p.s(), 4096}}, {{p.d(), 4096}}, "x", &why), 0);
    std::string want = std::string("this agent's kvxfer.encrypt is ") + (a_plain ? "off" : "on") + ", the peer's " +
                       (a_plain ? "on" : "off");
    EXPECT_TRUE(has(why, want)) << why;
    for (int i = 0; i < 100 && !p.lb.has("kvxfer encryption differs"); i++) usleep(10000);
    std::string theirs = std::string("this agent's kvxfer.encrypt is ") + (a_plain ? "on" : "off") + ", the peer's " +
                         (a_plain ? "off" : "on");
    EXPECT_TRUE(p.lb.has(theirs)) << p.lb.all();
    EXPECT_EQ(wait_notifs(p.b, 1, 200).size(), 0u);
  }
}

// A peer that greets with version 1's "KVXH" is told apart from a stranger: upgrade it.
TEST(KvxSeal, OlderPeerIsRefusedClearly) {
  Pair p(4096);
  ASSERT_TRUE(p.a && p.b);
  int port = 0, lfd = listen_lo(&port);
  ASSERT_GE(lfd, 0);
  std::thread old([lfd] {
    int c = accept(lfd, nullptr, nullptr);
    uint8_t g[36] = {'K', 'V', 'X', 'H'};
    kvx_fd_send_all(c, g, sizeof g, 1000);
    char sink[256];
    kvx_fd_recv_all(c, sink, 1, 2000, 0);  // until the new agent hangs up
    close(c);
  });
  char err[256];
  ASSERT_EQ(kvx_set_peer_endpoint(p.a, "b", "127.0.0.1", port, err, sizeof err), 0) << err;
  std::string why;
  EXPECT_LT(p.xfer(KVX_WRITE, {{p.s(), 4096}}, {{p.d(), 4096}}, nullptr, &why), 0);
  EXPECT_TRUE(has(why, "older kvxfer (handshake version 1")) << why;
  old.join();
  close(lfd);
}

}  // namespace
