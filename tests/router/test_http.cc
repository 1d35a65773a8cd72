// tests/router/test_http.cc: the router over real HTTP against a fake worker speaking the control protocol.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/router/http_util.h"

namespace {

using namespace std::chrono_literals;
using namespace httptest;

// /health and /ready are readiness: 503 with the reason while no worker can finish a generation (issue 29: a prefill
// worker alone up made /health say ok while every request got 503 no_worker); /live is liveness, always 200 and
// open even with API keys.
TEST(Http, HealthSaysWhetherAGenerationCanBeServed) {
  TinyModel m;
  {
    FakeWorker pw("prefill");
    Router r(m, pw.port(), 16, 64, {"sekrit"}, 10, [](cfg_cluster &c) { c.workers[0].role = CFG_ROLE_PREFILL; });
    ASSERT_TRUE(r.wait_up());
    for (const char *path : {"/health", "/ready"}) {
      Resp h = request(r.port(), "GET", path, "");
      EXPECT_EQ(h.status, 503) << path;
      EXPECT_NE(h.body.find("\"workers_up\":1"), std::string::npos) << h.body;
      EXPECT_NE(h.body.find("\"serving_workers\":0"), std::string::npos) << h.body;
      EXPECT_NE(h.body.find("no decode or both worker is up"), std::string::npos) << h.body;
    }
    Resp l = request(r.port(), "GET", "/live", "");
    EXPECT_EQ(l.status, 200);
    EXPECT_EQ(l.body, "{\"status\":\"alive\"}");
  }
  FakeWorker fw;
  Router r(m, fw.port());
  ASSERT_TRUE(r.wait_up());
  for (const char *path : {"/health", "/ready"}) {
    Resp h = request(r.port(), "GET", path, "");
    EXPECT_EQ(h.status, 200) << path;
    EXPECT_EQ(h.body, "{\"status\":\"ok\",\"workers_up\":1,\"serving_workers\":1}") << path;
  }
  EXPECT_EQ(request(r.port(), "GET", "/live", "").status, 200);
}

TEST(Http, NoWorker503) {
  TinyModel m;
  int dead_port;
  { // a port nobody listens on
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (sockaddr *)&a, sizeof a);
    socklen_t l = sizeof a;
    getsockname(fd, (sockaddr *)&a, &l);
    dead_port = ntohs(a.sin_port);
    close(fd);
  }
  Router r(m, dead_port);
  Resp h = request(r.port(), "GET", "/health", "");
  EXPECT_EQ(h.status, 503);
  expect_error(request(r.port(), "POST", "/v1/chat/completions", CHAT + "}"), 503);
  // /v1/models and tokenize do not need a worker
  EXPECT_EQ(request(r.port(), "GET", "/v1/models", "").status, 200);
  EXPECT_EQ(request(r.port(), "POST", "/tokenize", R"({"prompt":"abc"})").status, 200);
}

// No chat template and no ChatML tokens (a base model such as Gemma 3 270M): chat requests are refused with a 400
// naming /v1/completions instead of rendered as ChatML the model cannot read; completions and tokenize still work.
TEST(Http, ModelWithoutAChatTemplateRefusesChat) {
  TinyModel m(false);
  Router r(m, 1); // no worker needed: the refusal comes before routing
  Resp c = request(r.port(), "POST", "/v1/chat/completions", CHAT + "}");
  expect_error(c, 400, "model_not_chat");
  EXPECT_NE(c.body.find("/v1/completions"), std::string::npos) << c.body;
  expect_error(request(r.port(), "POST", "/tokenize", R"({"messages":[{"role":"user","content":"hi"}]})"), 400,
               "model_not_chat");
  EXPECT_EQ(request(r.port(), "POST", "/tokenize", R"({"prompt":"abc"})").status, 200);
}

// A model whose template is Gemma's: chats render in Gemma's markup (system folded into the user turn, "model"),
// with BOS in front as the vocabulary asks (llama-server's tokenization of a rendered chat); tools have no convention
// in this family and are refused, not rendered in another family's.
// Gemma 2's shape of template: bos_token, a raise_exception on a system turn, trimmed contents.
const char *GEMMA_TPL =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] | trim"
    " + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

// The GGUF's template runs as Jinja: its text, one BOS (the template's bos text cut: the vocabulary adds BOS), the
// template's raise_exception a 400 with its message, tools it never reads a 400.
TEST(Http, GgufTemplateRunsAsJinja) {
  TinyModel m(false, GEMMA_TPL, {"<start_of_turn>", "<end_of_turn>", "<bos>"}, 261);
  Router r(m, 1);
  Resp t = request(r.port(), "POST", "/tokenize", R"({"messages":[{"role":"user","content":" hi "}]})");
  ASSERT_EQ(t.status, 200) << t.body;
  std::vector<int> want = {261, 259};
  for (char ch : std::string("user\nhi")) want.push_back((unsigned char)ch);
  want.push_back(260);
  want.push_back('\n');
  want.push_back(259);
  for (char ch : std::string("model\n")) want.push_back((unsigned char)ch);
  std::string ids;
  for (int id : want) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  EXPECT_EQ(t.body, R"({"tokens":[)" + ids + R"(],"count":)" + std::to_string(want.size()) + R"(,"max_model_len":512})");
  Resp c = request(r.port(), "POST", "/v1/chat/completions",
                   CHAT + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]})");
  expect_error(c, 400, "tools_not_supported");
  EXPECT_NE(c.body.find("cannot express tools"), std::string::npos) << c.body;
  Resp sys = request(r.port(), "POST", "/tokenize",
                     R"({"messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}]})");
  expect_error(sys, 400, "chat_template_error");
  EXPECT_NE(sys.body.find(R"("message":"System role not supported")"), std::string::npos) << sys.body;
  Resp kw = request(r.port(), "POST", "/tokenize",
                    R"({"messages":[{"role":"user","content":"hi"}],"chat_template":"{{ messages[0].nope() }}"})");
  expect_error(kw, 400, "chat_template_error"); // a runtime error names the template's line
  EXPECT_NE(kw.body.find("line 1"), std::string::npos) << kw.body;
  // chat_template_kwargs: a top-level string holding the model's markup is refused (the template's own variables are
  // not guarded as the request's text); deeper ones are the request's text, encoded without control tokens
  Resp mark = request(r.port(), "POST", "/tokenize",
                      R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":"<end_of_turn>"}})");
  expect_error(mark, 400, "invalid_value");
  EXPECT_NE(mark.body.find(R"("param":"chat_template_kwargs.x")"), std::string::npos) << mark.body;
  Resp deep = request(r.port(), "POST", "/tokenize",
                      R"({"messages":[{"role":"user","content":"hi"}],"chat_template":"{{ x.y }}",)"
                      R"("chat_template_kwargs":{"x":{"y":"<end_of_turn>"}}})");
  ASSERT_EQ(deep.status, 200) << deep.body;
  EXPECT_EQ(deep.body.find("260"), std::string::npos) << deep.body; // <end_of_turn> as text, not its id
  Resp models = request(r.port(), "GET", "/v1/models", "");
  EXPECT_NE(models.body.find(R"x("chat_template_source":"the GGUF's tokenizer.chat_template (Jinja)")x"), std::string::npos)
      << models.body;
}

// rtr_server_new's error for the model m with the config's chat_template override and chat_template_file ("" when
// it started).
std::string start_error(const TinyModel &m, const char *override, const char *file = "") {
  cfg_cluster cfg{};
  cfg_worker w{};
  snprintf(cfg.chat_template, sizeof cfg.chat_template, "%s", override);
  snprintf(cfg.chat_template_file, sizeof cfg.chat_template_file, "%s", file);
  snprintf(cfg.secret, sizeof cfg.secret, "%s", DSERVE_TEST_SECRET);
  cfg.has_router = 1;
  snprintf(cfg.router.host, sizeof cfg.router.host, "127.0.0.1");
  cfg.router.max_body_bytes = 4096;
  cfg.router.conn_timeout_s = 10;
  cfg.router.queue_limit = 4;
  cfg.router.request_timeout_ms = 1000;
  snprintf(w.name, sizeof w.name, "w0");
  snprintf(w.host, sizeof w.host, "127.0.0.1");
  w.port = 1;
  cfg.workers = &w;
  cfg.n_workers = 1;
  rtr_server_opts o{};
  o.cfg = &cfg;
  o.gguf = m.g;
  o.tok = m.t;
  o.n_ctx = 512;
  rtr_server *s = nullptr;
  char err[512] = "";
  int rc = rtr_server_new(&o, &s, err, sizeof err);
  rtr_server_free(s);
  return rc == 0 ? "" : (err[0] ? err : "(no message)");
}

// A Jinja template that does not parse (the GGUF's or the file's), a missing file, an unknown override, or a family
// whose end-of-turn token the vocabulary lacks: the router does not start, and says why; the override makes a chat
// model of a model with no template.
TEST(Http, ChatTemplateErrorsAtStartUp) {
  TinyModel unknown(true, "{% for m in messages %}### Instruction: {{ m['content'] }}{% endfor %}");
  EXPECT_EQ(start_error(unknown, ""), ""); // any template runs: no family needs recognising
  TinyModel broken(true, "{% for m in messages %}\n{{ m.content + }}\n{% endfor %}");
  std::string e = start_error(broken, "");
  EXPECT_NE(e.find("chat template (the GGUF's tokenizer.chat_template) does not parse: line 2"), std::string::npos)
      << e;
  EXPECT_EQ(start_error(broken, "chatml"), ""); // a family wins over the Jinja templates
  char dir[] = "/tmp/dserve-tpl-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string bad = std::string(dir) + "/bad.jinja", good = std::string(dir) + "/good.jinja";
  FILE *f = fopen(bad.c_str(), "w");
  fputs("ok\n{% if x %}\n", f); // unclosed
  fclose(f);
  f = fopen(good.c_str(), "w");
  fputs("{% for m in messages %}{{ m.content }}{% endfor %}", f);
  fclose(f);
  e = start_error(broken, "", bad.c_str());
  EXPECT_NE(e.find("chat template file " + bad + " does not parse: line "), std::string::npos) << e;
  EXPECT_EQ(start_error(broken, "", good.c_str()), ""); // the file wins over the GGUF's
  e = start_error(unknown, "", (std::string(dir) + "/missing.jinja").c_str());
  EXPECT_NE(e.find("missing.jinja: No such file"), std::string::npos) << e;
  fclose(fopen(bad.c_str(), "w"));
  e = start_error(unknown, "", bad.c_str());
  EXPECT_NE(e.find("bad.jinja: is empty"), std::string::npos) << e;
  e = start_error(unknown, "", dir); // a folder
  EXPECT_NE(e.find("is not a regular file"), std::string::npos) << e;
  remove(bad.c_str());
  remove(good.c_str());
  rmdir(dir);
  TinyModel plain(true);
  e = start_error(plain, "llama2");
  EXPECT_NE(e.find("chat_template 'llama2' is not a template family known here (chatml, llama3, gemma, mistral, "
                   "phi3)"), std::string::npos) << e;
  e = start_error(plain, "gemma");
  EXPECT_NE(e.find("chat template gemma: the model's turns end with <end_of_turn>, which the vocabulary does not "
                   "have"), std::string::npos) << e;
  TinyModel base(false, nullptr, {"<start_of_turn>", "<end_of_turn>"});
  EXPECT_EQ(start_error(base, "gemma"), "");
  EXPECT_EQ(start_error(base, ""), ""); // no template: it starts, and refuses chats (ModelWithoutAChatTemplate...)
}

TEST(Http, ChatTemplateOverrideServesABaseModel) {
  TinyModel base(false, nullptr, {"<start_of_turn>", "<end_of_turn>"});
  Router r(base, 1, 16, 64, {}, 10, [](cfg_cluster &c) { snprintf(c.chat_template, sizeof c.chat_template, "gemma"); });
  Resp t = request(r.port(), "POST", "/tokenize", R"({"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.body.rfind(R"({"tokens":[259,117,115,101,114,10,104,105,260,10,259,)", 0), 0u) << t.body;
}

struct Live : ::testing::Test {
  TinyModel m;
  FakeWorker fw;
  std::unique_ptr<Router> r;
  void SetUp() override {
    // strict: a request's model must be "tiny" (ErrorsAndKeepServing's 404); the default takes any name
    r.reset(new Router(m, fw.port(), 16, 64, {}, 10, [](cfg_cluster &c) { c.router.strict_model_name = 1; }));
    ASSERT_TRUE(r->wait_up());
  }
  int port() { return r->port(); }
  void healthy() { EXPECT_EQ(request(port(), "GET", "/health", "").status, 200); }
};

TEST_F(Live, HealthModelsTokenize) {
  healthy();
  Resp mr = request(port(), "GET", "/v1/models", "");
  ASSERT_EQ(mr.status, 200);
  cJSON *o = js(mr.body);
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "data"), 0), "id")->valuestring, "tiny");
  cJSON_Delete(o);
  Resp t = request(port(), "POST", "/tokenize", R"({"prompt":"abc"})");
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.body, R"({"tokens":[97,98,99],"count":3,"max_model_len":512})");
  Resp d = request(port(), "POST", "/detokenize", R"({"tokens":[104,105,257]})");
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.body, R"({"prompt":"hi<|im_start|>"})");
}

TEST_F(Live, ChatNonStream) {
  Resp x = request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":2,"logprobs":true,"top_logprobs":1})");
  ASSERT_EQ(x.status, 200) << x.body;
  cJSON *o = js(x.body);
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(std::string(cJSON_GetObjectItem(o, "id")->valuestring).rfind("chatcmpl-", 0), 0u);
  EXPECT_STREQ(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
  EXPECT_STREQ(cJSON_GetObjectItem(o, "model")->valuestring, "tiny");
  cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring, "c0t0 c0t1 ");
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "role")->valuestring, "assistant");
  EXPECT_STREQ(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
  cJSON *lp = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content");
  ASSERT_EQ(cJSON_GetArraySize(lp), 2) << x.body;
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetArrayItem(lp, 1), "token")->valuestring, "b");
  EXPECT_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(lp, 0), "top_logprobs")), 1);
  cJSON *u = cJSON_GetObjectItem(o, "usage");
  // the prompt the router sent is the ChatML rendering: compare with /tokenize of the same messages
  Resp t = request(port(), "POST", "/tokenize", R"({"messages":[{"role":"user","content":"hi"}]})");
  cJSON *to = js(t.body);
  EXPECT_EQ(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, cJSON_GetObjectItem(to, "count")->valueint);
  EXPECT_EQ(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 2);
  EXPECT_EQ(cJSON_GetObjectItem(u, "total_tokens")->valueint, cJSON_GetObjectItem(to, "count")->valueint + 2);
  EXPECT_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")->valueint, 2);
  cJSON_Delete(to);
  cJSON_Delete(o);
  // what the worker got
  std::lock_guard<std::mutex> l(fw.mu);
  cJSON *g = js(fw.gen_json.back());
  EXPECT_STREQ(cJSON_GetObjectItem(g, "mode")->valuestring, "local");
  EXPECT_EQ(cJSON_GetObjectItem(g, "max_tokens")->valueint, 2);
  EXPECT_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "sampling"), "logprobs")->valueint, 1);
  cJSON_Delete(g);
}

TEST_F(Live, CompletionDefaultsToContext) {
  Resp x = request(port(), "POST", "/v1/completions", R"({"prompt":"abcd","seed":7,"stop":["zz"]})");
  ASSERT_EQ(x.status, 200) << x.body;
  cJSON *o = js(x.body);
  cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  EXPECT_STREQ(cJSON_GetObjectItem(c0, "text")->valuestring, "c0t0 c0t1 c0t2 ");
  EXPECT_STREQ(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
  EXPECT_EQ(std::string(cJSON_GetObjectItem(o, "id")->valuestring).rfind("cmpl-", 0), 0u);
  cJSON_Delete(o);
  std::lock_guard<std::mutex> l(fw.mu);
  cJSON *g = js(fw.gen_json.back());
  EXPECT_EQ(cJSON_GetObjectItem(g, "max_tokens")->valueint, 508); // 512 - 4 prompt tokens
  EXPECT_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "sampling"), "seed")->valueint, 7);
  EXPECT_STREQ(cJSON_GetArrayItem(cJSON_GetObjectItem(g, "stop"), 0)->valuestring, "zz");
  cJSON_Delete(g);
}

TEST_F(Live, ChatStreamFraming) {
  Resp x = request(port(), "POST", "/v1/chat/completions",
                   CHAT + R"(,"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(x.status, 200);
  EXPECT_EQ(x.header("content-type"), "text/event-stream");
  auto ev = sse_events(x.body);
  ASSERT_EQ(ev.size(), 6u) << x.body; // role, 2 deltas, finish, usage, [DONE]
  for (size_t i = 0; i + 1 < ev.size(); i++) ASSERT_EQ(ev[i].rfind("data: {", 0), 0u) << ev[i];
  EXPECT_EQ(ev.back(), "data: [DONE]");
  EXPECT_EQ(x.body.substr(x.body.size() - 14), "data: [DONE]\n\n");
  std::string id;
  std::string text;
  for (size_t i = 0; i + 1 < ev.size(); i++) {
    cJSON *o = js(ev[i].substr(6));
    ASSERT_NE(o, nullptr) << ev[i];
    EXPECT_STREQ(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion.chunk");
    if (id.empty()) id = cJSON_GetObjectItem(o, "id")->valuestring;
    EXPECT_EQ(id, cJSON_GetObjectItem(o, "id")->valuestring); // one id for the whole stream
    cJSON *ch = cJSON_GetObjectItem(o, "choices");
    if (i == 4) {
      EXPECT_EQ(cJSON_GetArraySize(ch), 0);
      cJSON *u = cJSON_GetObjectItem(o, "usage");
      EXPECT_EQ(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 2);
    } else {
      ASSERT_EQ(cJSON_GetArraySize(ch), 1);
      cJSON *c0 = cJSON_GetArrayItem(ch, 0), *d = cJSON_GetObjectItem(c0, "delta");
      if (i == 0) {
        EXPECT_STREQ(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
        EXPECT_STREQ(cJSON_GetObjectItem(d, "content")->valuestring, "");
      }
      if (i == 1 || i == 2) text += cJSON_GetObjectItem(d, "content")->valuestring;
      if (i == 3) EXPECT_STREQ(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
      else EXPECT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    }
    cJSON_Delete(o);
  }
  EXPECT_EQ(text, "c0t0 c0t1 ");
}

TEST_F(Live, TwoChoicesInterleaved) {
  fw.hold = 2;
  Resp x = request(port(), "POST", "/v1/completions", R"({"prompt":"ab","n":2,"max_tokens":3,"stream":true,"seed":10})");
  ASSERT_EQ(x.status, 200);
  auto ev = sse_events(x.body);
  std::string text[2];
  int finishes[2] = {0, 0};
  std::vector<int> order;
  for (auto &e : ev) {
    if (e == "data: [DONE]") continue;
    cJSON *o = js(e.substr(6));
    ASSERT_NE(o, nullptr) << e;
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    int idx = cJSON_GetObjectItem(c0, "index")->valueint;
    ASSERT_TRUE(idx == 0 || idx == 1);
    std::string t = cJSON_GetObjectItem(c0, "text")->valuestring;
    if (!t.empty()) order.push_back(idx);
    text[idx] += t;
    if (cJSON_IsString(cJSON_GetObjectItem(c0, "finish_reason"))) finishes[idx]++;
    cJSON_Delete(o);
  }
  EXPECT_EQ(text[0], "c0t0 c0t1 c0t2 ");
  EXPECT_EQ(text[1], "c1t0 c1t1 c1t2 ");
  EXPECT_EQ(finishes[0], 1);
  EXPECT_EQ(finishes[1], 1);
  ASSERT_EQ(order.size(), 6u);
  bool interleaved = false; // the fake worker ticks both choices together: index 1 appears before index 0 ends
  for (size_t i = 0; i < 3; i++) interleaved |= order[i] == 1;
  EXPECT_TRUE(interleaved);
  std::lock_guard<std::mutex> l(fw.mu);
  ASSERT_GE(fw.gen_json.size(), 2u);
  std::vector<int> seeds;
  for (size_t i = fw.gen_json.size() - 2; i < fw.gen_json.size(); i++) {
    cJSON *g = js(fw.gen_json[i]);
    seeds.push_back(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "sampling"), "seed")->valueint);
    cJSON_Delete(g);
  }
  std::sort(seeds.begin(), seeds.end());
  EXPECT_EQ(seeds, (std::vector<int>{10, 11}));
}

TEST_F(Live, ErrorsAndKeepServing) {
  const std::string J = "Content-Type: application/json\r\n";
  expect_error(request(port(), "GET", "/nope", ""), 404);
  healthy();
  Resp nf = request(port(), "POST", "/v1/chat/completions", R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})");
  expect_error(nf, 404, "model_not_found");
  EXPECT_NE(nf.body.find("this server serves 'tiny'"), std::string::npos) << nf.body; // the id to use instead
  healthy();
  Resp m = request(port(), "GET", "/v1/chat/completions", "");
  expect_error(m, 405);
  EXPECT_EQ(m.header("allow"), "POST");
  healthy();
  expect_error(request(port(), "POST", "/v1/models", "{}"), 405);
  healthy();
  expect_error(request(port(), "POST", "/v1/chat/completions", CHAT + "}", "Content-Type: text/plain\r\n"), 415);
  healthy();
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})",
                    "Content-Type: application/json; charset=utf-8\r\n").status, 200);
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})", "").status, 200);
  expect_error(request(port(), "POST", "/v1/chat/completions", std::string(5000, ' ')), 413);
  healthy();
  { // a 10 MB body announced: refused before it is sent
    int fd = connect_to(port());
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10485760\r\n\r\n");
    Resp r;
    std::string pend;
    ASSERT_TRUE(read_resp(fd, r, pend));
    expect_error(r, 413);
    close(fd);
  }
  { // chunked upload over the limit
    int fd = connect_to(port());
    std::string chunk(3000, ' ');
    char hex[16];
    snprintf(hex, sizeof hex, "%zx", chunk.size());
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n" +
                     std::string(hex) + "\r\n" + chunk + "\r\n" + hex + "\r\n" + chunk + "\r\n0\r\n\r\n");
    Resp r;
    std::string pend;
    ASSERT_TRUE(read_resp(fd, r, pend));
    expect_error(r, 413);
    close(fd);
  }
  healthy();
  expect_error(request(port(), "POST", "/v1/chat/completions", "{\"messages\":"), 400);
  expect_error(request(port(), "POST", "/v1/completions", "{\"prompt\":\"\xff\"}"), 400);
  expect_error(request(port(), "POST", "/v1/completions", R"({"prompt":"x","max_tokens":1e309})"), 400);
  expect_error(request(port(), "POST", "/v1/completions", std::string(2000, '[') + std::string(2000, ']')), 400);
  expect_error(request(port(), "POST", "/v1/completions", R"({"prompt":")" + std::string(600, 'a') + "\"}"), 400,
               "context_length_exceeded");
  Resp ce = request(port(), "POST", "/v1/completions", R"({"prompt":"abcdefghij","max_tokens":510})");
  expect_error(ce, 400, "context_length_exceeded");
  EXPECT_NE(ce.body.find("520"), std::string::npos) << ce.body; // the token counts are in the message
  healthy();
  { // keep-alive: two requests on one connection
    int fd = connect_to(port());
    std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    std::string pend;
    Resp a, b;
    send_all(fd, req);
    ASSERT_TRUE(read_resp(fd, a, pend));
    send_all(fd, req);
    ASSERT_TRUE(read_resp(fd, b, pend));
    EXPECT_EQ(a.status, 200);
    EXPECT_EQ(b.status, 200);
    close(fd);
  }
  // every bad request left the server serving real ones
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})").status, 200);
  Resp mt = request(port(), "GET", "/metrics", "");
  ASSERT_EQ(mt.status, 200);
  EXPECT_NE(mt.body.find("# TYPE dserve:time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(mt.body.find("dserve:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 3"), std::string::npos) << mt.body;
  EXPECT_NE(mt.body.find("dserve:kv_cache_usage_perc{model_name=\"tiny\"} 0.25"), std::string::npos) << mt.body;
  EXPECT_NE(mt.body.find("dserve:prefix_cache_queries_total{model_name=\"tiny\"} 9"), std::string::npos) << mt.body;
  EXPECT_NE(mt.body.find("dserve:prefix_cache_tier_hits_total{model_name=\"tiny\",worker=\"w0\",tier=\"pool\"} 5"), std::string::npos);
  EXPECT_NE(mt.body.find("dserve:prefix_cache_tier_queries_total{model_name=\"tiny\",worker=\"w0\",tier=\"host\"} 4"), std::string::npos);
  EXPECT_NE(mt.body.find("dserve:prefix_cache_blocks{model_name=\"tiny\",worker=\"w0\",tier=\"pool\"} 3"), std::string::npos);
  // blocks a tier refused (issue 39 item 9), for the host and disk tiers only: the pool never refuses one
  EXPECT_NE(mt.body.find("dserve:prefix_cache_tier_refused_total{model_name=\"tiny\",worker=\"w0\",tier=\"host\"} 6"), std::string::npos) << mt.body;
  EXPECT_EQ(mt.body.find("dserve:prefix_cache_tier_refused_total{model_name=\"tiny\",worker=\"w0\",tier=\"pool\"}"), std::string::npos);
  EXPECT_EQ(mt.body.find("tier=\"disk\""), std::string::npos) << mt.body;
}

TEST(Http, ApiKeys) {
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port(), 16, 64, {"sekrit", "other"});
  ASSERT_TRUE(r.wait_up());
  EXPECT_EQ(request(r.port(), "GET", "/health", "").status, 200); // open
  expect_error(request(r.port(), "GET", "/v1/models", ""), 401);
  expect_error(request(r.port(), "GET", "/v1/models", "", "Authorization: Bearer wrong\r\n"), 401);
  expect_error(request(r.port(), "GET", "/v1/models", "", "Authorization: sekrit\r\n"), 401);
  EXPECT_EQ(request(r.port(), "GET", "/v1/models", "", "Authorization: Bearer sekrit\r\n").status, 200);
  EXPECT_EQ(request(r.port(), "GET", "/v1/models", "", "Authorization: Bearer other\r\n").status, 200);
  expect_error(request(r.port(), "GET", "/metrics", ""), 401); // secure by default: metrics_public is off
  EXPECT_EQ(request(r.port(), "GET", "/metrics", "", "Authorization: Bearer sekrit\r\n").status, 200);
}

// router.metrics_public: a Prometheus scraper without the key reads /metrics; every other route still needs it.
TEST(Http, MetricsPublic) {
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port(), 16, 64, {"sekrit"}, 10, [](cfg_cluster &c) { c.router.metrics_public = 1; });
  ASSERT_TRUE(r.wait_up());
  Resp mt = request(r.port(), "GET", "/metrics", "");
  EXPECT_EQ(mt.status, 200) << mt.body;
  EXPECT_NE(mt.body.find("# TYPE dserve:request_decode_time_seconds histogram"), std::string::npos) << mt.body;
  expect_error(request(r.port(), "GET", "/v1/models", ""), 401);
  expect_error(request(r.port(), "POST", "/v1/completions", R"({"prompt":"ab","max_tokens":1})"), 401);
}

// Starts a stream and returns the socket once the first bytes of the body arrived.
int start_stream(int port, const std::string &body, std::string *got) {
  int fd = connect_to(port);
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  char tmp[4096];
  for (int i = 0; i < 100 && got->find("data: ") == std::string::npos; i++) {
    ssize_t k = recv(fd, tmp, sizeof tmp, 0);
    if (k <= 0) break;
    got->append(tmp, (size_t)k);
  }
  return fd;
}

// Reads the rest of a stream started by start_stream into *got, up to its [DONE] (or the connection's end); closes fd.
static void read_to_done(int fd, std::string *got) {
  char tmp[4096];
  while (got->find("data: [DONE]\n\n") == std::string::npos) {
    ssize_t k = recv(fd, tmp, sizeof tmp, 0);
    if (k <= 0) break;
    got->append(tmp, (size_t)k);
  }
  close(fd);
}

TEST_F(Live, DisconnectCancels) {
  fw.mode = FakeWorker::HANG;
  std::string got;
  int fd = start_stream(port(), CHAT + R"(,"stream":true})", &got);
  ASSERT_NE(got.find("data: "), std::string::npos) << got;
  for (int i = 0; i < 100 && fw.n_generates() == 0; i++) std::this_thread::sleep_for(10ms);
  std::string id;
  {
    std::lock_guard<std::mutex> l(fw.mu);
    ASSERT_FALSE(fw.generates.empty());
    id = fw.generates.back();
  }
  close(fd);
  EXPECT_TRUE(fw.saw_cancel(id, 2000ms));
  // non-stream too
  fd = connect_to(port());
  std::string body = CHAT + "}";
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                   "\r\n\r\n" + body);
  for (int i = 0; i < 200 && fw.n_generates() < 2; i++) std::this_thread::sleep_for(10ms);
  {
    std::lock_guard<std::mutex> l(fw.mu);
    ASSERT_EQ(fw.generates.size(), 2u);
    id = fw.generates.back();
  }
  close(fd);
  EXPECT_TRUE(fw.saw_cancel(id, 2000ms));
  fw.mode = FakeWorker::NORMAL;
  healthy();
}

TEST_F(Live, WorkerDiesMidStream) {
  fw.mode = FakeWorker::DIE;
  std::string got;
  auto t0 = std::chrono::steady_clock::now();
  int fd = start_stream(port(), CHAT + R"(,"stream":true,"max_tokens":5})", &got);
  read_to_done(fd, &got);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);
  EXPECT_NE(got.find("data: {\"error\":{"), std::string::npos) << got;
  EXPECT_NE(got.find("worker_failure"), std::string::npos) << got;
  EXPECT_NE(got.find("data: [DONE]\n\n"), std::string::npos) << got;
  fw.mode = FakeWorker::NORMAL;
  ASSERT_TRUE(r->wait_up()); // reconnects
  for (int i = 0; i < 300 && request(port(), "GET", "/health", "").status != 200; i++) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})").status, 200);
}

// With router.migration_limit, a stream whose worker dies after a token continues once the worker is back (the
// launcher's restart): the client sees one stream with no error, and the worker gets the prompt followed by the
// streamed token under resume.
TEST(Migration, StreamContinuesAfterTheWorkerComesBack) {
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port(), 16, 64, {}, 10, [](cfg_cluster &c) {
    c.router.migration_limit = 2;
    c.router.migration_wait_ms = 5000;
  });
  ASSERT_TRUE(r.wait_up());
  fw.mode = FakeWorker::DIE_ONCE;
  std::string got;
  int fd = start_stream(r.port(), CHAT + R"(,"stream":true,"max_tokens":5})", &got);
  read_to_done(fd, &got);
  EXPECT_EQ(got.find("\"error\""), std::string::npos) << got;
  EXPECT_NE(got.find("data: [DONE]\n\n"), std::string::npos) << got;
  std::lock_guard<std::mutex> l(fw.mu);
  ASSERT_EQ(fw.generates.size(), 2u);
  EXPECT_EQ(fw.generates[1], fw.generates[0] + "-r1");
  cJSON *first = js(fw.gen_json[0]), *second = js(fw.gen_json[1]);
  int n0 = cJSON_GetArraySize(cJSON_GetObjectItem(first, "prompt"));
  const cJSON *p1 = cJSON_GetObjectItem(second, "prompt");
  ASSERT_EQ(cJSON_GetArraySize(p1), n0 + 1);
  EXPECT_EQ(cJSON_GetArrayItem(p1, n0)->valuedouble, 99); // the token the dead worker streamed
  EXPECT_EQ(cJSON_GetObjectItem(second, "resume")->valuedouble, 1);
  EXPECT_EQ(cJSON_GetObjectItem(first, "resume"), nullptr);
  EXPECT_EQ(cJSON_GetObjectItem(second, "max_tokens")->valuedouble, 5);
  cJSON_Delete(first);
  cJSON_Delete(second);
  // the text: c0t0 from the first worker, then the second's (this fake restarts its script)
  EXPECT_NE(got.find("c0t0 "), std::string::npos) << got;
}

// A stream whose worker keeps dying moves at most router.migration_limit times, then ends with the error as before.
TEST(Migration, StreamFailsAfterTheMigrationLimit) {
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port(), 16, 64, {}, 10, [](cfg_cluster &c) {
    c.router.migration_limit = 2;
    c.router.migration_wait_ms = 300;
  });
  ASSERT_TRUE(r.wait_up());
  fw.mode = FakeWorker::DIE; // every generate: one token, then the link closes
  std::string got;
  auto t0 = std::chrono::steady_clock::now();
  int fd = start_stream(r.port(), CHAT + R"(,"stream":true,"max_tokens":5})", &got);
  read_to_done(fd, &got);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10000ms);
  EXPECT_NE(got.find("worker_failure"), std::string::npos) << got;
  EXPECT_NE(got.find("data: [DONE]\n\n"), std::string::npos) << got;
  std::lock_guard<std::mutex> l(fw.mu);
  EXPECT_EQ(fw.generates.size(), 3u); // the first worker, then migration_limit moves
}

TEST_F(Live, WorkerErrorMessage) {
  fw.mode = FakeWorker::FAIL;
  expect_error(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":3})"), 504, "timeout");
  Resp x = request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":3,"stream":true})");
  EXPECT_EQ(x.status, 200);
  auto ev = sse_events(x.body);
  ASSERT_GE(ev.size(), 3u) << x.body; // role, the token, the error, [DONE]
  EXPECT_EQ(ev.back(), "data: [DONE]");
  cJSON *e = js(ev[ev.size() - 2].substr(6));
  ASSERT_NE(e, nullptr) << x.body;
  EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "code")->valuestring, "timeout");
  cJSON_Delete(e);
  fw.mode = FakeWorker::NORMAL;
  EXPECT_EQ(request(port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})").status, 200);
  // the worker already dropped the request: no cancel is sent for it
  std::lock_guard<std::mutex> l(fw.mu);
  EXPECT_TRUE(fw.cancels.empty());
}

TEST(Http, IdleConnectionTimesOut) {
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port(), 16, 64, {}, /*conn_timeout_s=*/1);
  int fd = connect_to(r.port());
  ASSERT_GE(fd, 0);
  auto t0 = std::chrono::steady_clock::now();
  char b[16];
  ssize_t k = recv(fd, b, sizeof b, 0); // nothing sent: the server closes the connection
  EXPECT_EQ(k, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  close(fd);
}

TEST(Http, QueueFull429) {
  TinyModel m;
  FakeWorker fw;
  fw.mode = FakeWorker::HANG;
  Router r(m, fw.port(), /*queue_limit=*/0, /*max_seqs=*/1);
  ASSERT_TRUE(r.wait_up());
  std::string got;
  int fd = start_stream(r.port(), CHAT + R"(,"stream":true})", &got); // takes the only slot
  ASSERT_NE(got.find("data: "), std::string::npos);
  Resp x = request(r.port(), "POST", "/v1/chat/completions", CHAT + "}");
  expect_error(x, 429, "queue_full");
  EXPECT_EQ(x.header("retry-after"), "1");
  close(fd);
  ASSERT_TRUE(fw.saw_cancel("chatcmpl-", 2000ms));
  fw.mode = FakeWorker::NORMAL;
  Resp ok;
  for (int i = 0; i < 100; i++) { // the slot frees once the router saw the disconnect
    ok = request(r.port(), "POST", "/v1/chat/completions", CHAT + R"(,"max_tokens":1})");
    if (ok.status == 200) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(Http, WaitingRequestsRunInTurn) {
  TinyModel m;
  FakeWorker fw;
  Router r(m, fw.port(), /*queue_limit=*/8, /*max_seqs=*/1);
  ASSERT_TRUE(r.wait_up());
  std::vector<std::thread> th;
  std::vector<Resp> out(6);
  for (int i = 0; i < 6; i++)
    th.emplace_back([&, i] { out[i] = request(r.port(), "POST", "/v1/completions", R"({"prompt":"ab","max_tokens":2})"); });
  for (auto &t : th) t.join();
  for (auto &x : out) EXPECT_EQ(x.status, 200) << x.body;
  Resp mt = request(r.port(), "GET", "/metrics", "");
  EXPECT_NE(mt.body.find("dserve:request_queue_time_seconds_count{model_name=\"tiny\"} 6"), std::string::npos) << mt.body;
  EXPECT_NE(mt.body.find("dserve:num_requests_running{model_name=\"tiny\"} 0"), std::string::npos) << mt.body;
}

} // namespace
