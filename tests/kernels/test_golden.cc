// tests/kernels/test_golden.cc: the kernels on real weight blocks against the gguf Python package's dequantization.
// tests/kernels/golden/quants.txt (scripts/golden/make_quant_golden.py) holds, per weight type, a few blocks of
// real tensors (the Gemma 3 270M Q4_K_M and SmolLM2 GGUFs, or real F32 values quantized by gguf.quants) with the
// floats gguf.quants.dequantize gives for them; no model is needed at run time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/krn.h"

namespace {

struct Golden {
  krn_type type;
  int n;                    // elements
  std::string source;
  std::vector<uint8_t> raw; // the blocks as the GGUF stores them
  std::vector<float> deq;   // gguf.quants.dequantize(raw)
};

std::vector<uint8_t> unhex(const std::string &h) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back((uint8_t)std::stoul(h.substr(i, 2), nullptr, 16));
  return out;
}

int type_by_name(const std::string &name) {
  for (int t = 0; t < 40; t++)
    if (name == krn_type_name(t)) return t;
  return -1;
}

std::vector<Golden> load_golden() {
  std::ifstream in(DSERVE_SOURCE_DIR "/tests/kernels/golden/quants.txt");
  std::vector<Golden> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("block ", 0) == 0) {
      std::istringstream ss(line.substr(6));
      std::string name;
      Golden g{};
      ss >> name >> g.n;
      std::getline(ss, g.source);
      g.type = (krn_type)type_by_name(name);
      out.push_back(g);
    } else if (line.rfind("raw ", 0) == 0 && !out.empty()) {
      out.back().raw = unhex(line.substr(4));
    } else if (line.rfind("deq ", 0) == 0 && !out.empty()) {
      std::string h = line.substr(4);
      for (size_t i = 0; i + 8 <= h.size(); i += 8) {
        uint32_t bits = (uint32_t)std::stoul(h.substr(i, 8), nullptr, 16);
        float f;
        memcpy(&f, &bits, 4);
        out.back().deq.push_back(f);
      }
    }
  }
  return out;
}

bool is_float_type(krn_type t) { return t == KRN_F32 || t == KRN_F16 || t == KRN_BF16; }

} // namespace

TEST(KrnGolden, FileHoldsEveryNewType) {
  std::vector<Golden> gs = load_golden();
  ASSERT_FALSE(gs.empty()) << "tests/kernels/golden/quants.txt missing or empty";
  for (krn_type t : {KRN_Q5_0, KRN_Q5_1, KRN_Q4_K, KRN_Q5_K, KRN_Q6_K, KRN_BF16, KRN_Q8_0, KRN_Q4_1}) {
    bool found = false;
    for (const Golden &g : gs) found |= g.type == t;
    EXPECT_TRUE(found) << krn_type_name(t);
  }
  for (const Golden &g : gs) {
    SCOPED_TRACE(g.source);
    ASSERT_TRUE(krn_type_known(g.type));
    ASSERT_EQ(g.n % krn_type_block(g.type), 0);
    ASSERT_EQ(g.raw.size(), krn_row_size(g.type, g.n));
    ASSERT_EQ(g.deq.size(), (size_t)g.n);
  }
}

// Dequantization (get_rows) is exact: every backend computes each weight in ggml's float order, as gguf.quants
// does, so the floats must be bit for bit the package's.
TEST(KrnGolden, GetRowsMatchesGgufBitForBit) {
  std::vector<Golden> gs = load_golden();
  ASSERT_FALSE(gs.empty());
  for (const char *name : {"scalar", "avx2", "avx2vnni", "avx512"}) {
    const krn_backend *be = krn_cpu_by_name(name);
    if (!be) continue; // this CPU lacks it
    krn_ctx c{};
    c.be = be;
    for (const Golden &g : gs) {
      SCOPED_TRACE(testing::Message() << name << " " << krn_type_name(g.type) << " " << g.source);
      std::vector<float> out((size_t)g.n, NAN);
      int32_t id = 0;
      be->get_rows(&c, out.data(), g.raw.data(), g.type, &id, 1, g.n);
      for (int e = 0; e < g.n; e++) {
        uint32_t a, b;
        memcpy(&a, &out[e], 4);
        memcpy(&b, &g.deq[e], 4);
        ASSERT_EQ(a, b) << "element " << e << ": " << out[e] << " vs gguf " << g.deq[e];
      }
    }
  }
}

// matmul on the real blocks: the row (repeated as 3 weight rows, so the 2-row tiles run too) against random
// activations. Scalar: the double dot of the gguf floats within 1e-5 of sum|w||x|. SIMD: the int8 activation
// bound of tests/kernels/test_ops.cc (sum over 32-blocks of max|x_b| / 254 * sum|w_b|, x1.01) on top.
TEST(KrnGolden, MatmulOnRealBlocks) {
  std::vector<Golden> gs = load_golden();
  ASSERT_FALSE(gs.empty());
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const char *name : {"scalar", "avx2", "avx2vnni", "avx512"}) {
    const krn_backend *be = krn_cpu_by_name(name);
    if (!be) continue;
    krn_ctx c{};
    c.be = be;
    const bool quantized_x = std::string(name) != "scalar";
    for (const Golden &g : gs) {
      SCOPED_TRACE(testing::Message() << name << " " << krn_type_name(g.type) << " " << g.source);
      const int m = 3, k = g.n;
      std::vector<uint8_t> w;
      for (int j = 0; j < m; j++) w.insert(w.end(), g.raw.begin(), g.raw.end());
      for (int n : {1, 5}) {
        std::vector<float> x((size_t)n * k), y((size_t)n * m, NAN);
        for (auto &v : x) v = u(rng);
        be->matmul(&c, y.data(), w.data(), g.type, x.data(), n, k, m);
        for (int i = 0; i < n; i++) {
          double exact = 0, mag = 0, qbound = 0;
          for (int b = 0; b < k / 32; b++) {
            double amax = 0, wabs = 0;
            for (int e = b * 32; e < b * 32 + 32; e++) {
              double xv = x[(size_t)i * k + e];
              exact += (double)g.deq[e] * xv;
              mag += std::fabs(g.deq[e] * xv);
              amax = std::max(amax, std::fabs(xv));
              wabs += std::fabs(g.deq[e]);
            }
            qbound += amax / 127 / 2 * wabs;
          }
          const double tol = (quantized_x && !is_float_type(g.type) ? 1.01 * qbound : 0) + 1e-5 * mag + 1e-30;
          for (int j = 0; j < m; j++) ASSERT_NEAR(y[(size_t)i * m + j], exact, tol) << "n=" << n << " i=" << i << " j=" << j;
        }
      }
    }
  }
}
