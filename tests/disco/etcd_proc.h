// tests/disco/etcd_proc.h: a real etcd (Debian's etcd-server) for a test: loopback, free ports, a temp data dir;
// killed and restarted on the same ports and data to play an outage.
#ifndef DSERVE_TESTS_ETCD_PROC_H
#define DSERVE_TESTS_ETCD_PROC_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "disco/etcd.h"

namespace etcdtest {

// The etcd binary ("" when it is not installed).
inline std::string etcd_binary() {
  const char *env = getenv("DSERVE_ETCD");
  if (env && *env) return access(env, X_OK) == 0 ? env : "";
  for (const char *p : {"/usr/bin/etcd", "/usr/local/bin/etcd"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

// A port free on 127.0.0.1 now (bound to port 0 and released).
inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (bind(fd, (sockaddr *)&a, sizeof a) || getsockname(fd, (sockaddr *)&a, &n)) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

struct Etcd {
  std::string bin, dir, url;
  std::vector<std::string> extra; // more etcd flags (TLS, ...)
  std::string name = "t", initial_cluster; // a member of a several-member cluster: its name and the whole list
  std::string scheme = "http";
  int client_port = 0, peer_port = 0;
  pid_t pid = -1;

  Etcd() : bin(etcd_binary()) {
    char tmpl[] = "/tmp/dserve-etcd-XXXXXX";
    if (mkdtemp(tmpl)) dir = tmpl;
    client_port = free_port();
    peer_port = free_port();
  }
  ~Etcd() {
    kill9();
    if (!dir.empty()) (void)!system(("rm -rf " + dir).c_str());
  }
  std::string peer_url() const { return "http://127.0.0.1:" + std::to_string(peer_port); }
  // Starts it (on the same ports and data as before after kill9) and waits until it answers. false: it did not.
  bool start(const dsc_etcd_opts *probe_opts = nullptr) {
    launch();
    return wait_up(probe_opts);
  }
  void launch() {
    url = scheme + "://127.0.0.1:" + std::to_string(client_port);
    std::string peer = peer_url();
    std::vector<std::string> args = {bin, "--name", name, "--data-dir", dir + "/data", "--listen-client-urls", url,
                                     "--advertise-client-urls", url, "--listen-peer-urls", peer,
                                     "--initial-advertise-peer-urls", peer, "--initial-cluster",
                                     initial_cluster.empty() ? name + "=" + peer : initial_cluster,
                                     "--log-level", "error"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid = fork();
    if (pid == 0) {
      std::vector<char *> av;
      for (auto &a : args) av.push_back((char *)a.c_str());
      av.push_back(nullptr);
      int fd = open((dir + "/etcd.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execv(av[0], av.data());
      _exit(127);
    }
  }
  bool wait_up(const dsc_etcd_opts *probe_opts = nullptr) {
    const char *ep = url.c_str();
    dsc_etcd_opts o{};
    if (probe_opts) o = *probe_opts;
    o.endpoints = &ep;
    o.n_endpoints = 1;
    dsc_etcd *c = nullptr;
    char err[512];
    if (dsc_etcd_new(&o, &c, err, sizeof err)) return false;
    bool up = false;
    for (int i = 0; i < 200 && !up; i++) { // up to 20 s
      dsc_kv *kvs;
      int n;
      int64_t rev;
      int rc = dsc_range(c, "/probe", 0, &kvs, &n, &rev, err, sizeof err);
      if (rc == 0) dsc_kvs_free(kvs, n);
      up = rc == 0 || rc == DSC_EPROTO; // an auth-enabled etcd answers too
      if (!up) usleep(100000);
    }
    dsc_etcd_free(c);
    return up;
  }
  void kill9() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
};

} // namespace etcdtest

#define SKIP_WITHOUT_ETCD()                                                                                           \
  do {                                                                                                                \
    if (etcdtest::etcd_binary().empty())                                                                              \
      GTEST_SKIP() << "no etcd binary (Debian package etcd-server; scripts/setup.sh installs it)";                   \
  } while (0)

#endif
