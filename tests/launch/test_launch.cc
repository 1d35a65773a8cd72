// tests/launch/test_launch.cc: `dserve launch` as a real process: config errors, crash reports, restarts, give-up,
// health probes (HTTP /health and control port), SIGTERM shutdown with and without the grace-period SIGKILL.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/dserve_launch_XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string write(const std::string &name, const std::string &text, bool exec = false) {
    std::string p = path + "/" + name;
    std::ofstream(p) << text;
    if (exec) chmod(p.c_str(), 0755);
    return p;
  }
};

std::string slurp(const std::string &p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int count(const std::string &hay, const std::string &needle) {
  int n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) n++;
  return n;
}

// The launcher as a child process with stdout and stderr in files of dir.
struct Launcher {
  pid_t pid = -1;
  std::string out, err;
  int status = -1;
  Launcher(TempDir &d, const std::vector<std::string> &args) {
    out = d.path + "/launch.out";
    err = d.path + "/launch.err";
    std::vector<std::string> a = {DSERVE_BINARY, "launch"};
    a.insert(a.end(), args.begin(), args.end());
    pid = fork();
    if (pid == 0) {
      int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(o, 1);
      dup2(e, 2);
      std::vector<char *> av;
      for (auto &s : a) av.push_back(const_cast<char *>(s.c_str()));
      av.push_back(nullptr);
      execv(av[0], av.data());
      _exit(127);
    }
  }
  // true when it exited within ms (status filled)
  bool wait_exit(int ms) {
    auto end = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < end) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  bool wait_for(const std::string &file, const std::string &needle, int ms) {
    auto end = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < end) {
      if (slurp(file).find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  ~Launcher() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
};

// A listening socket on 127.0.0.1, port 0.
struct Listener {
  int fd = -1, port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bind(fd, (sockaddr *)&a, sizeof a);
    listen(fd, 64);
    socklen_t sl = sizeof a;
    getsockname(fd, (sockaddr *)&a, &sl);
    port = ntohs(a.sin_port);
  }
  ~Listener() {
    if (fd >= 0) close(fd);
  }
};

// Answers GET /health with 503 for the first `fail_first` requests, then 200.
struct FakeHealth {
  Listener l;
  std::atomic<int> served{0};
  std::atomic<bool> stop{false};
  int fail_first;
  std::thread th;
  explicit FakeHealth(int fail_first_) : fail_first(fail_first_) {
    th = std::thread([this] {
      while (!stop) {
        pollfd p{l.fd, POLLIN, 0};
        if (poll(&p, 1, 50) != 1) continue;
        int c = accept(l.fd, nullptr, nullptr);
        if (c < 0) continue;
        char buf[1024];
        ssize_t r = recv(c, buf, sizeof buf - 1, 0);
        buf[r > 0 ? r : 0] = 0;
        bool ok = strncmp(buf, "GET /health HTTP/1.", 19) == 0;
        int n = served++;
        const char *resp = ok && n >= fail_first ? "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
                                                : "HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
        ssize_t w = send(c, resp, strlen(resp), MSG_NOSIGNAL);
        (void)w;
        close(c);
      }
    });
  }
  ~FakeHealth() {
    stop = true;
    th.join();
  }
};

// A child program standing in for dserve: $1 = role (router/both/prefill/decode), $5 = worker name.
const char *kDies = "#!/bin/sh\necho \"child $1 $5 says bye\" >&2\necho \"partial line, no newline\"\nexit 3\n";
const char *kSleeps = "#!/bin/sh\necho \"child $1 $5 up\"\nexec sleep 30\n";
const char *kStubborn = "#!/bin/sh\ntrap '' TERM\necho \"child $1 $5 ignores TERM\"\nwhile :; do sleep 0.05; done\n";
const char *kKillsSelf = "#!/bin/sh\nkill -9 $$\n";
// Up long enough to count as up (a port-0 child counts after 500 ms alive), then it dies.
const char *kDiesLater =
    "#!/bin/sh\necho \"child $1 $5 says bye\" >&2\necho \"partial line, no newline\"\nsleep 0.7\nexit 3\n";

std::string one_worker(int port, const char *role = "both") {
  return std::string(R"({"model": "m.gguf", "workers": [{"name": "w0", "role": ")") + role + R"(", "port": )" +
         std::to_string(port) + "}]}";
}

TEST(Launch, UnknownNodeExits2) {
  TempDir d;
  std::string cfg = d.write("c.json", one_worker(0));
  Launcher l(d, {"--config", cfg, "--node", "elsewhere"});
  ASSERT_TRUE(l.wait_exit(10000));
  EXPECT_TRUE(WIFEXITED(l.status));
  EXPECT_EQ(WEXITSTATUS(l.status), 2);
  std::string e = slurp(l.err);
  EXPECT_NE(e.find("node \"elsewhere\" is not in the file (nodes: local)"), std::string::npos) << e;
}

TEST(Launch, ConfigErrorExits2NamingTheField) {
  TempDir d;
  std::string cfg = d.write("c.json", R"({"model": "m", "workers": [{"port": 1}, {"port": 99999}]})");
  Launcher l(d, {"--config", cfg, "--node", "local"});
  ASSERT_TRUE(l.wait_exit(10000));
  EXPECT_EQ(WEXITSTATUS(l.status), 2);
  std::string e = slurp(l.err);
  EXPECT_NE(e.find(cfg + ": workers[1].port: expected an integer 0..65535"), std::string::npos) << e;
}

TEST(Launch, UsageErrorsExit2) {
  TempDir d;
  {
    Launcher l(d, {"--node", "local"});
    ASSERT_TRUE(l.wait_exit(10000));
    EXPECT_EQ(WEXITSTATUS(l.status), 2);
    EXPECT_NE(slurp(l.err).find("--config and --node are required"), std::string::npos);
  }
  {
    std::string cfg = d.write("c.json", one_worker(0));
    Launcher l(d, {"--config", cfg, "--node", "local", "--dserve", d.path + "/missing-binary"});
    ASSERT_TRUE(l.wait_exit(10000));
    EXPECT_EQ(WEXITSTATUS(l.status), 2);
    EXPECT_NE(slurp(l.err).find("missing-binary: cannot execute"), std::string::npos) << slurp(l.err);
  }
}

// A child that fails before it ever came up (bad model, port in use, bad option: a restart meets the same) stops the
// node at once: exit 1 within 5 s, with what the child said.
TEST(Launch, StartUpFailureStopsTheNodeAtOnce) {
  TempDir d;
  std::string bin = d.write("child.sh", kDies, true);
  std::string cfg = d.write("c.json", one_worker(0));
  auto t0 = Clock::now();
  Launcher l(d, {"--config", cfg, "--node", "local", "--dserve", bin, "--backoff-ms", "10"});
  ASSERT_TRUE(l.wait_exit(20000)) << slurp(l.err);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(WIFEXITED(l.status));
  EXPECT_EQ(WEXITSTATUS(l.status), 1);
  std::string e = slurp(l.err);
  EXPECT_EQ(count(e, "[w0] child both w0 says bye\n"), 1) << e;
  EXPECT_NE(e.find("failed at start-up: exited with status 3: child both w0 says bye; not restarting it"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("restarting in"), std::string::npos) << e;
  EXPECT_EQ(slurp(l.out).find("ready"), std::string::npos);
}

// A child that was up once and then dies is restarted (with back-off), at most 5 times a minute.
TEST(Launch, CrashIsReportedRestartedThenGivenUp) {
  TempDir d;
  std::string bin = d.write("child.sh", kDiesLater, true);
  std::string cfg = d.write("c.json", one_worker(0));
  auto t0 = Clock::now();
  Launcher l(d, {"--config", cfg, "--node", "local", "--dserve", bin, "--backoff-ms", "10"});
  ASSERT_TRUE(l.wait_exit(20000)) << slurp(l.err);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  EXPECT_TRUE(WIFEXITED(l.status));
  EXPECT_EQ(WEXITSTATUS(l.status), 1); // every child dead
  std::string e = slurp(l.err), o = slurp(l.out);
  // the child's own output, prefixed with its name, on the matching stream; 1 start + 5 restarts
  EXPECT_EQ(count(e, "[w0] child both w0 says bye\n"), 6) << e;
  EXPECT_EQ(count(o, "[w0] partial line, no newline\n"), 6) << o;
  EXPECT_NE(e.find("w0 (pid "), std::string::npos);
  EXPECT_EQ(count(e, "crashed: exited with status 3; restarting in"), 5) << e;
  EXPECT_NE(e.find("restart 5 of at most 5 per 60 s"), std::string::npos) << e;
  EXPECT_EQ(e.find("restart 6 of"), std::string::npos) << e;
  EXPECT_NE(e.find("w0 (pid"), std::string::npos);
  EXPECT_NE(e.find("exited with status 3; it was restarted 5 times in the last 60 s: failed permanently"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("every child has failed"), std::string::npos) << e;
  EXPECT_NE(o.find("dserve: node local ready"), std::string::npos) << o; // it was up before it died
}

TEST(Launch, DeathBySignalIsReported) {
  TempDir d;
  std::string bin = d.write("child.sh", kKillsSelf, true);
  std::string cfg = d.write("c.json", one_worker(0, "decode"));
  Launcher l(d, {"--config", cfg, "--node", "local", "--dserve", bin, "--backoff-ms", "5"});
  ASSERT_TRUE(l.wait_exit(20000)) << slurp(l.err);
  EXPECT_EQ(WEXITSTATUS(l.status), 1);
  std::string e = slurp(l.err);
  EXPECT_NE(e.find("failed at start-up: was killed by signal 9"), std::string::npos) << e;
}

TEST(Launch, WaitsForHealthThenStopsOnSigterm) {
  TempDir d;
  FakeHealth router(3);  // the router answers 503 three times before 200
  Listener worker;       // stands in for w0's control port
  std::string bin = d.write("child.sh", kSleeps, true);
  std::string cfg = d.write("c.json", R"({"model": "m", "router": {"port": )" + std::to_string(router.l.port) +
                                          R"(}, "workers": [{"name": "w0", "port": )" + std::to_string(worker.port) +
                                          R"(}, {"name": "w1", "port": 0, "role": "decode"}]})");
  Launcher l(d, {"--config", cfg, "--node", "local", "--dserve", bin});
  std::string want = "dserve: node local ready (router http://127.0.0.1:" + std::to_string(router.l.port) +
                     ", workers: w0, w1)\n";
  ASSERT_TRUE(l.wait_for(l.out, want, 20000)) << slurp(l.out) << slurp(l.err);
  EXPECT_GE(router.served.load(), 4); // not ready on a 503
  std::string o = slurp(l.out);
  EXPECT_NE(o.find("[router] child router  up"), std::string::npos) << o;
  EXPECT_NE(o.find("[w0] child both w0 up"), std::string::npos) << o;
  EXPECT_NE(o.find("[w1] child decode w1 up"), std::string::npos) << o;
  EXPECT_EQ(count(o, "ready ("), 1);
  auto t0 = Clock::now();
  kill(l.pid, SIGTERM);
  ASSERT_TRUE(l.wait_exit(5000)) << slurp(l.err);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  EXPECT_TRUE(WIFEXITED(l.status));
  EXPECT_EQ(WEXITSTATUS(l.status), 0);
  std::string e = slurp(l.err);
  EXPECT_EQ(count(e, "stopped: was killed by signal 15"), 3) << e;
  EXPECT_EQ(e.find("crashed"), std::string::npos) << e;
  EXPECT_NE(e.find("node local: stopped"), std::string::npos) << e;
}

TEST(Launch, NotReadyWhileAPortIsClosed) {
  TempDir d;
  int port;
  { Listener tmp; port = tmp.port; } // a port that nobody listens on now
  std::string bin = d.write("child.sh", kSleeps, true);
  std::string cfg = d.write("c.json", one_worker(port));
  Launcher l(d, {"--config", cfg, "--node", "local", "--dserve", bin});
  EXPECT_TRUE(l.wait_for(l.out, "[w0] child both w0 up", 10000));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(slurp(l.out).find("ready"), std::string::npos);
  kill(l.pid, SIGINT);
  ASSERT_TRUE(l.wait_exit(5000));
  EXPECT_EQ(WEXITSTATUS(l.status), 0);
}

TEST(Launch, StubbornChildIsKilledAfterGrace) {
  TempDir d;
  std::string bin = d.write("child.sh", kStubborn, true);
  std::string cfg = d.write("c.json", one_worker(0));
  Launcher l(d, {"--config", cfg, "--node", "local", "--dserve", bin, "--grace-s", "0.5"});
  ASSERT_TRUE(l.wait_for(l.out, "ready (workers: w0)", 10000)) << slurp(l.out) << slurp(l.err);
  ASSERT_TRUE(l.wait_for(l.out, "ignores TERM", 10000));
  auto t0 = Clock::now();
  kill(l.pid, SIGTERM);
  ASSERT_TRUE(l.wait_exit(5000)) << slurp(l.err);
  auto took = Clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(400));
  EXPECT_LT(took, std::chrono::seconds(3));
  EXPECT_EQ(WEXITSTATUS(l.status), 0);
  std::string e = slurp(l.err);
  EXPECT_NE(e.find("w0 (pid"), std::string::npos);
  EXPECT_NE(e.find("did not stop within the grace period; killing it"), std::string::npos) << e;
  EXPECT_NE(e.find("stopped: was killed by signal 9"), std::string::npos) << e;
}

TEST(Launch, OnlyThisNodesRolesStart) {
  TempDir d;
  std::string bin = d.write("child.sh", kSleeps, true);
  std::string cfg = d.write("c.json", R"({"model": "m", "secret": "launch-test-secret-0123456789abcdef",
    "nodes": {"a": {}, "b": {}}, "router": {"node": "a", "port": 0},
    "workers": [{"name": "pa", "node": "a", "role": "prefill", "port": 0},
                {"name": "db", "node": "b", "role": "decode", "port": 0}]})");
  Launcher l(d, {"--config", cfg, "--node", "b", "--dserve", bin});
  ASSERT_TRUE(l.wait_for(l.out, "dserve: node b ready (workers: db)\n", 10000)) << slurp(l.out) << slurp(l.err);
  kill(l.pid, SIGTERM);
  ASSERT_TRUE(l.wait_exit(5000));
  std::string o = slurp(l.out);
  EXPECT_EQ(o.find("[pa]"), std::string::npos) << o;
  EXPECT_EQ(o.find("[router]"), std::string::npos) << o;
  EXPECT_NE(o.find("[db] child decode db up"), std::string::npos) << o;
}

// A config without a secret: the launcher makes one per launch, hands it to the children only through a 0600 file in
// a 0700 folder named by $DSERVE_SECRET_FILE (never on a command line), and removes both when it stops.
TEST(Launch, PerLaunchSecret) {
  unsetenv("DSERVE_SECRET");
  unsetenv("DSERVE_SECRET_FILE");
  TempDir d;
  std::string bin = d.write("child.sh",
                            "#!/bin/sh\necho \"child $1 $5 args $# file=$DSERVE_SECRET_FILE mode=$(stat -c %a "
                            "\"$DSERVE_SECRET_FILE\") dirmode=$(stat -c %a \"$(dirname \"$DSERVE_SECRET_FILE\")\") "
                            "len=$(tr -d '\\n' < \"$DSERVE_SECRET_FILE\" | wc -c)\"\nexec sleep 30\n",
                            true);
  std::string cfg = d.write("c.json", one_worker(0));
  Launcher l(d, {"--config", cfg, "--node", "local", "--dserve", bin});
  ASSERT_TRUE(l.wait_for(l.out, "len=", 10000)) << slurp(l.out) << slurp(l.err);
  std::string o = slurp(l.out);
  EXPECT_NE(o.find("child both w0 args 5 file=/"), std::string::npos) << o; // argv: role --config F --name w0
  EXPECT_NE(o.find("mode=600 dirmode=700 len=64"), std::string::npos) << o;
  size_t at = o.find("file=") + 5;
  std::string file = o.substr(at, o.find(' ', at) - at);
  EXPECT_EQ(access(file.c_str(), F_OK), 0) << file;
  EXPECT_NE(slurp(l.err).find("made a per-launch secret"), std::string::npos) << slurp(l.err);
  kill(l.pid, SIGTERM);
  ASSERT_TRUE(l.wait_exit(5000));
  EXPECT_NE(access(file.c_str(), F_OK), 0) << file << " outlived the launcher";
  EXPECT_NE(access(file.substr(0, file.rfind('/')).c_str(), F_OK), 0);
}

// Several nodes without a secret: each launcher would make a different one, so it refuses.
TEST(Launch, NoSecretOnSeveralNodesIsRefused) {
  unsetenv("DSERVE_SECRET");
  unsetenv("DSERVE_SECRET_FILE");
  TempDir d;
  std::string cfg = d.write("c.json", R"({"model": "m", "nodes": {"a": {}, "b": {}},
    "workers": [{"name": "pa", "node": "a", "role": "both", "port": 0}, {"name": "db", "node": "b", "role": "both", "port": 0}]})");
  Launcher l(d, {"--config", cfg, "--node", "b", "--dserve", d.write("child.sh", kSleeps, true)});
  ASSERT_TRUE(l.wait_exit(5000));
  EXPECT_EQ(WEXITSTATUS(l.status), 2);
  EXPECT_NE(slurp(l.err).find("no shared secret, and the cluster has 2 nodes"), std::string::npos) << slurp(l.err);
}

} // namespace
