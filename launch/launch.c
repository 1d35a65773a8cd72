// launch/launch.c: the launcher's supervisor: child processes, output relay, health probes, restarts, shutdown.
#include "launch/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl/secret.h"
#include "util/clock.h"
#include "util/log.h"

#define LCH_LINE 4096

typedef struct lch_stream {
  int fd;              // read end of the child's stdout or stderr; -1 = closed
  int out;             // where its lines go (STDOUT_FILENO or STDERR_FILENO)
  char buf[LCH_LINE];  // (len) a partial line
  size_t len;
} lch_stream;

typedef struct lch_child {
  char name[64];        // "router" or the worker's name
  char *argv[8];        // (borrowed strings) NULL-terminated
  int is_router;
  char host[64];        // where to probe
  int port;             // 0 = cannot probe: counted up after LCH_ALIVE_MS alive
  pid_t pid;            // 0 = not running
  lch_stream s[2];      // stdout, stderr
  int ready;            // answered the health probe since its last start
  int was_ready;        // has been up at least once
  char last[256];       // its last line on stderr (what it said when it failed)
  int failed;           // given up on
  int64_t restart_at;   // ms; 0 = none pending
  int64_t started_at;   // ms
  int64_t next_probe;   // ms
  int64_t hist[64];     // times of restarts (n_hist), oldest first
  int n_hist;
} lch_child;

static void lch_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void lch_say(const char *fmt, ...) {
  if (!strcmp(utl_log_format(), "json")) { // JSON lines: the launcher's own lines are JSON too
    va_list ap;
    va_start(ap, fmt);
    utl_vlogl(UTL_LOG_INFO, "launch", fmt, ap);
    va_end(ap);
    return;
  }
  char line[1024];
  int n = snprintf(line, sizeof line, "dserve: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m > 0) n += m;
  if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}

static void lch_write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return; // the reader went away: drop the output
    p += w;
    n -= (size_t)w;
  }
}

static void lch_emit(lch_child *c, const lch_stream *s, const char *p, size_t n) {
  if (s == &c->s[1] && n) snprintf(c->last, sizeof c->last, "%.*s", (int)(n < 255 ? n : 255), p);
  char pre[80];
  int k = n && p[0] == '{' ? 0 : snprintf(pre, sizeof pre, "[%s] ", c->name); // a JSON line names its component
  char line[LCH_LINE + 96];
  memcpy(line, pre, (size_t)k);
  memcpy(line + k, p, n);
  line[(size_t)k + n] = '\n';
  lch_write_all(s->out, line, (size_t)k + n + 1);
}

// Relays whatever can be read now; closes the stream at EOF (flushing a partial line).
static void lch_pump(lch_child *c, lch_stream *s) {
  while (s->fd >= 0) {
    ssize_t r = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (r <= 0) {
      if (s->len) lch_emit(c, s, s->buf, s->len);
      s->len = 0;
      close(s->fd);
      s->fd = -1;
      return;
    }
    s->len += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++)
      if (s->buf[i] == '\n') {
        lch_emit(c, s, s->buf + start, i - start);
        start = i + 1;
      }
    if (start == 0 && s->len == sizeof s->buf) start = s->len, lch_emit(c, s, s->buf, s->len); // an over-long line
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
  }
}

static void lch_close_streams(lch_child *c) {
  for (int i = 0; i < 2; i++)
    if (c->s[i].fd >= 0) {
      lch_pump(c, &c->s[i]);
      if (c->s[i].fd >= 0) {
        if (c->s[i].len) lch_emit(c, &c->s[i], c->s[i].buf, c->s[i].len);
        c->s[i].len = 0;
        close(c->s[i].fd);
        c->s[i].fd = -1;
      }
    }
}

static int lch_spawn(lch_child *c, const char *exe, const sigset_t *oldmask, int64_t now) {
  lch_close_streams(c);
  int po[2] = {-1, -1}, pe[2] = {-1, -1};
  if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
    lch_say("%s: cannot create pipes: %s", c->name, strerror(errno));
    if (po[0] >= 0) close(po[0]), close(po[1]);
    return -1;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    lch_say("%s: cannot fork: %s", c->name, strerror(errno));
    close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
    return -1;
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, oldmask, NULL);
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0) dup2(nul, STDIN_FILENO);
    dup2(po[1], STDOUT_FILENO);
    dup2(pe[1], STDERR_FILENO);
    execv(exe, c->argv);
    char msg[512];
    int n = snprintf(msg, sizeof msg, "cannot run %s: %s\n", exe, strerror(errno));
    ssize_t w = write(STDERR_FILENO, msg, (size_t)n);
    (void)w;
    _exit(127);
  }
  setpgid(pid, pid); // also in the parent, so a signal to the group right away finds it
  close(po[1]);
  close(pe[1]);
  fcntl(po[0], F_SETFL, O_NONBLOCK);
  fcntl(pe[0], F_SETFL, O_NONBLOCK);
  c->s[0].fd = po[0];
  c->s[1].fd = pe[0];
  c->pid = pid;
  c->ready = 0;
  c->started_at = now;
  c->next_probe = now;
  return 0;
}

// Non-blocking connect to host:port within timeout_ms; returns the socket or -1.
static int lch_connect(const char *host, int port, int timeout_ms) {
  if (!strcmp(host, "0.0.0.0")) host = "127.0.0.1";
  if (!strcmp(host, "::")) host = "::1";
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, ps, &hints, &ai) || !ai) return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(ai);
    return -1;
  }
  int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (rc && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  if (rc) {
    struct pollfd p = {fd, POLLOUT, 0};
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (poll(&p, 1, timeout_ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr) {
      close(fd);
      return -1;
    }
  }
  return fd;
}

// GET /health over HTTP/1.0; 1 when the status is 200.
static int lch_http_health(const char *host, int port, int timeout_ms) {
  int fd = lch_connect(host, port, timeout_ms);
  if (fd < 0) return 0;
  char req[256];
  int n = snprintf(req, sizeof req, "GET /health HTTP/1.0\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", host, port);
  int64_t deadline = utl_now_ms() + timeout_ms;
  size_t off = 0;
  while (off < (size_t)n) {
    ssize_t w = send(fd, req + off, (size_t)n - off, MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd p = {fd, POLLOUT, 0};
      int left = (int)(deadline - utl_now_ms());
      if (left <= 0 || poll(&p, 1, left) <= 0) break;
      continue;
    }
    if (w <= 0) break;
    off += (size_t)w;
  }
  char resp[64];
  size_t got = 0;
  while (off == (size_t)n && got < sizeof resp - 1) {
    ssize_t r = recv(fd, resp + got, sizeof resp - 1 - got, 0);
    if (r > 0) {
      got += (size_t)r;
      if (memchr(resp, '\n', got)) break;
      continue;
    }
    if (r == 0 || (errno != EAGAIN && errno != EINTR)) break;
    struct pollfd p = {fd, POLLIN, 0};
    int left = (int)(deadline - utl_now_ms());
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
  }
  close(fd);
  resp[got] = 0;
  // "HTTP/1.x 200 ..."
  return !strncmp(resp, "HTTP/1.", 7) && got >= 12 && !strncmp(resp + 8, " 200", 4);
}

// Port 0 cannot be probed: such a child counts as up once it has stayed alive this long.
#define LCH_ALIVE_MS 500

static int lch_probe(const lch_child *c, int64_t now) {
  if (!c->port) return now - c->started_at >= LCH_ALIVE_MS;
  if (c->is_router) return lch_http_health(c->host, c->port, 500);
  int fd = lch_connect(c->host, c->port, 300);
  if (fd < 0) return 0;
  close(fd);
  return 1;
}

static void lch_describe_status(int st, char *out, size_t cap) {
  if (WIFEXITED(st)) snprintf(out, cap, "exited with status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(out, cap, "was killed by signal %d (%s)%s", WTERMSIG(st), strsignal(WTERMSIG(st)),
             WCOREDUMP(st) ? ", core dumped" : "");
  else snprintf(out, cap, "ended (status 0x%x)", st);
}

// The launcher's private folder (0700, made on first need, removed on stop): the per-launch secret of a config
// that gives none, found by the children through $DSERVE_SECRET_FILE (never on a command line), and the effective
// config of a launch with overrides, which the children read instead of the file.
typedef struct lch_rundir {
  char dir[1024];    // "" until made
  char secret[1024]; // "" = none written
  char config[1024];
} lch_rundir;

static int lch_rundir_make(lch_rundir *r, char *err, size_t errlen) {
  if (r->dir[0]) return 0;
  const char *bases[] = {getenv("XDG_RUNTIME_DIR"), getenv("TMPDIR"), "/tmp"};
  for (size_t i = 0; i < sizeof bases / sizeof bases[0] && !r->dir[0]; i++) {
    if (!bases[i] || bases[i][0] != '/' || strlen(bases[i]) > 900) continue;
    snprintf(r->dir, sizeof r->dir, "%s/dserve-launch-XXXXXX", bases[i]);
    if (!mkdtemp(r->dir)) r->dir[0] = 0;
  }
  if (!r->dir[0]) {
    snprintf(err, errlen, "cannot make a private folder for the launch: %s", strerror(errno));
    return -1;
  }
  chmod(r->dir, 0700);
  return 0;
}

// Writes text as the 0600 file name inside the private folder; its path in out (1024 bytes).
static int lch_rundir_write(lch_rundir *r, const char *name, const char *text, size_t n, char *out, char *err,
                            size_t errlen) {
  if (lch_rundir_make(r, err, errlen)) return -1;
  snprintf(out, 1024, "%.960s/%.32s", r->dir, name); // dir: at most 900 + "/dserve-launch-XXXXXX"
  int fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  int ok = fd >= 0 && write(fd, text, n) == (ssize_t)n;
  int e = errno;
  if (fd >= 0) close(fd);
  if (!ok) {
    snprintf(err, errlen, "cannot write %s: %s", out, strerror(e));
    unlink(out);
    out[0] = 0;
    return -1;
  }
  return 0;
}

// The per-launch secret: 32 random bytes (hex).
static int lch_secret_make(lch_rundir *r, char *err, size_t errlen) {
  char hex[66];
  if (ctl_secret_generate(hex, err, errlen)) return -1;
  size_t n = strlen(hex);
  hex[n++] = '\n';
  int rc = lch_rundir_write(r, "secret", hex, n, r->secret, err, errlen);
  ctl_secret_wipe(hex, sizeof hex);
  return rc;
}

static void lch_rundir_remove(lch_rundir *r) {
  if (r->secret[0]) unlink(r->secret);
  if (r->config[0]) unlink(r->config);
  if (r->dir[0]) rmdir(r->dir);
  r->dir[0] = r->secret[0] = r->config[0] = 0;
}

void lch_defaults(lch_opts *o) {
  memset(o, 0, sizeof *o);
  o->grace_ms = 10000;
  o->backoff_ms = 250;
  o->max_restarts = 5;
  o->restart_window_ms = 60000;
  o->probe_ms = 200;
}

void lch_grace_for_drain(lch_opts *o, const cfg_cluster *cfg) {
  int need = cfg->router.drain_timeout_s * 1000 + 5000;
  if (cfg->has_router && o->grace_ms < need) o->grace_ms = need;
}

static void lch_signal_all(lch_child *ch, int n, int sig) {
  for (int i = 0; i < n; i++)
    if (ch[i].pid > 0) {
      if (kill(-ch[i].pid, sig)) kill(ch[i].pid, sig);
    }
}

static void lch_ready_line(const cfg_cluster *cfg, const char *node, const lch_child *ch, int n) {
  char line[2048];
  size_t k = (size_t)snprintf(line, sizeof line, "dserve: node %s ready (", node);
  int any = 0;
  for (int i = 0; i < n && k < sizeof line; i++)
    if (ch[i].is_router) {
      k += (size_t)snprintf(line + k, sizeof line - k, "router http://%s:%d", cfg->router.host, cfg->router.port);
      any = 1;
    }
  int nw = 0;
  for (int i = 0; i < n && k < sizeof line; i++)
    if (!ch[i].is_router)
      k += (size_t)snprintf(line + k, sizeof line - k, "%s%s", nw++ ? ", " : (any ? ", workers: " : "workers: "),
                            ch[i].name);
  if (k < sizeof line) k += (size_t)snprintf(line + k, sizeof line - k, ")\n");
  if (k > sizeof line - 1) k = sizeof line - 1;
  lch_write_all(STDOUT_FILENO, line, k);
}

int lch_run(const cfg_cluster *cfg, const lch_opts *o, char *err, size_t errlen) {
  if (!cfg || !o || !o->config_path || !o->node) {
    snprintf(err, errlen, "launch: missing config or node");
    return 2;
  }
  utl_log_format_default(cfg->logging.format); // its own lines; the children read it from the config too
  if (!cfg_has_node(cfg, o->node)) {
    char list[512] = "";
    size_t k = 0;
    for (int i = 0; i < cfg->n_nodes && k < sizeof list; i++)
      k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", cfg->nodes[i]);
    snprintf(err, errlen, "%s: node \"%s\" is not in the file (nodes: %s)", o->config_path, o->node, list);
    return 2;
  }
  char exe[4096];
  if (o->dserve) {
    snprintf(exe, sizeof exe, "%s", o->dserve);
  } else {
    ssize_t r = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (r <= 0) {
      snprintf(err, errlen, "cannot find this program's path (/proc/self/exe): %s", strerror(errno));
      return 2;
    }
    exe[r] = 0;
  }
  if (access(exe, X_OK)) {
    snprintf(err, errlen, "%s: cannot execute: %s", exe, strerror(errno));
    return 2;
  }

  lch_rundir rd = {0};
  // children of a launch with overrides read the effective config (written once: a restart reads the same)
  if (o->config_json && lch_rundir_write(&rd, "config.json", o->config_json, strlen(o->config_json), rd.config, err,
                                         errlen)) {
    lch_rundir_remove(&rd);
    return 2;
  }
  char *child_config = (char *)(o->config_json ? rd.config : o->config_path);
  int n = 0;
  lch_child *ch = calloc((size_t)cfg->n_workers + 1, sizeof *ch);
  if (!ch) {
    lch_rundir_remove(&rd);
    snprintf(err, errlen, "out of memory");
    return 2;
  }
  static char s_config[] = "--config", s_name[] = "--name";
  if (cfg->has_router && !strcmp(cfg->router.node, o->node)) {
    lch_child *c = &ch[n++];
    snprintf(c->name, sizeof c->name, "router");
    c->is_router = 1;
    snprintf(c->host, sizeof c->host, "%s", cfg->router.host);
    c->port = cfg->router.port;
    c->argv[0] = exe;
    c->argv[1] = (char *)"router";
    c->argv[2] = s_config;
    c->argv[3] = child_config;
  }
  for (int i = 0; i < cfg->n_workers; i++) {
    const cfg_worker *w = &cfg->workers[i];
    if (strcmp(w->node, o->node)) continue;
    lch_child *c = &ch[n++];
    snprintf(c->name, sizeof c->name, "%s", w->name);
    snprintf(c->host, sizeof c->host, "%s", w->host);
    c->port = w->port;
    c->argv[0] = exe;
    c->argv[1] = (char *)cfg_role_name(w->role);
    c->argv[2] = s_config;
    c->argv[3] = child_config;
    c->argv[4] = s_name;
    c->argv[5] = c->name;
  }
  if (!n) {
    lch_rundir_remove(&rd);
    free(ch);
    snprintf(err, errlen, "%s: node \"%s\" runs nothing (no router and no workers on it)", o->config_path, o->node);
    return 2;
  }
  // No secret in the config or the environment: one for this launch, which only works when this launcher runs the
  // whole cluster (cfg_resolve_secret already refused a config with a non-loopback host).
  if (!cfg->secret[0]) {
    if (cfg->n_nodes > 1) {
      lch_rundir_remove(&rd);
      free(ch);
      snprintf(err, errlen,
               "%s: no shared secret, and the cluster has %d nodes (each launcher would make a different one): set "
               "\"secret_file\" (the same file on every node) or %s / %s",
               o->config_path, cfg->n_nodes, CTL_SECRET_FILE_ENV, CTL_SECRET_ENV_VAR);
      return 2;
    }
    if (lch_secret_make(&rd, err, errlen) || setenv(CTL_SECRET_FILE_ENV, rd.secret, 1)) {
      lch_rundir_remove(&rd);
      free(ch);
      return 2;
    }
    unsetenv(CTL_SECRET_ENV_VAR);
    lch_say("node %s: no secret configured: made a per-launch secret (children read it from %s; removed on stop)",
            o->node, CTL_SECRET_FILE_ENV);
  }
  for (int i = 0; i < n; i++) {
    ch[i].s[0] = (lch_stream){.fd = -1, .out = STDOUT_FILENO};
    ch[i].s[1] = (lch_stream){.fd = -1, .out = STDERR_FILENO};
  }

  sigset_t mask, oldmask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, &oldmask);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    lch_rundir_remove(&rd);
    free(ch);
    snprintf(err, errlen, "signalfd: %s", strerror(errno));
    return 2;
  }
  struct sigaction ign = {0};
  ign.sa_handler = SIG_IGN;
  struct sigaction old_pipe;
  sigaction(SIGPIPE, &ign, &old_pipe);

  int64_t now = utl_now_ms();
  for (int i = 0; i < n; i++)
    if (lch_spawn(&ch[i], exe, &oldmask, now)) ch[i].restart_at = now + o->backoff_ms;
  {
    char names[1024] = "";
    size_t k = 0;
    for (int i = 0; i < n && k < sizeof names; i++)
      k += (size_t)snprintf(names + k, sizeof names - k, "%s%s (pid %d)", i ? ", " : "", ch[i].name, (int)ch[i].pid);
    lch_say("node %s: started %s", o->node, names);
  }

  int announced = 0, stopping = 0, start_failed = 0, rc = 0;
  int64_t kill_at = 0, next_wait_note = now + 30000;
  struct pollfd *pf = calloc((size_t)(2 * n + 1), sizeof *pf);
  int (*pmap)[2] = calloc((size_t)(2 * n + 1), sizeof *pmap);
  if (!pf || !pmap) {
    lch_say("out of memory; stopping");
    stopping = 1;
    kill_at = now;
    lch_signal_all(ch, n, SIGKILL);
  }
  for (;;) {
    now = utl_now_ms();
    // ---- done? ----
    int running = 0, alive = 0, open_streams = 0;
    for (int i = 0; i < n; i++) {
      running += ch[i].pid > 0;
      alive += !ch[i].failed;
      open_streams += (ch[i].s[0].fd >= 0) + (ch[i].s[1].fd >= 0);
    }
    if (stopping && !running) {
      rc = start_failed;
      break;
    }
    if (!stopping && !alive && !running) {
      lch_say("node %s: every child has failed; giving up", o->node);
      rc = 1;
      break;
    }
    // ---- timers ----
    int64_t next = now + 1000;
    if (stopping) {
      if (kill_at && now >= kill_at) {
        for (int i = 0; i < n; i++)
          if (ch[i].pid > 0) lch_say("%s (pid %d) did not stop within the grace period; killing it", ch[i].name, (int)ch[i].pid);
        lch_signal_all(ch, n, SIGKILL);
        kill_at = 0;
      }
      if (kill_at && kill_at < next) next = kill_at;
    } else {
      for (int i = 0; i < n; i++) {
        lch_child *c = &ch[i];
        if (!c->pid && !c->failed && c->restart_at && now >= c->restart_at) {
          c->restart_at = 0;
          if (lch_spawn(c, exe, &oldmask, now)) {
            c->restart_at = now + o->backoff_ms;
          } else {
            lch_say("restarted %s (pid %d)", c->name, (int)c->pid);
          }
        }
        if (c->pid > 0 && !c->ready && now >= c->next_probe) {
          if (lch_probe(c, now)) {
            c->ready = 1;
            if (c->was_ready) lch_say("%s is up again", c->name);
            c->was_ready = 1;
          } else {
            c->next_probe = utl_now_ms() + o->probe_ms;
          }
          now = utl_now_ms();
        }
        if (!c->pid && !c->failed && c->restart_at && c->restart_at < next) next = c->restart_at;
        if (c->pid > 0 && !c->ready && c->next_probe < next) next = c->next_probe;
      }
      int all = 1;
      for (int i = 0; i < n; i++) all &= ch[i].ready && ch[i].pid > 0;
      if (all && !announced) {
        lch_ready_line(cfg, o->node, ch, n);
        announced = 1;
      }
      if (!announced && now >= next_wait_note) {
        for (int i = 0; i < n; i++)
          if (!ch[i].ready && !ch[i].failed)
            lch_say("still waiting for %s (%s %s:%d)", ch[i].name, ch[i].is_router ? "GET /health on" : "control port",
                    ch[i].host, ch[i].port);
        next_wait_note = now + 30000;
      }
    }
    // ---- wait ----
    int np = 0;
    pf[np++] = (struct pollfd){sfd, POLLIN, 0};
    for (int i = 0; i < n; i++)
      for (int j = 0; j < 2; j++)
        if (ch[i].s[j].fd >= 0) {
          pmap[np][0] = i;
          pmap[np][1] = j;
          pf[np++] = (struct pollfd){ch[i].s[j].fd, POLLIN, 0};
        }
    (void)open_streams;
    int64_t wait = next - utl_now_ms();
    if (wait < 0) wait = 0;
    int pr = poll(pf, (nfds_t)np, (int)wait);
    if (pr < 0 && errno != EINTR) {
      lch_say("poll: %s", strerror(errno));
      break;
    }
    for (int k = 1; pr > 0 && k < np; k++)
      if (pf[k].revents) lch_pump(&ch[pmap[k][0]], &ch[pmap[k][0]].s[pmap[k][1]]);
    if (pr > 0 && pf[0].revents) {
      struct signalfd_siginfo si;
      int got_chld = 0;
      while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD) {
          got_chld = 1;
        } else if (!stopping) {
          lch_say("node %s: got %s; stopping %d child%s", o->node, strsignal((int)si.ssi_signo), running,
                  running == 1 ? "" : "ren");
          stopping = 1;
          kill_at = utl_now_ms() + o->grace_ms;
          lch_signal_all(ch, n, SIGTERM);
        } else {
          lch_say("node %s: second %s; killing the children now", o->node, strsignal((int)si.ssi_signo));
          lch_signal_all(ch, n, SIGKILL);
        }
      }
      if (got_chld) {
        int st;
        pid_t p;
        while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
          lch_child *c = NULL;
          for (int i = 0; i < n; i++)
            if (ch[i].pid == p) c = &ch[i];
          if (!c) continue;
          c->pid = 0;
          c->ready = 0;
          lch_close_streams(c); // its last words first
          char why[128];
          lch_describe_status(st, why, sizeof why);
          if (stopping) {
            lch_say("%s (pid %d) stopped: %s", c->name, (int)p, why);
            continue;
          }
          if (!c->was_ready) { // it never came up: a restart meets the same model, port or option, so say it now
            lch_say("%s (pid %d) failed at start-up: %s%s%s; not restarting it: stopping node %s", c->name, (int)p,
                    why, c->last[0] ? ": " : "", c->last, o->node);
            stopping = start_failed = 1;
            kill_at = utl_now_ms() + o->grace_ms;
            lch_signal_all(ch, n, SIGTERM);
            continue;
          }
          int64_t t = utl_now_ms();
          int in_window = 0;
          for (int h = 0; h < c->n_hist; h++) in_window += t - c->hist[h] < o->restart_window_ms;
          if (in_window >= o->max_restarts) {
            c->failed = 1;
            lch_say("%s (pid %d) %s; it was restarted %d times in the last %d s: failed permanently, not restarting",
                    c->name, (int)p, why, in_window, o->restart_window_ms / 1000);
            continue;
          }
          int64_t delay = o->backoff_ms;
          for (int h = 0; h < in_window && delay < 30000; h++) delay *= 2;
          if (delay > 30000) delay = 30000;
          if (c->n_hist == (int)(sizeof c->hist / sizeof c->hist[0])) {
            memmove(c->hist, c->hist + 1, sizeof c->hist - sizeof c->hist[0]);
            c->n_hist--;
          }
          c->hist[c->n_hist++] = t;
          c->restart_at = t + delay;
          lch_say("%s (pid %d) crashed: %s; restarting in %.2f s (restart %d of at most %d per %d s)", c->name,
                  (int)p, why, (double)delay / 1000.0, in_window + 1, o->max_restarts, o->restart_window_ms / 1000);
        }
      }
    }
  }
  for (int i = 0; i < n; i++) lch_close_streams(&ch[i]);
  if (stopping) lch_say("node %s: stopped", o->node);
  free(pf);
  free(pmap);
  free(ch);
  close(sfd);
  sigaction(SIGPIPE, &old_pipe, NULL);
  sigprocmask(SIG_SETMASK, &oldmask, NULL);
  if (rd.secret[0]) unsetenv(CTL_SECRET_FILE_ENV);
  lch_rundir_remove(&rd);
  return rc;
}
