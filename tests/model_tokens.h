// tests/model_tokens.h: the real SmolLM2 GGUF path and its tokenizer, loaded once per test process.
#ifndef DSERVE_TESTS_MODEL_TOKENS_H
#define DSERVE_TESTS_MODEL_TOKENS_H

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "models/gguf.h"
#include "models/tokenizer.h"

namespace dserve_test {

inline const char *model_path() { return DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf"; }

// Token ids of text with special tokens parsed (ChatML markup), as the router would send them.
inline std::vector<int> encode(const std::string &text) {
  struct Loaded {
    mdl_gguf *g = nullptr;
    mdl_tok *t = nullptr;
    std::string err;
    Loaded() {
      char e[256] = "";
      if (mdl_gguf_open(model_path(), &g, e, sizeof e) || mdl_tok_load(g, &t, e, sizeof e)) err = e;
    }
    ~Loaded() {
      mdl_tok_free(t);
      mdl_gguf_close(g);
    }
  };
  static Loaded m; // the test process's one copy: opening the model per call costs more than the tests
  std::vector<int> ids;
  if (!m.t) {
    ADD_FAILURE() << m.err;
    return ids;
  }
  char err[256];
  int32_t *p = nullptr;
  size_t n = 0;
  EXPECT_EQ(mdl_tok_encode(m.t, text.data(), text.size(), 1, &p, &n, err, sizeof err), 0) << err;
  ids.assign(p, p + n);
  free(p);
  return ids;
}

} // namespace dserve_test

#endif
