// tests/ctl/test_frame.cc: control-protocol framing over loopback sockets.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "ctl/frame.h"

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
