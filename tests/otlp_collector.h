// tests/otlp_collector.h: an OTLP/HTTP collector on a loopback port for the tracing tests: answers every POST 200
// and keeps the requests (head and body).
#ifndef DSERVE_TESTS_OTLP_COLLECTOR_H
#define DSERVE_TESTS_OTLP_COLLECTOR_H

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// A TCP socket bound to a free loopback port (*port).
inline int bind_loopback(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, (sockaddr *)&a, sizeof a), 0);
  socklen_t n = sizeof a;
  getsockname(fd, (sockaddr *)&a, &n);
  *port = ntohs(a.sin_port);
  return fd;
}

// A collector on a loopback port: answers every POST 200 and keeps the bodies.
struct Collector {
  int fd = -1, port = 0;
  std::thread th;
  std::mutex mu;
  std::vector<std::string> bodies;
  std::atomic<bool> stop{false};
  Collector() {
    fd = bind_loopback(&port);
    listen(fd, 16);
    th = std::thread([this] {
      for (;;) {
        int c = accept(fd, nullptr, nullptr);
        if (c < 0 || stop) {
          if (c >= 0) close(c);
          return;
        }
        std::string req;
        char b[65536];
        size_t want = std::string::npos;
        while (want == std::string::npos || req.size() < want) {
          ssize_t k = recv(c, b, sizeof b, 0);
          if (k <= 0) break;
          req.append(b, (size_t)k);
          size_t h = req.find("\r\n\r\n"), cl = req.find("Content-Length: ");
          if (h != std::string::npos && cl != std::string::npos) want = h + 4 + std::stoul(req.substr(cl + 16));
        }
        {
          std::lock_guard<std::mutex> g(mu);
          bodies.push_back(req);
        }
        const char *ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        send(c, ok, strlen(ok), MSG_NOSIGNAL);
        close(c);
      }
    });
  }
  ~Collector() {
    stop = true;
    shutdown(fd, SHUT_RDWR);
    close(fd);
    th.join();
  }
  std::string all() {
    std::lock_guard<std::mutex> g(mu);
    std::string s;
    for (auto &b : bodies) s += b;
    return s;
  }
};

#endif
