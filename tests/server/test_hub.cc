// tests/server/test_hub.cc: the worker control hub (secret proof, hello, events, refusal).
#include <gtest/gtest.h>

#include <string>

#include "server/hub.h"

TEST(HubAuth, ProofIsHmacSha256OfTheNonce) {
  // RFC 4231 test case 2: HMAC-SHA256("Jefe", "what do ya want for nothing?")
  char proof[65];
  srv_auth_proof("Jefe", "what do ya want for nothing?", proof);
  EXPECT_STREQ(proof, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Hub, HelloThenMessagesThenClose) {
  char err[256];
  srv_hub_opts so = {};
  so.name = "w0";
  so.role = "both";
  so.secret = "s3cret";
  so.host = "127.0.0.1";
  so.hello_extra = [](void *, cJSON *ok) { cJSON_AddNumberToObject(ok, "n_ctx", 8192); };
  srv_hub *server = nullptr, *client = nullptr;
  ASSERT_EQ(srv_hub_new(&so, &server, err, sizeof err), 0) << err;
  srv_hub_opts co = {};
  co.name = "router";
  co.role = "router";
  co.secret = "s3cret";
  ASSERT_EQ(srv_hub_new(&co, &client, err, sizeof err), 0) << err;
  srv_peer *p = srv_hub_connect(client, "127.0.0.1", srv_hub_port(server), 2000, err, sizeof err);
  ASSERT_NE(p, nullptr) << err;
  EXPECT_STREQ(srv_peer_name(p), "w0");
  EXPECT_EQ(cJSON_GetObjectItem(srv_peer_hello(p), "n_ctx")->valueint, 8192);

  srv_event ev;
  ASSERT_EQ(srv_hub_next(server, &ev, 2000), 1);
  EXPECT_STREQ(cJSON_GetObjectItem(ev.msg, "op")->valuestring, "hello");
  EXPECT_STREQ(srv_peer_name(ev.peer), "router");
  srv_peer *back = ev.peer;
  srv_peer_ref(back);
  srv_event_done(&ev);

  cJSON *m = cJSON_Parse("{\"op\":\"generate\",\"id\":\"r1\"}");
  ASSERT_EQ(srv_peer_send(p, m), 0);
  cJSON_Delete(m);
  ASSERT_EQ(srv_hub_next(server, &ev, 2000), 1);
  EXPECT_STREQ(cJSON_GetObjectItem(ev.msg, "id")->valuestring, "r1");
  srv_event_done(&ev);

  m = cJSON_Parse("{\"op\":\"token\",\"id\":\"r1\"}");
  ASSERT_EQ(srv_peer_send(back, m), 0);
  cJSON_Delete(m);
  ASSERT_EQ(srv_hub_next(client, &ev, 2000), 1);
  EXPECT_STREQ(cJSON_GetObjectItem(ev.msg, "op")->valuestring, "token");
  srv_event_done(&ev);

  srv_peer_close(p);
  ASSERT_EQ(srv_hub_next(server, &ev, 2000), 1);
  EXPECT_EQ(ev.msg, nullptr); // closed
  EXPECT_EQ(ev.peer, back);
  EXPECT_FALSE(srv_peer_alive(back));
  srv_event_done(&ev);
  EXPECT_EQ(srv_hub_next(server, &ev, 0), 0);
  srv_peer_unref(back);
  srv_peer_unref(p);
  srv_hub_free(client);
  srv_hub_free(server);
}

TEST(Hub, WrongSecretIsRefused) {
  char err[256];
  srv_hub_opts so = {};
  so.name = "w0";
  so.role = "both";
  so.secret = "right";
  so.host = "127.0.0.1";
  srv_hub *server = nullptr, *client = nullptr;
  ASSERT_EQ(srv_hub_new(&so, &server, err, sizeof err), 0) << err;
  for (const char *secret : {"wrong", ""}) {
    srv_hub_opts co = {};
    co.name = "stranger";
    co.role = "router";
    co.secret = secret;
    ASSERT_EQ(srv_hub_new(&co, &client, err, sizeof err), 0) << err;
    EXPECT_EQ(srv_hub_connect(client, "127.0.0.1", srv_hub_port(server), 2000, err, sizeof err), nullptr);
    srv_hub_free(client);
  }
  srv_event ev;
  EXPECT_EQ(srv_hub_next(server, &ev, 200), 0); // no hello ever reached the loop
  srv_hub_free(server);
}

TEST(Hub, ConstantTimeCompare) {
  EXPECT_TRUE(srv_consttime_eq("abc", "abc"));
  EXPECT_FALSE(srv_consttime_eq("abc", "abd"));
  EXPECT_FALSE(srv_consttime_eq("abc", "abcd"));
  EXPECT_TRUE(srv_consttime_eq("", ""));
}
