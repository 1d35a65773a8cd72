// disco/member.c: a worker's membership record: its key, its JSON, its model fingerprint and the file hash in it.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disco/disco.h"
#include "disco/etcd.h"
#include "util/err.h"

int dsc_file_hash(const char *path, char *out, size_t cap, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    utl_seterr(err, errlen, "%s: cannot open it for its hash", path);
    return -1;
  }
  uint64_t h = 1469598103934665603ULL; // FNV-1a 64
  unsigned char buf[65536];
  size_t got, total = 0;
  while (total < DSC_HASH_BYTES && (got = fread(buf, 1, sizeof buf, f)) > 0) {
    for (size_t i = 0; i < got && total + i < DSC_HASH_BYTES; i++) h = (h ^ buf[i]) * 1099511628211ULL;
    total += got;
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  snprintf(out, cap, "%ld-%016llx", size, (unsigned long long)h);
  return 0;
}

int dsc_same_model(const dsc_fingerprint *a, const dsc_fingerprint *b) {
  return !strcmp(a->arch, b->arch) && !strcmp(a->file_hash, b->file_hash);
}

void dsc_workers_prefix(const char *cluster, char *out, size_t cap) {
  snprintf(out, cap, "/dserve/%s/workers/", cluster);
}

void dsc_member_key(const char *cluster, const dsc_member *m, char *out, size_t cap) {
  snprintf(out, cap, "/dserve/%s/workers/%s/%s", cluster, cfg_role_name(m->role), m->name);
}

int dsc_member_encode(const dsc_member *m, utl_buf *out) {
  cJSON *o = cJSON_CreateObject(), *fp = cJSON_AddObjectToObject(o, "model");
  char inc[32];
  snprintf(inc, sizeof inc, "%lld", (long long)m->incarnation); // a string: JSON numbers lose int64 precision
  int bad = !fp || !cJSON_AddStringToObject(o, "name", m->name) ||
            !cJSON_AddStringToObject(o, "role", cfg_role_name(m->role)) ||
            !cJSON_AddStringToObject(o, "host", m->host) || !cJSON_AddNumberToObject(o, "port", m->port) ||
            !cJSON_AddStringToObject(o, "kvxfer_host", m->kvx_host) ||
            !cJSON_AddNumberToObject(o, "kvxfer_port", m->kvx_port) ||
            !cJSON_AddStringToObject(fp, "architecture", m->fp.arch) ||
            !cJSON_AddStringToObject(fp, "file_hash", m->fp.file_hash) ||
            !cJSON_AddStringToObject(fp, "kv_type", m->fp.kv_type) ||
            !cJSON_AddNumberToObject(fp, "block_size", m->fp.block_size) ||
            !cJSON_AddNumberToObject(o, "max_seqs", m->max_seqs) ||
            !cJSON_AddNumberToObject(o, "total_blocks", m->total_blocks) ||
            !cJSON_AddStringToObject(o, "incarnation", inc);
  char *s = bad ? NULL : cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!s) return -1;
  utl_buf_adds(out, s);
  free(s);
  return out->oom ? -1 : 0;
}

static int get_str(const cJSON *o, const char *k, char *out, size_t cap, int may_be_empty) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap || (!may_be_empty && !v->valuestring[0])) return -1;
  snprintf(out, cap, "%s", v->valuestring);
  return 0;
}

static int get_int(const cJSON *o, const char *k, int lo, int hi, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi) return -1;
  *out = (int)v->valuedouble;
  return 0;
}

int dsc_member_decode(const char *json, size_t n, dsc_member *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  cJSON *o = cJSON_ParseWithLength(json, n);
  const cJSON *fp = cJSON_GetObjectItemCaseSensitive(o, "model");
  char role[16], inc[32] = "";
  const char *bad = !cJSON_IsObject(o)                                         ? "not a JSON object"
                    : get_str(o, "name", m->name, sizeof m->name, 0)           ? "name"
                    : get_str(o, "role", role, sizeof role, 0) || cfg_role_parse(role, &m->role) ? "role"
                    : get_str(o, "host", m->host, sizeof m->host, 0)           ? "host"
                    : get_int(o, "port", 1, 65535, &m->port)                   ? "port"
                    : get_str(o, "kvxfer_host", m->kvx_host, sizeof m->kvx_host, 1) ? "kvxfer_host"
                    : get_int(o, "kvxfer_port", 0, 65535, &m->kvx_port)        ? "kvxfer_port"
                    : !cJSON_IsObject(fp)                                      ? "model"
                    : get_str(fp, "architecture", m->fp.arch, sizeof m->fp.arch, 0) ? "model.architecture"
                    : get_str(fp, "file_hash", m->fp.file_hash, sizeof m->fp.file_hash, 0) ? "model.file_hash"
                    : get_str(fp, "kv_type", m->fp.kv_type, sizeof m->fp.kv_type, 0) ? "model.kv_type"
                    : get_int(fp, "block_size", 1, 1 << 20, &m->fp.block_size) ? "model.block_size"
                    : get_int(o, "max_seqs", 1, 1 << 20, &m->max_seqs)         ? "max_seqs"
                    : get_int(o, "total_blocks", 0, 1 << 30, &m->total_blocks) ? "total_blocks"
                    : get_str(o, "incarnation", inc, sizeof inc, 0)            ? "incarnation"
                                                                               : NULL;
  cJSON_Delete(o);
  if (bad) {
    utl_seterr(err, errlen, "member record: %s %s", bad, strchr(bad, ' ') ? "" : "missing or wrong");
    return -1;
  }
  m->incarnation = strtoll(inc, NULL, 10);
  return 0;
}

void dsc_member_to_cfg(const dsc_member *m, cfg_worker *w) {
  memset(w, 0, sizeof *w);
  snprintf(w->name, sizeof w->name, "%s", m->name);
  w->role = m->role;
  snprintf(w->host, sizeof w->host, "%s", m->host);
  w->port = m->port;
  snprintf(w->kvx_host, sizeof w->kvx_host, "%s", m->kvx_host);
  w->kvx_port = m->kvx_port;
  w->max_seqs = m->max_seqs;
  w->block_size = m->fp.block_size;
  snprintf(w->kv_type, sizeof w->kv_type, "%s", m->fp.kv_type);
  cfg_worker_defaults(w);
}

void dsc_etcd_opts_of(const cfg_discovery *d, const char **endpoints, dsc_etcd_opts *o) {
  for (int i = 0; i < d->n_etcd; i++) endpoints[i] = d->etcd[i];
  *o = (dsc_etcd_opts){.endpoints = endpoints, .n_endpoints = d->n_etcd,
                       .ca_file = d->ca_file[0] ? d->ca_file : NULL, .cert_file = d->cert_file[0] ? d->cert_file : NULL,
                       .key_file = d->key_file[0] ? d->key_file : NULL, .user = d->user[0] ? d->user : NULL,
                       .password_file = d->password_file[0] ? d->password_file : NULL};
}
