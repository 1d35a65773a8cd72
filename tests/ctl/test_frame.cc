// tests/ctl/test_frame.cc: control-protocol framing over loopback sockets.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>

#include "ctl/frame.h"
#include "relay.h"

namespace {

struct Pair {
  ctl_frame *a = nullptr, *b = nullptr;
  Pair() {
    char err[256];
    int port = 0;
    int lfd = ctl_frame_listen("127.0.0.1", 0, &port, err, sizeof err);
    EXPECT_GE(lfd, 0) << err;
    int cfd = ctl_frame_connect("127.0.0.1", port, 1000, err, sizeof err);
    EXPECT_GE(cfd, 0) << err;
    int sfd = accept(lfd, nullptr, nullptr);
    close(lfd);
    a = ctl_frame_new(cfd);
    b = ctl_frame_new(sfd);
  }
  ~Pair() {
    ctl_frame_free(a);
    ctl_frame_free(b);
  }
};

} // namespace

TEST(Ctl, MessagesArriveWholeAndInOrder) {
  Pair p;
  std::thread t([&] {
    for (int i = 0; i < 200; i++) {
      cJSON *m = cJSON_CreateObject();
      cJSON_AddStringToObject(m, "op", "token");
      cJSON_AddNumberToObject(m, "i", i);
      cJSON_AddStringToObject(m, "pad", std::string((size_t)i * 97, 'x').c_str());
      EXPECT_EQ(ctl_frame_send(p.a, m), 0);
      cJSON_Delete(m);
    }
  });
  char err[256];
  for (int i = 0; i < 200; i++) {
    cJSON *m = nullptr;
    ASSERT_EQ(ctl_frame_recv(p.b, &m, 5000, err, sizeof err), 1) << err;
    EXPECT_EQ(cJSON_GetObjectItem(m, "i")->valueint, i);
    EXPECT_EQ(strlen(cJSON_GetObjectItem(m, "pad")->valuestring), (size_t)i * 97);
    cJSON_Delete(m);
  }
  t.join();
}

TEST(Ctl, TimeoutThenClose) {
  Pair p;
  char err[256];
  cJSON *m = nullptr;
  EXPECT_EQ(ctl_frame_recv(p.b, &m, 50, err, sizeof err), 0);
  ctl_frame_free(p.a);
  p.a = nullptr;
  EXPECT_EQ(ctl_frame_recv(p.b, &m, 1000, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("closed"), std::string::npos) << err;
}

TEST(Ctl, RefusesOversizedAndMalformedFrames) {
  char err[256];
  {
    Pair p;
    uint8_t big[4] = {0xff, 0xff, 0xff, 0xff};
    ASSERT_EQ(write(ctl_frame_fd(p.a), big, 4), 4);
    cJSON *m = nullptr;
    EXPECT_EQ(ctl_frame_recv(p.b, &m, 1000, err, sizeof err), -1);
    EXPECT_NE(std::string(err).find("limit"), std::string::npos) << err;
  }
  for (const char *bad : {"{\"op\":", "[1,2]", "{\"op\":3}", "{\"no\":\"op\"}"}) {
    Pair p;
    uint32_t n = htonl((uint32_t)strlen(bad));
    ASSERT_EQ(write(ctl_frame_fd(p.a), &n, 4), 4);
    ASSERT_EQ(write(ctl_frame_fd(p.a), bad, strlen(bad)), (ssize_t)strlen(bad));
    cJSON *m = nullptr;
    EXPECT_EQ(ctl_frame_recv(p.b, &m, 1000, err, sizeof err), -1) << bad;
    EXPECT_EQ(m, nullptr);
  }
}

TEST(Ctl, ConnectErrorsAreReported) {
  char err[256];
  int port = 0;
  int lfd = ctl_frame_listen("127.0.0.1", 0, &port, err, sizeof err);
  close(lfd); // nobody listens there now
  EXPECT_EQ(ctl_frame_connect("127.0.0.1", port, 500, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("connect"), std::string::npos);
  EXPECT_EQ(ctl_frame_listen("127.0.0.1", 70000, nullptr, err, sizeof err), -1);
  EXPECT_EQ(ctl_frame_connect("no.such.host.invalid", 1, 500, err, sizeof err), -1);
}

namespace {

// A sealed pair a -> b through a relay: a is the connector (sends under c2l), b the listener.
struct SealedPair {
  ctl_frame *a = nullptr, *b = nullptr;
  Relay *relay = nullptr;
  explicit SealedPair(std::function<void(std::string &, size_t)> tamper = nullptr) {
    char err[256];
    int port = 0;
    int lfd = ctl_frame_listen("127.0.0.1", 0, &port, err, sizeof err);
    relay = new Relay(port);
    relay->tamper_up = tamper;
    relay->start();
    int cfd = ctl_frame_connect("127.0.0.1", relay->port, 1000, err, sizeof err);
    int sfd = accept(lfd, nullptr, nullptr);
    close(lfd);
    a = ctl_frame_new(cfd);
    b = ctl_frame_new(sfd);
    uint8_t c2l[32], l2c[32];
    for (int i = 0; i < 32; i++) c2l[i] = (uint8_t)i, l2c[i] = (uint8_t)(100 + i);
    EXPECT_EQ(ctl_frame_seal(a, c2l, "ctlC", l2c, "ctlL"), 0);
    EXPECT_EQ(ctl_frame_seal(b, l2c, "ctlL", c2l, "ctlC"), 0);
  }
  ~SealedPair() {
    ctl_frame_free(a);
    ctl_frame_free(b);
    delete relay;
  }
};

cJSON *msg(const char *op, const char *text) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "op", op);
  cJSON_AddStringToObject(m, "prompt", text);
  return m;
}

} // namespace

// Sealed frames arrive whole and in order both ways, and the path sees none of their text.
TEST(CtlSeal, FramesArriveAndThePathReadsNothing) {
  SealedPair p;
  char err[256];
  for (int i = 0; i < 50; i++) {
    cJSON *m = msg("generate", ("the-secret-prompt-" + std::to_string(i) + std::string((size_t)i * 301, 'q')).c_str());
    ASSERT_EQ(ctl_frame_send(p.a, m), 0);
    cJSON_Delete(m);
    cJSON *r = nullptr;
    ASSERT_EQ(ctl_frame_recv(p.b, &r, 5000, err, sizeof err), 1) << err;
    EXPECT_EQ(std::string(cJSON_GetObjectItem(r, "prompt")->valuestring).rfind("the-secret-prompt-" + std::to_string(i), 0), 0u);
    cJSON_Delete(r);
    m = msg("token", "the-generated-answer");
    ASSERT_EQ(ctl_frame_send(p.b, m), 0);
    cJSON_Delete(m);
    ASSERT_EQ(ctl_frame_recv(p.a, &r, 5000, err, sizeof err), 1) << err;
    EXPECT_STREQ(cJSON_GetObjectItem(r, "prompt")->valuestring, "the-generated-answer");
    cJSON_Delete(r);
  }
  EXPECT_TRUE(ctl_frame_sealed(p.a) && ctl_frame_sealed(p.b));
  std::string seen = p.relay->seen();
  EXPECT_GT(seen.size(), 50u * 300u);
  EXPECT_EQ(seen.find("secret-prompt"), std::string::npos);
  EXPECT_EQ(seen.find("generated-answer"), std::string::npos);
  EXPECT_EQ(seen.find("\"op\""), std::string::npos);
}

// One changed byte anywhere in a sealed frame (its length, its ciphertext, its tag): the frame does not open and
// the connection is dead; nothing of it is read.
TEST(CtlSeal, ChangedByteClosesTheLink) {
  for (size_t at : {3ul, 10ul, 40ul}) { // the length prefix, the ciphertext, the tag of the 53-byte first frame
    SealedPair p([at](std::string &chunk, size_t off) {
      if (at >= off && at < off + chunk.size()) chunk[at - off] ^= at == 3 ? 0x10 : 0x01; // a shorter length
    });
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "op", "generate");
    cJSON_AddStringToObject(m, "p", "abcdefghij"); // {"op":"generate","p":"abcdefghij"}: 33 bytes + 16-byte tag
    ASSERT_EQ(ctl_frame_send(p.a, m), 0);
    cJSON_Delete(m);
    char err[256] = "";
    cJSON *r = nullptr;
    EXPECT_EQ(ctl_frame_recv(p.b, &r, 2000, err, sizeof err), -1) << "byte " << at;
    EXPECT_EQ(r, nullptr);
    EXPECT_NE(std::string(err).find(CTL_FRAME_UNSEALED), std::string::npos) << err;
  }
}

// A frame repeated, or two frames swapped, by the path: the second copy (or the early one) does not open.
TEST(CtlSeal, RepeatedOrReorderedFrameClosesTheLink) {
  for (int kind : {0, 1}) { // 0: the first frame sent twice; 1: the first two frames swapped
    std::string pending;     // the up stream cut into whole frames here, whatever chunks TCP made
    int frames = 0;
    std::string first;
    SealedPair p([&](std::string &chunk, size_t) {
      pending += chunk;
      chunk.clear();
      while (pending.size() >= 4) {
        size_t n = (size_t)(uint8_t)pending[0] << 24 | (size_t)(uint8_t)pending[1] << 16 |
                   (size_t)(uint8_t)pending[2] << 8 | (uint8_t)pending[3];
        if (pending.size() < 4 + n) break;
        std::string f = pending.substr(0, 4 + n);
        pending.erase(0, 4 + n);
        frames++;
        if (kind == 0) chunk += frames == 1 ? f + f : f;
        else if (frames == 1) first = f;
        else chunk += frames == 2 ? f + first : f;
      }
    });
    char err[256] = "";
    cJSON *r = nullptr;
    for (int i = 0; i < 2; i++) {
      cJSON *m = msg("generate", std::to_string(i).c_str());
      ASSERT_EQ(ctl_frame_send(p.a, m), 0);
      cJSON_Delete(m);
    }
    if (kind == 0) {
      ASSERT_EQ(ctl_frame_recv(p.b, &r, 2000, err, sizeof err), 1) << err;
      cJSON_Delete(r);
      r = nullptr;
    }
    EXPECT_EQ(ctl_frame_recv(p.b, &r, 5000, err, sizeof err), -1) << "kind " << kind;
    EXPECT_EQ(r, nullptr);
    EXPECT_NE(std::string(err).find(CTL_FRAME_UNSEALED), std::string::npos) << err;
  }
}
