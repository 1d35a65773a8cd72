// disco/etcd.c: the etcd v3 client (disco/etcd.h) over the HTTP/JSON gateway: one locked curl handle for unary calls,
// one of its own per watch, base64 keys and values, endpoint fail-over, TLS files and user/password auth.
#include "disco/etcd.h"

#include <curl/curl.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/crypto.h"
#include "util/err.h"

#define DEF_TIMEOUT_MS 2000
#define WATCH_POLL_MS 100 // how often a watch looks at its stop callback

struct dsc_etcd {
  pthread_mutex_t mu;   // guards h, good, token
  CURL *h;              // (owned) the unary calls' handle (keeps its connection)
  char **endpoints;     // (owned) (n_endpoints)
  int n_endpoints;
  int good;             // the endpoint that answered last
  char *ca_file, *cert_file, *key_file, *user; // (owned) or NULL
  char password[256];
  char token[512];      // etcd auth token ("" = none yet)
  int timeout_ms;
};

// The bytes of base64 text s as a NUL-terminated string (*n bytes without the NUL): 0, or -1 (not base64, or no memory).
static int b64_text(const char *s, char **out, size_t *n) {
  uint8_t *b = NULL;
  int rc = utl_base64_decode(s, strlen(s), &b, n);
  *out = (char *)b;
  return rc;
}

// ---- JSON helpers ----

// An int64 the gateway writes as a string (or, rarely, a number); def when absent.
static int64_t j_i64(const cJSON *o, const char *k, int64_t def) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (cJSON_IsString(v)) return strtoll(v->valuestring, NULL, 10);
  if (cJSON_IsNumber(v)) return (int64_t)v->valuedouble;
  return def;
}

// "key": base64(s) (n bytes) into o.
static int j_add_b64(cJSON *o, const char *k, const void *s, size_t n) {
  char *t = utl_base64_encode(s, n);
  int rc = t && cJSON_AddStringToObject(o, k, t) ? 0 : -1;
  free(t);
  return rc;
}

static int j_add_i64(cJSON *o, const char *k, int64_t v) {
  char t[32];
  snprintf(t, sizeof t, "%lld", (long long)v);
  return cJSON_AddStringToObject(o, k, t) ? 0 : -1;
}

// The end of the range of every key that starts with prefix: prefix with its last byte incremented (bytes 0xff
// dropped first); "\0" (every key) for a prefix of only 0xff.
static size_t prefix_end(const char *prefix, char *out, size_t cap) {
  size_t n = strlen(prefix);
  if (n >= cap) n = cap - 1;
  memcpy(out, prefix, n);
  while (n > 0 && (unsigned char)out[n - 1] == 0xff) n--;
  if (!n) {
    out[0] = 0;
    return 1;
  }
  out[n - 1]++;
  return n;
}

// {"key": key, "range_end": (prefix end)} into o.
static int j_add_range(cJSON *o, const char *key, int prefix) {
  char end[512];
  if (j_add_b64(o, "key", key, strlen(key))) return -1;
  if (!prefix) return 0;
  size_t n = prefix_end(key, end, sizeof end);
  return j_add_b64(o, "range_end", end, n);
}

// A kv object of the gateway into kv (owned strings). 0, or -1.
static int kv_from_json(const cJSON *j, dsc_kv *kv, int want_value) {
  memset(kv, 0, sizeof *kv);
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "key"), *v = cJSON_GetObjectItemCaseSensitive(j, "value");
  size_t n;
  if (!cJSON_IsString(k) || b64_text(k->valuestring, &kv->key, &n)) return -1;
  if (want_value) {
    if (!cJSON_IsString(v)) kv->value = calloc(1, 1);
    else if (b64_text(v->valuestring, &kv->value, &kv->value_len)) kv->value = NULL;
    if (!kv->value) return -1;
  }
  kv->mod_revision = j_i64(j, "mod_revision", 0);
  kv->create_revision = j_i64(j, "create_revision", 0);
  kv->lease = j_i64(j, "lease", 0);
  return 0;
}

void dsc_kv_clear(dsc_kv *kv) {
  free(kv->key);
  free(kv->value);
  memset(kv, 0, sizeof *kv);
}

void dsc_kvs_free(dsc_kv *kvs, int n) {
  for (int i = 0; kvs && i < n; i++) dsc_kv_clear(&kvs[i]);
  free(kvs);
}

// ---- the client ----

static size_t on_body(char *p, size_t sz, size_t nm, void *arg) {
  return utl_buf_add(arg, p, sz * nm) ? 0 : sz * nm;
}

static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static char *dup_or_null(const char *s) { return s && *s ? strdup(s) : NULL; }

// The handle's options common to every call: TLS files, timeouts, no signals (threads).
static void set_common(dsc_etcd *c, CURL *h) {
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->timeout_ms);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L); // a watch is idle for long: a vanished etcd host shows in ~20 s
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 5L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 5L);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  if (c->ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_file);
  if (c->cert_file) curl_easy_setopt(h, CURLOPT_SSLCERT, c->cert_file);
  if (c->key_file) curl_easy_setopt(h, CURLOPT_SSLKEY, c->key_file);
}

// The password in path: its first line, without the line end.
static int read_password(const char *path, char *out, size_t cap, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    utl_seterr(err, errlen, "etcd password file %s: cannot open it", path);
    return -1;
  }
  if (!fgets(out, (int)cap, f)) out[0] = 0;
  fclose(f);
  out[strcspn(out, "\r\n")] = 0;
  if (!out[0]) {
    utl_seterr(err, errlen, "etcd password file %s: empty", path);
    return -1;
  }
  return 0;
}

int dsc_etcd_new(const dsc_etcd_opts *o, dsc_etcd **out, char *err, size_t errlen) {
  *out = NULL;
  if (o->n_endpoints < 1) {
    utl_seterr(err, errlen, "etcd: no endpoint");
    return DSC_EPROTO;
  }
  static pthread_once_t once = PTHREAD_ONCE_INIT; // curl_global_init is not thread-safe: once per process
  pthread_once(&once, curl_init_once);
  dsc_etcd *c = calloc(1, sizeof *c);
  if (!c || !(c->endpoints = calloc((size_t)o->n_endpoints, sizeof *c->endpoints))) {
    free(c);
    utl_seterr(err, errlen, "out of memory");
    return DSC_ENOMEM;
  }
  pthread_mutex_init(&c->mu, NULL);
  c->n_endpoints = o->n_endpoints;
  for (int i = 0; i < o->n_endpoints; i++) {
    size_t n = strlen(o->endpoints[i]);
    while (n > 0 && o->endpoints[i][n - 1] == '/') n--; // "http://h:p/" and "http://h:p" are one endpoint
    c->endpoints[i] = strndup(o->endpoints[i], n);
  }
  c->ca_file = dup_or_null(o->ca_file);
  c->cert_file = dup_or_null(o->cert_file);
  c->key_file = dup_or_null(o->key_file);
  c->user = dup_or_null(o->user);
  c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : DEF_TIMEOUT_MS;
  int rc = 0;
  if (c->user && !o->password_file) {
    utl_seterr(err, errlen, "etcd: user %s has no password file", c->user);
    rc = DSC_EPROTO;
  } else if (c->user && read_password(o->password_file, c->password, sizeof c->password, err, errlen)) {
    rc = DSC_EPROTO;
  } else if (!(c->h = curl_easy_init())) {
    utl_seterr(err, errlen, "etcd: curl_easy_init failed");
    rc = DSC_ENOMEM;
  }
  if (rc) {
    dsc_etcd_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

void dsc_etcd_free(dsc_etcd *c) {
  if (!c) return;
  if (c->h) curl_easy_cleanup(c->h);
  for (int i = 0; i < c->n_endpoints; i++) free(c->endpoints[i]);
  free(c->endpoints);
  free(c->ca_file);
  free(c->cert_file);
  free(c->key_file);
  free(c->user);
  memset(c->password, 0, sizeof c->password);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

// One POST of body to endpoint ep's path on handle h: *resp the parsed answer (owned). DSC_EUNAVAIL when the
// endpoint did not answer (or answered 5xx without JSON), else 0 (the JSON may still hold an etcd error).
static int post(dsc_etcd *c, CURL *h, int ep, const char *path, const char *body, cJSON **resp, char *err,
                size_t errlen) {
  char url[600];
  snprintf(url, sizeof url, "%s%s", c->endpoints[ep], path);
  utl_buf b = {0};
  struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
  char auth[600];
  if (c->token[0]) {
    snprintf(auth, sizeof auth, "Authorization: %s", c->token);
    hd = curl_slist_append(hd, auth);
  }
  curl_easy_reset(h);
  set_common(c, h);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)c->timeout_ms);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  CURLcode cc = curl_easy_perform(h);
  curl_slist_free_all(hd);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  *resp = cc == CURLE_OK && !b.oom ? cJSON_ParseWithLength(b.p ? b.p : "", b.n) : NULL;
  int rc = 0;
  if (cc != CURLE_OK) {
    utl_seterr(err, errlen, "etcd %s: %s", c->endpoints[ep], curl_easy_strerror(cc));
    rc = DSC_EUNAVAIL;
  } else if (!*resp) {
    utl_seterr(err, errlen, "etcd %s%s: HTTP %ld, not JSON", c->endpoints[ep], path, status);
    rc = status >= 500 || status == 404 ? DSC_EUNAVAIL : DSC_EPROTO;
  }
  utl_buf_free(&b);
  return rc;
}

// The etcd error an answer holds (gateway: {"error": "...", "message": "...", "code": N}), or NULL.
static const char *etcd_error(const cJSON *r) {
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(r, "message");
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(r, "error");
  if (cJSON_IsString(m)) return m->valuestring;
  if (cJSON_IsString(e)) return e->valuestring;
  if (cJSON_IsObject(e)) {
    m = cJSON_GetObjectItemCaseSensitive(e, "message");
    return cJSON_IsString(m) ? m->valuestring : "error";
  }
  return NULL;
}

// Gets an auth token for c->user on endpoint ep (c->mu held).
static int authenticate(dsc_etcd *c, int ep, char *err, size_t errlen) {
  cJSON *q = cJSON_CreateObject(), *r = NULL;
  cJSON_AddStringToObject(q, "name", c->user);
  cJSON_AddStringToObject(q, "password", c->password);
  char *body = cJSON_PrintUnformatted(q);
  cJSON_Delete(q);
  c->token[0] = 0;
  int rc = body ? post(c, c->h, ep, "/v3/auth/authenticate", body, &r, err, errlen) : DSC_ENOMEM;
  free(body);
  if (!rc) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "token");
    if (cJSON_IsString(t) && strlen(t->valuestring) < sizeof c->token) {
      snprintf(c->token, sizeof c->token, "%s", t->valuestring);
    } else {
      utl_seterr(err, errlen, "etcd %s: authenticating as %s: %s", c->endpoints[ep], c->user,
                 etcd_error(r) ? etcd_error(r) : "no token");
      rc = DSC_EPROTO;
    }
  }
  cJSON_Delete(r);
  return rc;
}

static int is_auth_error(const char *m) { return strstr(m, "token") || strstr(m, "user name is empty"); }

// One unary call: body to path on the first endpoint that answers (the last good one first). *resp (owned) the
// answer when 0; an etcd error in the answer is DSC_ENOTFOUND (a lease it does not know) or DSC_EPROTO.
static int call(dsc_etcd *c, const char *path, cJSON *body_json, cJSON **resp, char *err, size_t errlen) {
  *resp = NULL;
  char *body = body_json ? cJSON_PrintUnformatted(body_json) : NULL;
  cJSON_Delete(body_json);
  if (!body) {
    utl_seterr(err, errlen, "out of memory");
    return DSC_ENOMEM;
  }
  pthread_mutex_lock(&c->mu);
  int rc = DSC_EUNAVAIL;
  for (int k = 0; k < c->n_endpoints && rc == DSC_EUNAVAIL; k++) {
    int ep = (c->good + k) % c->n_endpoints;
    if (c->user && !c->token[0] && (rc = authenticate(c, ep, err, errlen))) continue;
    rc = post(c, c->h, ep, path, body, resp, err, errlen);
    const char *e = rc ? NULL : etcd_error(*resp);
    if (e && c->user && is_auth_error(e)) { // the token expired: once more with a new one
      cJSON_Delete(*resp);
      *resp = NULL;
      if (!(rc = authenticate(c, ep, err, errlen))) rc = post(c, c->h, ep, path, body, resp, err, errlen);
      e = rc ? NULL : etcd_error(*resp);
    }
    if (!rc) c->good = ep;
    if (e) {
      utl_seterr(err, errlen, "etcd %s%s: %s", c->endpoints[ep], path, e);
      // no leader, or a member cut off from the others: another member may serve
      rc = strstr(e, "lease not found") ? DSC_ENOTFOUND
           : strstr(e, "no leader") || strstr(e, "timed out") || strstr(e, "unavailable") ? DSC_EUNAVAIL
                                                                                           : DSC_EPROTO;
      cJSON_Delete(*resp);
      *resp = NULL;
    }
  }
  pthread_mutex_unlock(&c->mu);
  free(body);
  return rc;
}

int dsc_lease_grant(dsc_etcd *c, int ttl_s, int64_t *id, char *err, size_t errlen) {
  cJSON *q = cJSON_CreateObject(), *r;
  if (q) j_add_i64(q, "TTL", ttl_s);
  int rc = call(c, "/v3/lease/grant", q, &r, err, errlen);
  if (!rc && (*id = j_i64(r, "ID", 0)) == 0) {
    utl_seterr(err, errlen, "etcd lease grant: no ID in the answer");
    rc = DSC_EPROTO;
  }
  cJSON_Delete(r);
  return rc;
}

int dsc_lease_keepalive(dsc_etcd *c, int64_t id, int *ttl_left, char *err, size_t errlen) {
  cJSON *q = cJSON_CreateObject(), *r;
  if (q) j_add_i64(q, "ID", id);
  int rc = call(c, "/v3/lease/keepalive", q, &r, err, errlen);
  if (!rc) {
    // a stream's message: {"result": {"ID", "TTL"}}; a lease etcd does not know comes back with no TTL
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(r, "result");
    int64_t ttl = j_i64(res ? res : r, "TTL", 0);
    *ttl_left = (int)ttl;
    if (ttl <= 0) {
      utl_seterr(err, errlen, "etcd: lease %lld has expired", (long long)id);
      rc = DSC_ENOTFOUND;
    }
  }
  cJSON_Delete(r);
  return rc;
}

int dsc_lease_revoke(dsc_etcd *c, int64_t id, char *err, size_t errlen) {
  cJSON *q = cJSON_CreateObject(), *r;
  if (q) j_add_i64(q, "ID", id);
  int rc = call(c, "/v3/lease/revoke", q, &r, err, errlen);
  cJSON_Delete(r);
  return rc;
}

int dsc_put(dsc_etcd *c, const char *key, const void *value, size_t value_len, int64_t lease, char *err,
            size_t errlen) {
  cJSON *q = cJSON_CreateObject(), *r;
  if (q && (j_add_b64(q, "key", key, strlen(key)) || j_add_b64(q, "value", value, value_len) ||
            (lease && j_add_i64(q, "lease", lease)))) {
    cJSON_Delete(q);
    q = NULL;
  }
  int rc = call(c, "/v3/kv/put", q, &r, err, errlen);
  cJSON_Delete(r);
  return rc;
}

int dsc_put_if_absent(dsc_etcd *c, const char *key, const void *value, size_t value_len, int64_t lease,
                      dsc_kv *holder, char *err, size_t errlen) {
  memset(holder, 0, sizeof *holder);
  cJSON *q = cJSON_CreateObject(), *r = NULL;
  cJSON *cmp = cJSON_AddArrayToObject(q, "compare"), *ok = cJSON_AddArrayToObject(q, "success"),
        *no = cJSON_AddArrayToObject(q, "failure");
  cJSON *c0 = cJSON_CreateObject(), *s0 = cJSON_CreateObject(), *f0 = cJSON_CreateObject();
  cJSON *put = s0 ? cJSON_AddObjectToObject(s0, "request_put") : NULL;
  cJSON *get = f0 ? cJSON_AddObjectToObject(f0, "request_range") : NULL;
  int bad = !cmp || !ok || !no || !c0 || !put || !get;
  if (c0) cJSON_AddItemToArray(cmp, c0);
  if (s0) cJSON_AddItemToArray(ok, s0);
  if (f0) cJSON_AddItemToArray(no, f0);
  bad = bad || j_add_b64(c0, "key", key, strlen(key)) || !cJSON_AddStringToObject(c0, "target", "CREATE") ||
        !cJSON_AddStringToObject(c0, "result", "EQUAL") || !cJSON_AddStringToObject(c0, "create_revision", "0") ||
        j_add_b64(put, "key", key, strlen(key)) || j_add_b64(put, "value", value, value_len) ||
        (lease && j_add_i64(put, "lease", lease)) || j_add_b64(get, "key", key, strlen(key));
  if (bad) {
    cJSON_Delete(q);
    q = NULL;
  }
  int rc = call(c, "/v3/kv/txn", q, &r, err, errlen);
  if (rc) return rc;
  // {"succeeded": true, ...}; the gateway leaves a false out: {"responses": [{"response_range": {"kvs": [...]}}]}
  if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "succeeded"))) {
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(r, "responses");
    const cJSON *rr = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(res, 0), "response_range");
    const cJSON *kv = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(rr, "kvs"), 0);
    if (kv && !kv_from_json(kv, holder, 1)) {
      utl_seterr(err, errlen, "etcd key %s exists", key);
      rc = DSC_EEXISTS;
    } else { // held when compared, gone by the range: the caller tries again
      dsc_kv_clear(holder);
      utl_seterr(err, errlen, "etcd key %s changed while it was put", key);
      rc = DSC_EUNAVAIL;
    }
  }
  cJSON_Delete(r);
  return rc;
}

int dsc_range(dsc_etcd *c, const char *key, int prefix, dsc_kv **kvs, int *n, int64_t *revision, char *err,
              size_t errlen) {
  *kvs = NULL;
  *n = 0;
  cJSON *q = cJSON_CreateObject(), *r;
  if (q && j_add_range(q, key, prefix)) {
    cJSON_Delete(q);
    q = NULL;
  }
  int rc = call(c, "/v3/kv/range", q, &r, err, errlen);
  if (rc) return rc;
  *revision = j_i64(cJSON_GetObjectItemCaseSensitive(r, "header"), "revision", 0);
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(r, "kvs");
  int m = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
  if (m && !(*kvs = calloc((size_t)m, sizeof **kvs))) rc = DSC_ENOMEM;
  for (const cJSON *it = rc || !m ? NULL : a->child; it; it = it->next) {
    if (kv_from_json(it, &(*kvs)[*n], 1)) {
      dsc_kvs_free(*kvs, *n + 1);
      *kvs = NULL;
      *n = 0;
      utl_seterr(err, errlen, "etcd range %s: a key or value that is not base64", key);
      rc = DSC_EPROTO;
      break;
    }
    (*n)++;
  }
  cJSON_Delete(r);
  return rc;
}

int dsc_delete(dsc_etcd *c, const char *key, int prefix, char *err, size_t errlen) {
  cJSON *q = cJSON_CreateObject(), *r;
  if (q && j_add_range(q, key, prefix)) {
    cJSON_Delete(q);
    q = NULL;
  }
  int rc = call(c, "/v3/kv/deleterange", q, &r, err, errlen);
  cJSON_Delete(r);
  return rc;
}

// ---- watch ----

typedef struct watch_ctx {
  dsc_event_fn on_event;
  void *arg;
  utl_buf in;          // bytes of the stream not parsed yet
  int64_t last;        // highest revision seen
  int status;          // 0 while the stream is good; DSC_ESTOPPED / DSC_EPROTO once it must end
  int created;         // etcd confirmed the watch
  char why[256];
} watch_ctx;

// One message of the stream: {"result": {"created"?, "canceled"?, "events": [...]}} or {"error": ...}.
static void watch_msg(watch_ctx *w, const cJSON *m) {
  const cJSON *res = cJSON_GetObjectItemCaseSensitive(m, "result");
  if (!res) {
    snprintf(w->why, sizeof w->why, "watch: %s", etcd_error(m) ? etcd_error(m) : "an answer with no result");
    w->status = DSC_EPROTO;
    return;
  }
  if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "created"))) w->created = 1;
  if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "canceled"))) {
    const cJSON *why = cJSON_GetObjectItemCaseSensitive(res, "cancel_reason");
    snprintf(w->why, sizeof w->why, "watch cancelled by etcd (compacted at %lld)%s%s",
             (long long)j_i64(res, "compact_revision", 0), cJSON_IsString(why) ? ": " : "",
             cJSON_IsString(why) ? why->valuestring : "");
    w->status = DSC_EPROTO;
    return;
  }
  const cJSON *evs = cJSON_GetObjectItemCaseSensitive(res, "events");
  for (const cJSON *e = cJSON_IsArray(evs) ? evs->child : NULL; e && !w->status; e = e->next) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "type");
    dsc_event ev = {.is_delete = cJSON_IsString(t) && !strcmp(t->valuestring, "DELETE")};
    if (kv_from_json(cJSON_GetObjectItemCaseSensitive(e, "kv"), &ev.kv, !ev.is_delete)) {
      snprintf(w->why, sizeof w->why, "watch: an event that does not parse");
      w->status = DSC_EPROTO;
    } else {
      if (ev.kv.mod_revision > w->last) w->last = ev.kv.mod_revision;
      if (w->on_event(w->arg, &ev)) w->status = DSC_ESTOPPED;
    }
    free(ev.kv.key);
    free(ev.kv.value);
  }
}

// Stream bytes: each message ends with a newline.
static size_t on_watch_bytes(char *p, size_t sz, size_t nm, void *arg) {
  watch_ctx *w = arg;
  if (w->status || utl_buf_add(&w->in, p, sz * nm)) return 0;
  char *nl;
  size_t used = 0;
  while (!w->status && (nl = memchr(w->in.p + used, '\n', w->in.n - used))) {
    cJSON *m = cJSON_ParseWithLength(w->in.p + used, (size_t)(nl - (w->in.p + used)));
    if (m) watch_msg(w, m);
    cJSON_Delete(m);
    used = (size_t)(nl - w->in.p) + 1;
  }
  if (used) {
    memmove(w->in.p, w->in.p + used, w->in.n - used + 1);
    w->in.n -= used;
  }
  return w->status ? 0 : sz * nm;
}

int dsc_watch(dsc_etcd *c, const char *prefix, int64_t start_revision, dsc_event_fn on_event, int (*stop)(void *arg),
              void *arg, int64_t *last_revision, char *err, size_t errlen) {
  watch_ctx w = {.on_event = on_event, .arg = arg, .last = start_revision > 0 ? start_revision - 1 : 0};
  *last_revision = w.last;
  cJSON *q = cJSON_CreateObject(), *cr = cJSON_AddObjectToObject(q, "create_request");
  if (!cr || j_add_range(cr, prefix, 1) || (start_revision > 0 && j_add_i64(cr, "start_revision", start_revision))) {
    cJSON_Delete(q);
    utl_seterr(err, errlen, "out of memory");
    return DSC_ENOMEM;
  }
  char *body = cJSON_PrintUnformatted(q);
  cJSON_Delete(q);
  pthread_mutex_lock(&c->mu);
  int ep = c->good;
  if (c->user && !c->token[0]) authenticate(c, ep, err, errlen);
  char auth[600] = "";
  if (c->token[0]) snprintf(auth, sizeof auth, "Authorization: %s", c->token);
  pthread_mutex_unlock(&c->mu);
  char url[600];
  snprintf(url, sizeof url, "%s/v3/watch", c->endpoints[ep]);
  CURL *h = curl_easy_init();
  CURLM *mh = curl_multi_init();
  struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
  if (auth[0]) hd = curl_slist_append(hd, auth);
  if (!h || !mh || !body || !hd) {
    utl_seterr(err, errlen, "out of memory");
    w.status = DSC_ENOMEM;
  } else {
    set_common(c, h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_watch_bytes);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &w);
    curl_multi_add_handle(mh, h);
    int running = 1;
    while (running && !w.status) {
      if (stop && stop(arg)) {
        w.status = DSC_ESTOPPED;
        break;
      }
      curl_multi_perform(mh, &running);
      if (running) curl_multi_poll(mh, NULL, 0, WATCH_POLL_MS, NULL);
    }
    CURLMsg *m;
    int left;
    CURLcode cc = CURLE_OK;
    while ((m = curl_multi_info_read(mh, &left)))
      if (m->msg == CURLMSG_DONE) cc = m->data.result;
    if (!w.status) { // the stream ended: etcd went away (or closed it)
      utl_seterr(err, errlen, "etcd %s: watch stream ended: %s", c->endpoints[ep],
                 cc != CURLE_OK ? curl_easy_strerror(cc) : "closed by etcd");
      w.status = DSC_EUNAVAIL;
      if (!w.created) { // it never answered: the next watch tries the next endpoint
        pthread_mutex_lock(&c->mu);
        if (c->good == ep) c->good = (ep + 1) % c->n_endpoints;
        pthread_mutex_unlock(&c->mu);
      }
    } else if (w.status == DSC_EPROTO) {
      utl_seterr(err, errlen, "etcd %s: %s", c->endpoints[ep], w.why);
    }
    curl_multi_remove_handle(mh, h);
  }
  curl_slist_free_all(hd);
  if (h) curl_easy_cleanup(h);
  if (mh) curl_multi_cleanup(mh);
  free(body);
  utl_buf_free(&w.in);
  *last_revision = w.last;
  return w.status;
}
