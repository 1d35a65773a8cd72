// tests/run_dserve.h: runs the dserve binary as a user would and captures what it prints (every test module that
// drives a subcommand uses it).
#ifndef DSERVE_TESTS_RUN_DSERVE_H
#define DSERVE_TESTS_RUN_DSERVE_H

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace cmdtest {

// Runs `dserve ARGS` (bounded by 120 s); returns its exit status (-1 when it did not exit normally), stdout in *out
// and stderr in *err, or both folded into *out when err is nullptr.
inline int run_dserve(const std::string &args, std::string *out, std::string *err = nullptr) {
  char errf[] = "/tmp/dserve_cmd_err_XXXXXX";
  int fd = mkstemp(errf);
  if (fd < 0) return -1;
  close(fd);
  std::string cmd = std::string("timeout 120 '") + DSERVE_BINARY + "' " + args + (err ? " 2>" + std::string(errf) : " 2>&1");
  FILE *p = popen(cmd.c_str(), "r");
  out->clear();
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = p ? pclose(p) : -1;
  if (err) {
    err->clear();
    if (FILE *f = std::fopen(errf, "r")) {
      while ((n = fread(buf, 1, sizeof buf, f)) > 0) err->append(buf, n);
      std::fclose(f);
    }
  }
  unlink(errf);
  return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

} // namespace cmdtest
#endif
