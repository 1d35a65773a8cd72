// tests/models/model_util.h: what the real-model tests share: reading golden files, and a model on the CPU with a KV cache.
#ifndef DSERVE_TESTS_MODELS_MODEL_UTIL_H
#define DSERVE_TESTS_MODELS_MODEL_UTIL_H

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"
}

// A whole file's bytes ("" when it cannot be read: the test's parse then fails).
inline std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// base64 as the golden scripts write it (standard alphabet; stops at padding or anything else).
inline std::string b64decode(const std::string &in) {
  static const std::string abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  unsigned val = 0;
  int bits = -8;
  for (char c : in) {
    size_t p = abc.find(c);
    if (p == std::string::npos) break;
    val = ((val << 6) + (unsigned)p) & 0xFFFFFFu; // only the last 24 bits are ever read
    bits += 6;
    if (bits >= 0) {
      out.push_back((char)((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

// A GGUF loaded on a CPU backend (2 threads) with a paged KV cache of its own (16-token blocks).
struct ModelEngine {
  mdl_gguf *g = nullptr;
  krn_pool *pool = nullptr;
  krn_ctx kc{};
  mdl_llama *m = nullptr;
  mdl_kv kv{};
  const mdl_llama_cfg *cfg = nullptr;
  int next_block = 0;
  mdl_llama_opts opts{}; // set before open (f32_weights)
  char err[512] = {0};

  // be NULL: the best this CPU has. A failure is reported (ADD_FAILURE) with hint after the file's error.
  bool open(const char *model, int n_blocks, const krn_backend *be, krn_type kv_type, const char *hint = "") {
    if (mdl_gguf_open(model, &g, err, sizeof err) != 0) {
      ADD_FAILURE() << err << hint;
      return false;
    }
    pool = krn_pool_new(2, err, sizeof err);
    kc.be = be ? be : krn_cpu_best();
    kc.pool = pool;
    if (mdl_llama_load_opts(g, &kc, &opts, &m, err, sizeof err) != 0) {
      ADD_FAILURE() << err;
      return false;
    }
    cfg = mdl_llama_config(m);
    kv.type = kv_type;
    kv.block_size = 16;
    kv.n_blocks = n_blocks;
    kv.base = kc.be->alloc(&kc, mdl_kv_block_bytes(cfg, kv.type, kv.block_size) * (size_t)n_blocks);
    return kv.base != nullptr;
  }
  ~ModelEngine() {
    if (kv.base) kc.be->free(&kc, kv.base);
    mdl_llama_free(m);
    krn_pool_free(pool);
    mdl_gguf_close(g);
  }
  std::vector<int32_t> blocks(int n) { // a fresh, disjoint range of block ids
    std::vector<int32_t> b;
    for (int i = 0; i < n; i++) b.push_back(next_block++ % kv.n_blocks);
    return b;
  }
};

// A model loaded from GGUF bytes (kept alive here) on a cpu table, with an F32 KV cache of n_blocks blocks of 16;
// rc and err say how the load went.
struct MemModel {
  std::vector<uint8_t> bytes;
  mdl_gguf *g = nullptr;
  krn_pool *pool = nullptr; // (threads > 1)
  krn_ctx kc{};
  mdl_llama *m = nullptr;
  mdl_kv kv{};
  char err[512] = "";
  int rc = -1;
  MemModel(std::vector<uint8_t> b, const krn_backend *be, int n_blocks, int threads = 1, krn_type kv_type = KRN_F32)
      : bytes(std::move(b)) {
    kc.be = be;
    if (mdl_gguf_from_memory(bytes.data(), bytes.size(), &g, err, sizeof err) != 0) return;
    if (threads > 1 && !(pool = krn_pool_new(threads, err, sizeof err))) return;
    kc.pool = pool;
    rc = mdl_llama_load(g, &kc, &m, err, sizeof err);
    if (rc != 0) return;
    kv.type = kv_type;
    kv.block_size = 16;
    kv.n_blocks = n_blocks;
    kv.base = kc.be->alloc(&kc, mdl_kv_block_bytes(cfg(), kv.type, kv.block_size) * (size_t)n_blocks);
  }
  ~MemModel() {
    if (kv.base) kc.be->free(&kc, kv.base);
    mdl_llama_free(m);
    krn_pool_free(pool);
    mdl_gguf_close(g);
  }
  const mdl_llama_cfg *cfg() const { return mdl_llama_config(m); }
  // the last position's logits of an n-token prompt (token i is (37 i + 5) mod the vocabulary), in blocks 0, 1, ...
  std::vector<float> logits(int n) {
    std::vector<int32_t> toks, bt;
    for (int i = 0; i < n; i++) toks.push_back((i * 37 + 5) % cfg()->n_vocab);
    for (int i = 0; i < kv.n_blocks; i++) bt.push_back(i);
    mdl_seq sq{toks.data(), n, 0, bt.data(), kv.n_blocks, 1};
    std::vector<float> out((size_t)cfg()->n_vocab, NAN);
    EXPECT_EQ(mdl_llama_forward(m, &kv, &sq, 1, out.data(), nullptr, nullptr, err, sizeof err), 0) << err;
    return out;
  }
};

#endif
