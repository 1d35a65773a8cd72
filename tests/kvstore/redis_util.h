// tests/kvstore/redis_util.h: real redis-server processes for the kvstore tests: free loopback ports, a temp dir
// each, start (waiting for PING), kill, and redis-cli for looking inside.
#ifndef DSERVE_TESTS_KVSTORE_REDIS_UTIL_H
#define DSERVE_TESTS_KVSTORE_REDIS_UTIL_H

#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace kvs_test {

inline bool have_tool(const char *name) {
  std::string cmd = std::string("command -v ") + name + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}
#define REQUIRE_REDIS()                                                                                                \
  do {                                                                                                                 \
    if (!kvs_test::have_tool("redis-server") || !kvs_test::have_tool("redis-cli"))                                     \
      FAIL() << "redis-server/redis-cli not found: run scripts/setup.sh (it installs redis-server and redis-tools)";   \
  } while (0)

inline bool port_free(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  int ok = bind(fd, (sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

// A loopback port that is free, and whose cluster bus port (+10000) is too, below the ephemeral range (a port there
// may be taken by any outgoing connection before the server binds it).
inline int free_port() {
  static std::vector<int> given;
  static std::mt19937 rng((unsigned)getpid() * 2654435761u ^ (unsigned)time(nullptr));
  for (;;) {
    int port = 11000 + (int)(rng() % 12000u);
    bool used = false;
    for (int g : given) used |= g == port;
    if (!used && port_free(port) && port_free(port + 10000)) {
      given.push_back(port);
      return port;
    }
  }
}

inline std::string run(const std::string &cmd) {
  std::string out;
  if (FILE *f = popen((cmd + " 2>&1").c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// Writes a test CA (ca.crt), a server certificate for 127.0.0.1 (srv.crt, srv.key), a client certificate
// (cli.crt, cli.key) and an unrelated CA (other.crt) into dir: whether openssl made them all.
inline bool make_certs(const std::string &dir) {
  std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::string cmd = "cd '" + dir + "' && printf 'subjectAltName=IP:127.0.0.1' > ext && " +
                    "openssl req -x509" + ec + " -keyout ca.key -out ca.crt -days 2 -subj /CN=kvs-test-ca && " +
                    "openssl req -x509" + ec + " -keyout other.key -out other.crt -days 2 -subj /CN=kvs-other-ca && " +
                    "openssl req" + ec + " -keyout srv.key -out srv.csr -subj /CN=127.0.0.1 && " +
                    "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt -days 2 "
                    "-extfile ext && " +
                    "openssl req" + ec + " -keyout cli.key -out cli.csr -subj /CN=kvs-test-client && " +
                    "openssl x509 -req -in cli.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out cli.crt -days 2";
  return std::system(("(" + cmd + ") >/dev/null 2>&1").c_str()) == 0;
}

struct Redis {
  int port = 0;
  pid_t pid = -1;
  std::string dir, password;
  bool tls = false; // TLS only (--port 0 --tls-port), certificates from make_certs(dir), client certificates required

  Redis() {
    char tmpl[] = "/tmp/dserve-kvs-XXXXXX";
    dir = mkdtemp(tmpl);
    port = free_port();
  }
  ~Redis() {
    stop();
    run("rm -rf '" + dir + "'");
  }
  std::string cli(const std::string &args) const {
    std::string auth = password.empty() ? "" : " -a '" + password + "' --no-auth-warning";
    std::string t = tls ? " --tls --cacert '" + dir + "/ca.crt' --cert '" + dir + "/cli.crt' --key '" + dir +
                              "/cli.key'"
                        : "";
    return run("redis-cli -p " + std::to_string(port) + t + auth + " " + args);
  }
  // Starts redis-server (extra: more arguments) and waits until it answers PING: true, or false after 10 s.
  bool start(const std::vector<std::string> &extra = {}) {
    std::vector<std::string> args = {"redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no", "--dir", dir};
    if (tls)
      args = {"redis-server", "--port", "0", "--tls-port", std::to_string(port), "--tls-cert-file", dir + "/srv.crt",
              "--tls-key-file", dir + "/srv.key", "--tls-ca-cert-file", dir + "/ca.crt", "--tls-auth-clients", "yes",
              "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir};
    if (!password.empty()) args.insert(args.end(), {"--requirepass", password});
    args.insert(args.end(), extra.begin(), extra.end());
    pid = fork();
    if (pid == 0) {
      int fd = open((dir + "/log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char *> argv;
      for (auto &a : args) argv.push_back((char *)a.c_str());
      argv.push_back(nullptr);
      execvp("redis-server", argv.data());
      _exit(127);
    }
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < end) {
      if (cli("PING") == "PONG") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  void stop() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
};

// Polls cond every 10 ms until it holds or timeout_ms passes: whether it held.
template <class F> bool wait_for(F cond, int timeout_ms = 10000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms * DSERVE_TIMEOUT_SCALE);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

} // namespace kvs_test
#endif
