// kvstore/kvs_tls.c: TLS to the store (OpenSSL's libssl) over our nonblocking sockets: the client context (CA, an
// optional client certificate), the handshake under a deadline, and record I/O that says "would block" rather than
// waiting.
#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>

#include "kvstore/kvs_int.h"
#include "util/clock.h"

static void ssl_err(char *err, size_t errlen, const char *what) {
  char e[256] = "unknown error";
  unsigned long code = ERR_get_error();
  if (code) ERR_error_string_n(code, e, sizeof e);
  ERR_clear_error();
  utl_seterr(err, errlen, "%s: %s", what, e);
}

SSL_CTX *kvs_tls_ctx_new(const char *ca, const char *cert, const char *key, char *err, size_t errlen) {
  if (!cert != !key) {
    utl_seterr(err, errlen, "kvstore: tls_cert and tls_key: give both (a client certificate) or neither");
    return NULL;
  }
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) {
    ssl_err(err, errlen, "kvstore: TLS context");
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL); // the store proves who it is, always
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  char what[600];
  int ok = ca ? SSL_CTX_load_verify_locations(ctx, ca, NULL) : SSL_CTX_set_default_verify_paths(ctx);
  snprintf(what, sizeof what, "kvstore: tls_ca '%s'", ca ? ca : "(the system's trust store)");
  if (ok == 1 && cert) {
    ok = SSL_CTX_use_certificate_chain_file(ctx, cert);
    snprintf(what, sizeof what, "kvstore: tls_cert '%s'", cert);
    if (ok == 1) {
      ok = SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM);
      snprintf(what, sizeof what, "kvstore: tls_key '%s'", key);
    }
    if (ok == 1) {
      ok = SSL_CTX_check_private_key(ctx);
      snprintf(what, sizeof what, "kvstore: tls_key '%s' does not match tls_cert '%s'", key, cert);
    }
  }
  if (ok != 1) {
    ssl_err(err, errlen, what);
    SSL_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}

void kvs_tls_ctx_free(SSL_CTX *ctx) { SSL_CTX_free(ctx); }

// Waits for fd to be readable (want_read) or writable until deadline: 1 ready, 0 timed out, -1 failed.
static int wait_fd(int fd, int want_read, int64_t deadline_ms) {
  for (;;) {
    int64_t left = deadline_ms - utl_now_ms();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = (short)(want_read ? POLLIN : POLLOUT)};
    int k = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
    if (k < 0 && errno == EINTR) continue;
    return k < 0 ? -1 : k > 0;
  }
}

kvs_conn_rc kvs_tls_connect(SSL_CTX *ctx, int fd, const char *host, int64_t deadline_ms, SSL **out, char *err,
                            size_t errlen) {
  *out = NULL;
  SSL *ssl = SSL_new(ctx);
  if (!ssl || SSL_set_fd(ssl, fd) != 1) {
    ssl_err(err, errlen, "TLS");
    SSL_free(ssl);
    return KVS_C_IO;
  }
  // The certificate must name the endpoint we dialled: its IP address, or its host name (also sent as SNI).
  unsigned char ip[16];
  int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
  int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host)
                 : SSL_set1_host(ssl, host) == 1 && SSL_set_tlsext_host_name(ssl, host) == 1;
  if (!ok) {
    ssl_err(err, errlen, "TLS: the name to verify");
    SSL_free(ssl);
    return KVS_C_IO;
  }
  for (;;) {
    int r = SSL_connect(ssl);
    if (r == 1) break;
    int e = SSL_get_error(ssl, r);
    int w = e == SSL_ERROR_WANT_READ    ? wait_fd(fd, 1, deadline_ms)
            : e == SSL_ERROR_WANT_WRITE ? wait_fd(fd, 0, deadline_ms)
                                        : -1;
    if (w > 0) continue;
    if (w == 0) {
      utl_seterr(err, errlen, "TLS handshake with %s: timed out", host);
    } else {
      long v = SSL_get_verify_result(ssl);
      char what[400];
      snprintf(what, sizeof what, "TLS handshake with %s%s%s", host, v != X509_V_OK ? ": " : "",
               v != X509_V_OK ? X509_verify_cert_error_string(v) : "");
      ssl_err(err, errlen, what);
    }
    SSL_free(ssl);
    return w == 0 ? KVS_C_TIMEOUT : KVS_C_IO;
  }
  *out = ssl;
  return KVS_C_OK;
}

void kvs_tls_free(SSL *ssl) {
  if (!ssl) return;
  SSL_set_quiet_shutdown(ssl, 1); // no close_notify round trip: the socket closes next
  SSL_free(ssl);
}

long kvs_tls_send(SSL *ssl, const void *p, size_t n) {
  size_t done = 0;
  int r = SSL_write_ex(ssl, p, n, &done);
  if (r == 1) return (long)done;
  int e = SSL_get_error(ssl, r);
  ERR_clear_error();
  return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}

long kvs_tls_recv(SSL *ssl, void *p, size_t n) {
  size_t got = 0;
  int r = SSL_read_ex(ssl, p, n, &got);
  if (r == 1) return (long)got;
  int e = SSL_get_error(ssl, r);
  ERR_clear_error();
  return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}
