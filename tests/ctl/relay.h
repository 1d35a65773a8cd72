// tests/ctl/relay.h: a man in the middle for the control tests: accepts one connection on a port of its own, dials
// the real listener, forwards bytes both ways, keeps a copy of them, and can change or hold back what it forwards.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "ctl/frame.h"

struct Relay {
  int lfd = -1, port = 0, target;
  std::thread t;
  std::mutex mu;
  std::string up, down; // what went connector -> listener (up) and back (down), as forwarded
  // Called on each chunk going up before it is forwarded (at = its offset in the up stream); may change it.
  std::function<void(std::string &chunk, size_t at)> tamper_up;
  std::atomic<bool> stop{false};

  explicit Relay(int target_port) : target(target_port) {
    char err[256];
    lfd = ctl_frame_listen("127.0.0.1", 0, &port, err, sizeof err);
  }
  void start() {
    t = std::thread([this] { run(); });
  }
  void run() {
    int a = accept(lfd, nullptr, nullptr);
    char err[256];
    int b = ctl_frame_connect("127.0.0.1", target, 2000, err, sizeof err);
    if (a < 0 || b < 0) {
      if (a >= 0) close(a);
      if (b >= 0) close(b);
      return;
    }
    char buf[65536];
    while (!stop) {
      struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
      if (poll(p, 2, 100) <= 0) continue;
      bool done = false;
      for (int i = 0; i < 2 && !done; i++) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = recv(p[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          done = true;
          break;
        }
        std::string chunk(buf, (size_t)n);
        {
          std::lock_guard<std::mutex> g(mu);
          if (i == 0 && tamper_up) tamper_up(chunk, up.size());
          (i == 0 ? up : down) += chunk;
        }
        if (send(i == 0 ? b : a, chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0) done = true;
      }
      if (done) break;
    }
    close(a);
    close(b);
  }
  std::string seen() {
    std::lock_guard<std::mutex> g(mu);
    return up + down;
  }
  ~Relay() {
    stop = true;
    if (lfd >= 0) shutdown(lfd, SHUT_RDWR);
    if (t.joinable()) t.join();
    if (lfd >= 0) close(lfd);
  }
};
