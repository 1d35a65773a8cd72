// tests/ctl/test_hub.cc: the worker control hub (secret proof, hello, events, refusal).
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include <sys/socket.h>
#include <unistd.h>

#include "ctl/frame.h"
#include "ctl/hub.h"
#include "proto/proto.h"
#include "relay.h"
#include "util/crypto.h"

// The proof is HMAC-SHA256 over every field, NUL-separated (docs/protocol.md), and changes with each of them.
TEST(HubAuth, ProofCoversEveryField) {
  char proof[65], other[65];
  ctl_auth_proof("k", "nl", "nc", "router", "w0", "127.0.0.1:7001", proof);
  std::string text = std::string("dserve ctl hello v2") + '\0' + "nl" + '\0' + "nc" + '\0' + "router" + '\0' + "w0" +
                     '\0' + "127.0.0.1:7001";
  const void *parts[1] = {text.data()};
  size_t lens[1] = {text.size()};
  uint8_t mac[32];
  utl_hmac_sha256("k", 1, parts, lens, 1, mac);
  char want[65];
  utl_hex(mac, 32, want);
  EXPECT_STREQ(proof, want);
  const char *f[6] = {"k", "nl", "nc", "router", "w0", "127.0.0.1:7001"};
  for (int i = 0; i < 6; i++) {
    const char *g[6] = {f[0], f[1], f[2], f[3], f[4], f[5]};
    g[i] = "x";
    ctl_auth_proof(g[0], g[1], g[2], g[3], g[4], g[5], other);
    EXPECT_STRNE(proof, other) << "field " << i;
  }
  uint8_t c2l[32], l2c[32];
  ASSERT_EQ(ctl_session_keys("k", "nl", "nc", proof, c2l, l2c), 0);
  EXPECT_NE(memcmp(c2l, l2c, 32), 0);
}

TEST(Hub, HelloThenMessagesThenClose) {
  char err[256];
  ctl_hub_opts so = {};
  so.name = "w0";
  so.role = "both";
  so.secret = "s3cret";
  so.host = "127.0.0.1";
  so.hello_extra = [](void *, cJSON *ok) { cJSON_AddNumberToObject(ok, "n_ctx", 8192); };
  ctl_hub *server = nullptr, *client = nullptr;
  ASSERT_EQ(ctl_hub_new(&so, &server, err, sizeof err), 0) << err;
  ctl_hub_opts co = {};
  co.name = "router";
  co.role = "router";
  co.secret = "s3cret";
  ASSERT_EQ(ctl_hub_new(&co, &client, err, sizeof err), 0) << err;
  ctl_peer *p = ctl_hub_connect(client, "w0", "127.0.0.1", ctl_hub_port(server), 2000, err, sizeof err);
  ASSERT_NE(p, nullptr) << err;
  EXPECT_STREQ(ctl_peer_name(p), "w0");
  EXPECT_EQ(cJSON_GetObjectItem(ctl_peer_hello(p), "n_ctx")->valueint, 8192);

  ctl_event ev;
  ASSERT_EQ(ctl_hub_next(server, &ev, 2000), 1);
  EXPECT_STREQ(cJSON_GetObjectItem(ev.msg, "op")->valuestring, "hello");
  EXPECT_STREQ(ctl_peer_name(ev.peer), "router");
  ctl_peer *back = ev.peer;
  ctl_peer_ref(back);
  ctl_event_done(&ev);

  cJSON *m = cJSON_Parse("{\"op\":\"generate\",\"id\":\"r1\"}");
  ASSERT_EQ(ctl_peer_send(p, m), 0);
  cJSON_Delete(m);
  ASSERT_EQ(ctl_hub_next(server, &ev, 2000), 1);
  EXPECT_STREQ(cJSON_GetObjectItem(ev.msg, "id")->valuestring, "r1");
  ctl_event_done(&ev);

  m = cJSON_Parse("{\"op\":\"token\",\"id\":\"r1\"}");
  ASSERT_EQ(ctl_peer_send(back, m), 0);
  cJSON_Delete(m);
  ASSERT_EQ(ctl_hub_next(client, &ev, 2000), 1);
  EXPECT_STREQ(cJSON_GetObjectItem(ev.msg, "op")->valuestring, "token");
  ctl_event_done(&ev);

  ctl_peer_close(p);
  ASSERT_EQ(ctl_hub_next(server, &ev, 2000), 1);
  EXPECT_EQ(ev.msg, nullptr); // closed
  EXPECT_EQ(ev.peer, back);
  EXPECT_FALSE(ctl_peer_alive(back));
  ctl_event_done(&ev);
  EXPECT_EQ(ctl_hub_next(server, &ev, 0), 0);
  ctl_peer_unref(back);
  ctl_peer_unref(p);
  ctl_hub_free(client);
  ctl_hub_free(server);
}

TEST(Hub, WrongSecretIsRefused) {
  char err[256];
  ctl_hub_opts so = {};
  so.name = "w0";
  so.role = "both";
  so.secret = "right";
  so.host = "127.0.0.1";
  ctl_hub *server = nullptr, *client = nullptr;
  ASSERT_EQ(ctl_hub_new(&so, &server, err, sizeof err), 0) << err;
  ctl_hub_opts co = {};
  co.name = "stranger";
  co.role = "router";
  co.secret = "wrong";
  ASSERT_EQ(ctl_hub_new(&co, &client, err, sizeof err), 0) << err;
  EXPECT_EQ(ctl_hub_connect(client, "w0", "127.0.0.1", ctl_hub_port(server), 2000, err, sizeof err), nullptr);
  EXPECT_EQ(ctl_hub_auth_failures(client), 1); // the other side refused our hello
  ctl_hub_free(client);
  ctl_event ev;
  EXPECT_EQ(ctl_hub_next(server, &ev, 200), 0); // no hello ever reached the loop
  EXPECT_EQ(ctl_hub_auth_failures(server), 1);
  ctl_hub_free(server);
}

// A hub never runs without a secret: there is no unauthenticated mode to fall into.
TEST(Hub, NoSecretNoHub) {
  char err[256];
  for (const char *secret : {"", (const char *)nullptr}) {
    for (const char *host : {"127.0.0.1", (const char *)nullptr}) {
      ctl_hub_opts o = {};
      o.name = "w0";
      o.role = "both";
      o.secret = secret;
      o.host = host;
      ctl_hub *h = nullptr;
      EXPECT_EQ(ctl_hub_new(&o, &h, err, sizeof err), -1);
      EXPECT_EQ(h, nullptr);
      EXPECT_NE(std::string(err).find("without a shared secret"), std::string::npos) << err;
    }
  }
}

// Raw peers (what an attacker on the host sends): a hello without auth, with a wrong proof, with an empty-key proof,
// another op first, a hello whose "op" an "OP" member shadows for a case-insensitive lookup. Each gets the challenge
// and then a closed connection, never a hello_ok (which carries the KV layout and kvxfer metadata), and each is
// counted.
TEST(Hub, RawHellosWithoutTheProofGetNoHelloOk) {
  char err[256];
  ctl_hub_opts so = {};
  so.name = "w0";
  so.role = "decode";
  so.secret = "the-right-cluster-secret";
  so.host = "127.0.0.1";
  so.hello_extra = [](void *, cJSON *ok) { cJSON_AddStringToObject(ok, "kvx_md", "secret-metadata"); };
  ctl_hub *server = nullptr;
  ASSERT_EQ(ctl_hub_new(&so, &server, err, sizeof err), 0) << err;
  enum { NO_AUTH, WRONG, EMPTY_KEY, OTHER_OP, SHADOWED_OP };
  for (int kind : {NO_AUTH, WRONG, EMPTY_KEY, OTHER_OP, SHADOWED_OP}) {
    int fd = ctl_frame_connect("127.0.0.1", ctl_hub_port(server), 2000, err, sizeof err);
    ASSERT_GE(fd, 0) << err;
    ctl_frame *c = ctl_frame_new(fd);
    cJSON *ch = nullptr;
    ASSERT_EQ(ctl_frame_recv(c, &ch, 2000, err, sizeof err), 1) << err;
    EXPECT_STREQ(cJSON_GetObjectItem(ch, "op")->valuestring, "challenge");
    const char *nonce = cJSON_GetObjectItem(ch, "nonce")->valuestring;
    cJSON *m = cJSON_CreateObject();
    if (kind == SHADOWED_OP) cJSON_AddNumberToObject(m, "OP", 1); // the hub read this one's NULL string and crashed
    cJSON_AddStringToObject(m, "op", kind == OTHER_OP ? "generate" : "hello");
    cJSON_AddStringToObject(m, "name", "intruder");
    cJSON_AddStringToObject(m, "role", "router");
    cJSON_AddStringToObject(m, "nonce", "00112233445566778899aabbccddeeff");
    cJSON_AddStringToObject(m, "member", "w0");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ctl_hub_port(server));
    cJSON_AddStringToObject(m, "addr", addr);
    cJSON_AddNumberToObject(m, "proto", PRT_VERSION);
    char proof[65];
    const char *nc = "00112233445566778899aabbccddeeff";
    if (kind == WRONG) ctl_auth_proof("a-guessed-cluster-secret", nonce, nc, "intruder", "w0", addr, proof);
    if (kind == EMPTY_KEY) ctl_auth_proof("", nonce, nc, "intruder", "w0", addr, proof);
    if (kind == WRONG || kind == EMPTY_KEY) cJSON_AddStringToObject(m, "auth", proof);
    ASSERT_EQ(ctl_frame_send(c, m), 0);
    cJSON_Delete(m);
    cJSON_Delete(ch);
    cJSON *reply = nullptr;
    EXPECT_EQ(ctl_frame_recv(c, &reply, 3000, err, sizeof err), -1) << "kind " << kind << " got a reply";
    cJSON_Delete(reply);
    ctl_frame_free(c);
    EXPECT_EQ(ctl_hub_auth_failures(server), kind + 1);
  }
  ctl_event ev;
  EXPECT_EQ(ctl_hub_next(server, &ev, 100), 0);
  ctl_hub_free(server);
}

// A hello of another protocol version, or none, gets an error naming both versions (before its proof is read: another
// version proves the secret another way), then the connection closes; it is not counted as an authentication failure.
TEST(Hub, OtherProtocolVersionIsRefused) {
  char err[256];
  ctl_hub_opts so = {};
  so.name = "w0";
  so.role = "decode";
  so.secret = "the-cluster-secret";
  so.host = "127.0.0.1";
  ctl_hub *server = nullptr;
  ASSERT_EQ(ctl_hub_new(&so, &server, err, sizeof err), 0) << err;
  // a newer peer, an older one (version 2: before `tokens`, whose token-at-a-time messages a router no longer needs
  // to be the only kind), none
  static_assert(PRT_VERSION == 3, "version 3 batches a step's tokens (docs/protocol.md)");
  for (int version : {PRT_VERSION + 1, 2, -1}) {
    int fd = ctl_frame_connect("127.0.0.1", ctl_hub_port(server), 2000, err, sizeof err);
    ASSERT_GE(fd, 0) << err;
    ctl_frame *c = ctl_frame_new(fd);
    cJSON *ch = nullptr;
    ASSERT_EQ(ctl_frame_recv(c, &ch, 2000, err, sizeof err), 1) << err;
    const char *proof = "an old version's proof: HMAC over the nonce alone";
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "op", PRT_OP_HELLO);
    cJSON_AddStringToObject(m, "name", "r-old");
    cJSON_AddStringToObject(m, "role", "router");
    cJSON_AddStringToObject(m, "auth", proof);
    if (version >= 0) cJSON_AddNumberToObject(m, "proto", version);
    ASSERT_EQ(ctl_frame_send(c, m), 0);
    cJSON_Delete(m);
    cJSON_Delete(ch);
    cJSON *reply = nullptr;
    ASSERT_EQ(ctl_frame_recv(c, &reply, 3000, err, sizeof err), 1) << err;
    EXPECT_STREQ(cJSON_GetObjectItem(reply, "op")->valuestring, PRT_OP_ERROR);
    std::string why = cJSON_GetObjectItem(reply, "message")->valuestring;
    EXPECT_NE(why.find("version " + std::to_string(PRT_VERSION)), std::string::npos) << why;
    if (version >= 0) EXPECT_NE(why.find("version " + std::to_string(version)), std::string::npos) << why;
    else EXPECT_NE(why.find("without a protocol version"), std::string::npos) << why;
    cJSON_Delete(reply);
    reply = nullptr;
    EXPECT_EQ(ctl_frame_recv(c, &reply, 3000, err, sizeof err), -1);
    cJSON_Delete(reply);
    ctl_frame_free(c);
  }
  EXPECT_EQ(ctl_hub_auth_failures(server), 0);
  ctl_event ev;
  EXPECT_EQ(ctl_hub_next(server, &ev, 100), 0);
  ctl_hub_free(server);
}

// A listener met through a hint (an address from etcd) proves the secret back: a connector refuses a hello_ok without
// the proof over its own nonce, with a wrong one, with one of its own connector proofs replayed, and one that is not
// sealed with the link's keys (a listener that does not know the secret cannot seal); the right one links (what a
// real hub answers: HelloThenMessagesThenClose).
TEST(Hub, ListenerMustProveTheSecretBack) {
  char err[256];
  int lport = 0;
  int lfd = ctl_frame_listen("127.0.0.1", 0, &lport, err, sizeof err);
  ASSERT_GE(lfd, 0) << err;
  ctl_hub_opts co = {};
  co.name = "router";
  co.role = "router";
  co.secret = "the-cluster-secret";
  ctl_hub *client = nullptr;
  ASSERT_EQ(ctl_hub_new(&co, &client, err, sizeof err), 0) << err;
  enum { NONE, WRONG, REPLAYED, UNSEALED, RIGHT };
  const char *nonce_l = "0123456789abcdef0123456789abcdef";
  for (int kind : {NONE, WRONG, REPLAYED, UNSEALED, RIGHT}) {
    std::thread rogue([&] { // accepts, challenges, reads the hello, answers hello_ok as kind says
      int fd = accept(lfd, nullptr, nullptr);
      ctl_frame *c = ctl_frame_new(fd);
      cJSON *ch = cJSON_CreateObject();
      cJSON_AddStringToObject(ch, "op", "challenge");
      cJSON_AddStringToObject(ch, "nonce", nonce_l);
      EXPECT_EQ(ctl_frame_send(c, ch), 0);
      cJSON_Delete(ch);
      cJSON *hello = nullptr;
      char e[256];
      ASSERT_EQ(ctl_frame_recv(c, &hello, 3000, e, sizeof e), 1) << e;
      const cJSON *n = cJSON_GetObjectItem(hello, "nonce");
      ASSERT_TRUE(cJSON_IsString(n)) << "the connector asks for a proof back";
      EXPECT_STREQ(cJSON_GetObjectItem(hello, "member")->valuestring, "w-rogue");
      char proof[65];
      if (kind == WRONG) ctl_auth_proof_back("a-guessed-secret", n->valuestring, proof);
      if (kind == REPLAYED) snprintf(proof, sizeof proof, "%s", cJSON_GetObjectItem(hello, "auth")->valuestring);
      if (kind == RIGHT || kind == UNSEALED) ctl_auth_proof_back("the-cluster-secret", n->valuestring, proof);
      if (kind != UNSEALED) {
        uint8_t c2l[32], l2c[32];
        ASSERT_EQ(ctl_session_keys("the-cluster-secret", nonce_l, n->valuestring,
                                   cJSON_GetObjectItem(hello, "auth")->valuestring, c2l, l2c), 0);
        ASSERT_EQ(ctl_frame_seal(c, l2c, CTL_LABEL_L2C, c2l, CTL_LABEL_C2L), 0);
      }
      cJSON *ok = cJSON_CreateObject();
      cJSON_AddStringToObject(ok, "op", "hello_ok");
      cJSON_AddStringToObject(ok, "name", "w-rogue");
      if (kind != NONE) cJSON_AddStringToObject(ok, "auth", proof);
      EXPECT_EQ(ctl_frame_send(c, ok), 0);
      cJSON_Delete(ok);
      cJSON_Delete(hello);
      cJSON *more = nullptr;
      // The refused connection closes (or, RIGHT, nothing more comes): whichever, what the hub did is checked below.
      utl_ignore_status(ctl_frame_recv(c, &more, kind == RIGHT ? 200 : 3000, e, sizeof e));
      cJSON_Delete(more);
      ctl_frame_free(c);
    });
    ctl_peer *p = ctl_hub_connect(client, "w-rogue", "127.0.0.1", lport, 3000, err, sizeof err);
    if (kind == RIGHT) {
      EXPECT_NE(p, nullptr) << err;
      ctl_peer_close(p);
      ctl_peer_unref(p);
    } else {
      EXPECT_EQ(p, nullptr) << "kind " << kind;
      EXPECT_NE(std::string(err).find(kind == UNSEALED ? "failed to open" : "proof of the shared secret"),
                std::string::npos) << err;
    }
    rogue.join();
  }
  EXPECT_EQ(ctl_hub_auth_failures(client), 4);
  close(lfd);
  ctl_hub_free(client);
}

namespace {
struct TwoHubs {
  ctl_hub *server = nullptr, *client = nullptr;
  TwoHubs() {
    char err[256];
    ctl_hub_opts so = {};
    so.name = "w0";
    so.role = "decode";
    so.secret = "the-cluster-secret";
    so.host = "127.0.0.1";
    so.hello_extra = [](void *, cJSON *ok) { cJSON_AddStringToObject(ok, "kvx_md", "the-kvxfer-metadata"); };
    EXPECT_EQ(ctl_hub_new(&so, &server, err, sizeof err), 0) << err;
    ctl_hub_opts co = {};
    co.name = "router";
    co.role = "router";
    co.secret = "the-cluster-secret";
    EXPECT_EQ(ctl_hub_new(&co, &client, err, sizeof err), 0) << err;
  }
  ~TwoHubs() {
    ctl_hub_free(client);
    ctl_hub_free(server);
  }
};
} // namespace

// The connector dialled another member than the one that answers (an etcd record whose name is not the process's):
// refused, both sides saying what was dialled and what answered; no hello reaches the listener's loop.
TEST(Hub, AnotherMembersNameIsRefused) {
  TwoHubs t;
  char err[256];
  EXPECT_EQ(ctl_hub_connect(t.client, "evil", "127.0.0.1", ctl_hub_port(t.server), 2000, err, sizeof err), nullptr);
  std::string e = err;
  EXPECT_NE(e.find("dialled member 'evil'"), std::string::npos) << e;
  EXPECT_NE(e.find("this is 'w0'"), std::string::npos) << e;
  ctl_event ev;
  EXPECT_EQ(ctl_hub_next(t.server, &ev, 100), 0);
  EXPECT_EQ(ctl_hub_auth_failures(t.server), 1);
  EXPECT_EQ(ctl_hub_connect(t.client, "", "127.0.0.1", ctl_hub_port(t.server), 2000, err, sizeof err), nullptr);
}

// A relay that knows no secret forwards bytes to a live member (issue 39: a copied etcd record under a new name and
// port). Dialled under the new name, or under the member's own name at the relay's address: refused either way, and
// the relay saw nothing of the hello_ok (kvxfer metadata) nor any message after the hello.
TEST(Hub, RelayIsRefusedAndReadsNothing) {
  for (const char *member : {"evil", "w0"}) {
    TwoHubs t;
    Relay relay(ctl_hub_port(t.server));
    relay.start();
    char err[256];
    EXPECT_EQ(ctl_hub_connect(t.client, member, "127.0.0.1", relay.port, 2000, err, sizeof err), nullptr) << member;
    std::string e = err;
    EXPECT_NE(e.find("a relay"), std::string::npos) << e;
    EXPECT_NE(e.find(std::string("dialled member '") + member + "' at 127.0.0.1:" + std::to_string(relay.port)),
              std::string::npos) << e;
    ctl_event ev;
    EXPECT_EQ(ctl_hub_next(t.server, &ev, 100), 0);
    std::string seen = relay.seen();
    EXPECT_NE(seen.find("\"challenge\""), std::string::npos); // it did relay the handshake
    EXPECT_EQ(seen.find("the-kvxfer-metadata"), std::string::npos);
    EXPECT_EQ(seen.find("hello_ok"), std::string::npos);
    EXPECT_EQ(seen.find("a relay"), std::string::npos); // even the refusal is sealed
  }
}

TEST(Hub, ConstantTimeCompare) {
  EXPECT_TRUE(ctl_consttime_eq("abc", "abc"));
  EXPECT_FALSE(ctl_consttime_eq("abc", "abd"));
  EXPECT_FALSE(ctl_consttime_eq("abc", "abcd"));
  EXPECT_TRUE(ctl_consttime_eq("", ""));
}
