// cmd/main.c: the dserve binary: the command table, and dispatch to each subcommand (cmd_*.c).
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmds.h"

typedef struct cmd {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *args; // the usage line after the name
  const char *help;
} cmd;

static const cmd CMDS[] = {
    {"inspect", cmd_inspect, "MODEL.gguf", "print architecture, hyper-parameters and tensors"},
    {"tokenize", cmd_tokenize, "MODEL.gguf TEXT", "print token ids"},
    {"generate", cmd_generate, "--model M --prompt P ...", "generate text on this machine"},
    {"perplexity", cmd_perplexity, "--model M --file TEXT ...", "perplexity and KL divergence vs llama.cpp"},
    {"serve", cmd_serve, "MODEL.gguf [options]", "serve one model on this machine, no config file needed"},
    {"launch", cmd_launch, "--config F --node N", "start the roles a cluster config gives this node"},
    {"router", cmd_router, "--config F", "run the OpenAI-compatible HTTP router"},
    {"both", cmd_both, "--config F --name W", "run a colocated prefill+decode worker"},
    {"prefill", cmd_prefill, "--config F --name W", "run a prefill worker"},
    {"decode", cmd_decode, "--config F --name W", "run a decode worker"},
    {"kvxfer-bench", cmd_kvxfer_bench, "--backend B ...", "KV transfer bandwidth and latency"},
    {"members", cmd_members, "--router URL", "list a router's workers: state, load, KV use"},
};

// A process that dies of a fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE) says where first: the frames, as
// "binary(+offset)" (addr2line -e dserve -f offset), and the first line of /proc/self/maps (where the binary was
// loaded). Only async-signal-safe calls; the handler resets itself and raises the signal again, so the process
// dies of it as before (the launcher reports and restarts it). Sanitizer builds keep their own reports.
static void put(const char *s) {
  if (write(STDERR_FILENO, s, strlen(s)) < 0) return;
}

static void on_fault(int sig) {
  char num[16], *p = num + sizeof num;
  *--p = 0;
  int v = sig;
  do *--p = (char)('0' + v % 10); while ((v /= 10) > 0);
  put("dserve: fatal signal ");
  put(p);
  put(", backtrace:\n");
  void *frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  int fd = open("/proc/self/maps", O_RDONLY);
  char line[256];
  ssize_t n = fd >= 0 ? read(fd, line, sizeof line - 1) : -1;
  if (n > 0) {
    line[n] = 0;
    char *nl = strchr(line, '\n');
    if (nl) nl[1] = 0;
    put("dserve: loaded at ");
    put(line);
  }
  if (fd >= 0) close(fd);
  raise(sig); // pending until the handler returns, then the default action: also when the signal came from kill
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DSERVE_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define DSERVE_ASAN 1
#endif

static void install_fault_report(void) {
#ifdef DSERVE_ASAN
  (void)on_fault; // the sanitizer's own fault report is the better one
#else
  void *warm[1];
  backtrace(warm, 1); // loads the unwinder now: the first call may allocate, which a handler must not
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fault;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
#endif
}

static void usage(FILE *f) {
  fprintf(f, "usage: dserve COMMAND [ARGS]   (dserve COMMAND --help: its options; dserve --version)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++) fprintf(f, "  %-13s %-25s %s\n", CMDS[i].name, CMDS[i].args, CMDS[i].help);
}

static int version(void) {
  printf("dserve %s (%s build, CUDA backend %s)\n", DSERVE_VERSION, DSERVE_BUILD_TYPE, DSERVE_WITH_CUDA ? "on" : "off");
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  // `dserve --version` and `dserve COMMAND --version` alike
  if (!strcmp(argv[1], "--version") || (argc == 3 && !strcmp(argv[2], "--version"))) return version();
  install_fault_report();
  for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
    if (!strcmp(argv[1], CMDS[i].name)) return CMDS[i].run(argc - 1, argv + 1);
  fprintf(stderr, "dserve: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
