// cmd/cmd_members.c: `dserve members --router URL`: the router's membership view (GET /v1/cluster) as a table.
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmds.h"
#include "util/buf.h"

#define USAGE "usage: dserve members --router URL [--api-key KEY | --api-key-file FILE] [--json]\n"

static size_t on_body(char *p, size_t size, size_t n, void *arg) {
  return utl_buf_add(arg, p, size * n) ? 0 : size * n;
}

// The first line of path into key (cap), as --api-key-file reads it. 0, or -1 with a message on stderr.
static int read_key_file(const char *path, char *key, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f || !fgets(key, (int)cap, f)) {
    fprintf(stderr, "dserve members: cannot read an API key from %s\n", path);
    if (f) fclose(f);
    return -1;
  }
  fclose(f);
  key[strcspn(key, "\r\n")] = 0;
  return 0;
}

// A number field as text ("-" when null or absent); perc: as a percentage.
static void num(const cJSON *o, const char *k, int perc, char *out, size_t cap) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(v)) snprintf(out, cap, "-");
  else if (perc) snprintf(out, cap, "%.0f%%", v->valuedouble * 100);
  else snprintf(out, cap, "%.0f", v->valuedouble);
}

static const char *str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : "-";
}

enum { N_COL = 9 };

// One table row's cells (c[N_COL][...]) from member m; the reason is printed after them.
static void row(const cJSON *m, char c[N_COL][64]) {
  snprintf(c[0], 64, "%s", str(m, "name"));
  snprintf(c[1], 64, "%s", str(m, "role"));
  snprintf(c[2], 64, "%s", str(m, "address"));
  num(m, "incarnation", 0, c[3], 64);
  snprintf(c[4], 64, "%s", str(m, "state"));
  num(m, "running", 0, c[5], 64);
  num(m, "waiting", 0, c[6], 64);
  num(m, "kv_running_perc", 1, c[7], 64);
  num(m, "kv_cached_perc", 1, c[8], 64);
}

static int print_table(const cJSON *view) {
  const cJSON *ms = cJSON_GetObjectItemCaseSensitive(view, "members");
  if (!cJSON_IsArray(ms)) {
    fprintf(stderr, "dserve members: the router's answer has no \"members\" list (is this a dserve router?)\n");
    return 1;
  }
  static const char *const head[N_COL] = {"NAME", "ROLE", "ADDRESS", "INCARNATION", "STATE", "RUNNING", "WAITING",
                                          "KV_RUNNING", "KV_CACHED"};
  int w[N_COL];
  for (int k = 0; k < N_COL; k++) w[k] = (int)strlen(head[k]);
  const cJSON *m;
  cJSON_ArrayForEach(m, ms) {
    char c[N_COL][64];
    row(m, c);
    for (int k = 0; k < N_COL; k++)
      if ((int)strlen(c[k]) > w[k]) w[k] = (int)strlen(c[k]);
  }
  printf("model %s: %d member(s)\n", str(view, "model"), cJSON_GetArraySize(ms));
  for (int k = 0; k < N_COL; k++) printf("%-*s  ", w[k], head[k]);
  printf("REASON\n");
  cJSON_ArrayForEach(m, ms) {
    char c[N_COL][64];
    row(m, c);
    for (int k = 0; k < N_COL; k++) printf("%-*s  ", w[k], c[k]);
    const cJSON *why = cJSON_GetObjectItemCaseSensitive(m, "reason");
    printf("%s\n", cJSON_IsString(why) ? why->valuestring : "");
  }
  return 0;
}

int cmd_members(int argc, char **argv) {
  const char *router = NULL, *key = NULL, *key_file = NULL;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf(USAGE "  lists every worker the router knows, from its config and from etcd, linked or not (GET\n"
             "  URL/v1/cluster, docs/openai.md): name, role, address, incarnation, state (linked, draining, down,\n"
             "  pending, refused) and why, sequences running and waiting, and KV use (held by sequences, cached).\n"
             "  --router URL          the router, http://HOST:PORT (with or without /v1)\n"
             "  --api-key KEY         the router's API key (default: $OPENAI_API_KEY, as the openai client reads it)\n"
             "  --api-key-file FILE   the key, the file's first line (keeps it out of the process list)\n"
             "  --json                print the router's JSON as it came\n");
      return 0;
    }
    if (!strcmp(argv[i], "--router") && i + 1 < argc) router = argv[++i];
    else if (!strcmp(argv[i], "--api-key") && i + 1 < argc) key = argv[++i];
    else if (!strcmp(argv[i], "--api-key-file") && i + 1 < argc) key_file = argv[++i];
    else if (!strcmp(argv[i], "--json")) json = 1;
    else {
      fprintf(stderr, "dserve members: unknown or incomplete option '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (!router || (strncmp(router, "http://", 7) && strncmp(router, "https://", 8))) {
    fprintf(stderr, "dserve members: --router http://HOST:PORT is needed (see --help)\n");
    return 2;
  }
  if (key && key_file) {
    fprintf(stderr, "dserve members: give --api-key or --api-key-file, not both\n");
    return 2;
  }
  char kbuf[512] = "";
  if (key_file && read_key_file(key_file, kbuf, sizeof kbuf)) return 2;
  if (!key_file) snprintf(kbuf, sizeof kbuf, "%s", key ? key : getenv("OPENAI_API_KEY") ? getenv("OPENAI_API_KEY") : "");
  char url[1024];
  size_t n = strlen(router);
  while (n && router[n - 1] == '/') n--;
  if (n >= 3 && !strncmp(router + n - 3, "/v1", 3)) n -= 3; // as an openai client's base_url writes it
  snprintf(url, sizeof url, "%.*s/v1/cluster", (int)n, router);
  utl_buf body = {0};
  char cerr[CURL_ERROR_SIZE] = "", auth[600];
  long status = 0;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL *h = curl_easy_init();
  struct curl_slist *hdr = NULL;
  if (kbuf[0]) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", kbuf);
    hdr = curl_slist_append(hdr, auth);
  }
  CURLcode rc = CURLE_OUT_OF_MEMORY;
  if (h) {
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
  }
  curl_slist_free_all(hdr);
  curl_global_cleanup();
  int out = 1;
  cJSON *view = rc == CURLE_OK && body.p ? cJSON_ParseWithLength(body.p, body.n) : NULL;
  if (rc != CURLE_OK) {
    fprintf(stderr, "dserve members: GET %s: %s\n", url, cerr[0] ? cerr : curl_easy_strerror(rc));
  } else if (status != 200) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(view, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    fprintf(stderr, "dserve members: GET %s: HTTP %ld: %s%s\n", url, status,
            cJSON_IsString(msg) ? msg->valuestring : "(no error message)",
            status == 401 ? " (give --api-key, --api-key-file or $OPENAI_API_KEY)"
            : status == 404 ? " (a router from before /v1/cluster?)"
                            : "");
  } else if (!view) {
    fprintf(stderr, "dserve members: GET %s: the answer is not JSON\n", url);
  } else if (json) {
    printf("%.*s\n", (int)body.n, body.p);
    out = 0;
  } else {
    out = print_table(view);
  }
  cJSON_Delete(view);
  utl_buf_free(&body);
  return out;
}
