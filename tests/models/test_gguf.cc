// tests/models/test_gguf.cc: GGUF reader round-trips on tiny files written here, plus truncated and bit-flipped input.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

extern "C" {
#include "models/gguf.h"
}
#include "tests/models/gguf_writer.h"

namespace {

using dserve_test::GgufWriter;

GgufWriter sample() {
  GgufWriter w;
  w.str("general.architecture", "llama");
  w.scalar<uint8_t>("v.u8", MDL_GGUF_U8, 200);
  w.scalar<int8_t>("v.i8", MDL_GGUF_I8, -100);
  w.scalar<uint16_t>("v.u16", MDL_GGUF_U16, 60000);
  w.scalar<int16_t>("v.i16", MDL_GGUF_I16, -30000);
  w.scalar<uint32_t>("v.u32", MDL_GGUF_U32, 4000000000u);
  w.scalar<int32_t>("v.i32", MDL_GGUF_I32, -2000000000);
  w.scalar<float>("v.f32", MDL_GGUF_F32, 3.5f);
  w.scalar<uint8_t>("v.bool", MDL_GGUF_BOOL, 1);
  w.scalar<uint64_t>("v.u64", MDL_GGUF_U64, 1ull << 40);
  w.scalar<int64_t>("v.i64", MDL_GGUF_I64, -(1ll << 50));
  w.scalar<double>("v.f64", MDL_GGUF_F64, 0.25);
  w.scalar<uint64_t>("v.u64big", MDL_GGUF_U64, ~0ull);
  w.str("v.empty", "");
  w.arr<int32_t>("a.i32", MDL_GGUF_I32, {1, -2, 3});
  w.arr<float>("a.f32", MDL_GGUF_F32, {0.5f, -1.5f});
  w.arr<uint8_t>("a.u8", MDL_GGUF_U8, {});
  w.arr_str("a.str", {"hello", "", "w\xc3\xb6rld"});
  // array of arrays: [[1,2],[3]] of u16
  {
    std::vector<uint8_t> v;
    GgufWriter::put<uint32_t>(v, MDL_GGUF_ARR);
    GgufWriter::put<uint64_t>(v, 2);
    GgufWriter::put<uint32_t>(v, MDL_GGUF_U16);
    GgufWriter::put<uint64_t>(v, 2);
    GgufWriter::put<uint16_t>(v, 1);
    GgufWriter::put<uint16_t>(v, 2);
    GgufWriter::put<uint32_t>(v, MDL_GGUF_STR);
    GgufWriter::put<uint64_t>(v, 1);
    GgufWriter::put_str(v, "x");
    w.raw_kv("a.nested", MDL_GGUF_ARR, v);
  }
  w.scalar<int32_t>("v.after", MDL_GGUF_I32, 77);
  w.tensor("tok.f32", {4, 2}, KRN_F32, 32);
  w.tensor("tok.f16", {8}, KRN_F16, 16);
  w.tensor("w.q4_0", {32, 3}, KRN_Q4_0, 3 * 18);
  w.tensor("w.q4_1", {64}, KRN_Q4_1, 2 * 20);
  w.tensor("w.q8_0", {32, 1, 2}, KRN_Q8_0, 2 * 34);
  return w;
}

struct Opened {
  mdl_gguf *g = nullptr;
  std::vector<uint8_t> buf;
  char err[256] = {0};
  int rc = 0;
  explicit Opened(std::vector<uint8_t> b) : buf(std::move(b)) {
    rc = mdl_gguf_from_memory(buf.data(), buf.size(), &g, err, sizeof err);
  }
  ~Opened() { mdl_gguf_close(g); }
};

std::string S(mdl_str s) { return std::string(s.p, s.n); }

} // namespace

TEST(Gguf, RoundTripAllValueTypes) {
  Opened o(sample().bytes());
  ASSERT_EQ(o.rc, 0) << o.err;
  mdl_gguf *g = o.g;
  EXPECT_EQ(g->version, 3u);
  EXPECT_EQ(g->alignment, 32u);
  int64_t i;
  float f;
  mdl_str s;
  ASSERT_EQ(mdl_gguf_get_str(g, "general.architecture", &s), 0);
  EXPECT_EQ(S(s), "llama");
  ASSERT_EQ(mdl_gguf_get_i64(g, "v.u8", &i), 0); EXPECT_EQ(i, 200);
  ASSERT_EQ(mdl_gguf_get_i64(g, "v.i8", &i), 0); EXPECT_EQ(i, -100);
  ASSERT_EQ(mdl_gguf_get_i64(g, "v.u16", &i), 0); EXPECT_EQ(i, 60000);
  ASSERT_EQ(mdl_gguf_get_i64(g, "v.i16", &i), 0); EXPECT_EQ(i, -30000);
  ASSERT_EQ(mdl_gguf_get_i64(g, "v.u32", &i), 0); EXPECT_EQ(i, 4000000000ll);
  ASSERT_EQ(mdl_gguf_get_i64(g, "v.i32", &i), 0); EXPECT_EQ(i, -2000000000);
  ASSERT_EQ(mdl_gguf_get_i64(g, "v.u64", &i), 0); EXPECT_EQ(i, 1ll << 40);
  ASSERT_EQ(mdl_gguf_get_i64(g, "v.i64", &i), 0); EXPECT_EQ(i, -(1ll << 50));
  EXPECT_EQ(mdl_gguf_get_i64(g, "v.u64big", &i), -1); // does not fit int64
  EXPECT_EQ(mdl_gguf_get_i64(g, "v.f32", &i), -1);    // wrong type
  EXPECT_EQ(mdl_gguf_get_i64(g, "nope", &i), -1);
  ASSERT_EQ(mdl_gguf_get_f32(g, "v.f32", &f), 0); EXPECT_EQ(f, 3.5f);
  ASSERT_EQ(mdl_gguf_get_f32(g, "v.f64", &f), 0); EXPECT_EQ(f, 0.25f);
  EXPECT_EQ(mdl_gguf_get_f32(g, "v.i32", &f), -1);
  EXPECT_EQ(mdl_gguf_get_str(g, "v.i32", &s), -1);
  ASSERT_EQ(mdl_gguf_get_str(g, "v.empty", &s), 0); EXPECT_EQ(s.n, 0u);
  const mdl_gguf_kv *b = mdl_gguf_find(g, "v.bool");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, MDL_GGUF_BOOL);
  EXPECT_EQ(b->val[0], 1);

  const mdl_gguf_kv *a = mdl_gguf_find(g, "a.i32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->type, MDL_GGUF_ARR);
  EXPECT_EQ(a->arr_type, MDL_GGUF_I32);
  ASSERT_EQ(a->arr_n, 3u);
  ASSERT_EQ(mdl_gguf_arr_i64(a, 1, &i), 0); EXPECT_EQ(i, -2);
  ASSERT_EQ(mdl_gguf_arr_i64(a, 2, &i), 0); EXPECT_EQ(i, 3);
  EXPECT_EQ(mdl_gguf_arr_i64(a, 3, &i), -1);
  EXPECT_EQ(mdl_gguf_arr_str(a, 0, &s), -1);
  a = mdl_gguf_find(g, "a.f32");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(mdl_gguf_arr_f32(a, 1, &f), 0); EXPECT_EQ(f, -1.5f);
  a = mdl_gguf_find(g, "a.u8");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->arr_n, 0u);
  EXPECT_EQ(mdl_gguf_arr_i64(a, 0, &i), -1);
  a = mdl_gguf_find(g, "a.str");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->arr_n, 3u);
  ASSERT_EQ(mdl_gguf_arr_str(a, 0, &s), 0); EXPECT_EQ(S(s), "hello");
  ASSERT_EQ(mdl_gguf_arr_str(a, 1, &s), 0); EXPECT_EQ(S(s), "");
  ASSERT_EQ(mdl_gguf_arr_str(a, 2, &s), 0); EXPECT_EQ(S(s), "w\xc3\xb6rld");
  EXPECT_EQ(mdl_gguf_arr_str(a, 3, &s), -1);
  a = mdl_gguf_find(g, "a.nested");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->arr_type, MDL_GGUF_ARR);
  EXPECT_EQ(a->arr_n, 2u);
  EXPECT_EQ(mdl_gguf_arr_i64(a, 0, &i), -1);
  ASSERT_EQ(mdl_gguf_get_i64(g, "v.after", &i), 0); // parsing resumed correctly after the nested array
  EXPECT_EQ(i, 77);

  ASSERT_EQ(g->n_tensors, 5u);
  const mdl_gguf_tensor *t = mdl_gguf_tensor_find(g, "tok.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_dims, 2);
  EXPECT_EQ(t->ne[0], 4);
  EXPECT_EQ(t->ne[1], 2);
  EXPECT_EQ(t->ne[2], 1);
  EXPECT_EQ(t->type, KRN_F32);
  EXPECT_EQ(t->nbytes, 32u);
  EXPECT_EQ(((uintptr_t)t->data - (uintptr_t)g->base) % 32, 0u);
  EXPECT_EQ(((const uint8_t *)t->data)[5], 35); // data in place
  t = mdl_gguf_tensor_find(g, "w.q4_0");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->nbytes, 54u);
  EXPECT_GE((const uint8_t *)t->data, o.buf.data());
  EXPECT_LE((const uint8_t *)t->data + t->nbytes, o.buf.data() + o.buf.size());
  EXPECT_EQ(((const uint8_t *)t->data)[1], (uint8_t)(7 + 2));
  EXPECT_EQ(mdl_gguf_tensor_find(g, "w.q4_1")->nbytes, 40u);
  EXPECT_EQ(mdl_gguf_tensor_find(g, "w.q8_0")->nbytes, 68u);
  EXPECT_EQ(mdl_gguf_tensor_find(g, "tok.f16")->nbytes, 16u);
  EXPECT_EQ(mdl_gguf_tensor_find(g, "missing"), nullptr);
}

TEST(Gguf, Version2AndCustomAlignment) {
  GgufWriter w = sample();
  w.version = 2;
  w.alignment = 64;
  w.scalar<uint32_t>("general.alignment", MDL_GGUF_U32, 64);
  Opened o(w.bytes());
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.g->version, 2u);
  EXPECT_EQ(o.g->alignment, 64u);
  for (uint64_t i = 0; i < o.g->n_tensors; i++)
    EXPECT_EQ(((uintptr_t)o.g->tensors[i].data - (uintptr_t)o.g->base) % 64, 0u);
}

TEST(Gguf, OpenFromFileAndMissingFile) {
  std::vector<uint8_t> b = sample().bytes();
  char path[] = "/tmp/dserve_gguf_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, b.data(), b.size()), (ssize_t)b.size());
  close(fd);
  mdl_gguf *g = nullptr;
  char err[256];
  ASSERT_EQ(mdl_gguf_open(path, &g, err, sizeof err), 0) << err;
  EXPECT_EQ(g->mapped, 1);
  EXPECT_EQ(g->n_tensors, 5u);
  mdl_gguf_close(g);
  unlink(path);
  EXPECT_LT(mdl_gguf_open(path, &g, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("No such file"), std::string::npos) << err;
  EXPECT_EQ(g, nullptr);
  mdl_gguf_close(nullptr);
}

static std::string open_err(const std::vector<uint8_t> &b) {
  Opened o(b);
  EXPECT_LT(o.rc, 0);
  EXPECT_EQ(o.g, nullptr);
  return o.err;
}

TEST(Gguf, RefusesBadHeaders) {
  std::vector<uint8_t> b = sample().bytes();
  auto c = b;
  c[0] = 'X';
  EXPECT_NE(open_err(c).find("magic"), std::string::npos);
  c = b;
  c[4] = 1; // version 1
  EXPECT_NE(open_err(c).find("version 1"), std::string::npos);
  c = b;
  c[4] = 4;
  EXPECT_NE(open_err(c).find("version 4"), std::string::npos);
  c = b;
  uint64_t huge = 1ull << 40;
  memcpy(&c[8], &huge, 8); // n_tensors
  EXPECT_NE(open_err(c).find("tensor count"), std::string::npos);
  c = b;
  memcpy(&c[16], &huge, 8); // n_kv
  EXPECT_NE(open_err(c).find("metadata count"), std::string::npos);
}

TEST(Gguf, RefusesUnsupportedTensorTypeByName) {
  GgufWriter w;
  w.tensor("blk.0.ffn_down.weight", {256}, 10 /* Q2_K */, 84);
  std::string e = open_err(w.bytes());
  EXPECT_NE(e.find("Q2_K"), std::string::npos) << e;
  EXPECT_NE(e.find("blk.0.ffn_down.weight"), std::string::npos) << e;
  GgufWriter w2;
  w2.tensor("x", {16}, KRN_Q8_0, 34); // row not a multiple of 32
  EXPECT_NE(open_err(w2.bytes()).find("multiple"), std::string::npos);
  GgufWriter w3;
  w3.tensor("x", {1, 2, 3, 4, 5}, KRN_F32, 480);
  EXPECT_NE(open_err(w3.bytes()).find("dimensions"), std::string::npos);
}

TEST(Gguf, RefusesBadAlignmentDupsAndHugeTensors) {
  GgufWriter w;
  w.scalar<uint32_t>("general.alignment", MDL_GGUF_U32, 48);
  EXPECT_NE(open_err(w.bytes()).find("alignment"), std::string::npos);
  GgufWriter w2;
  w2.scalar<uint32_t>("k", MDL_GGUF_U32, 1);
  w2.scalar<uint32_t>("k", MDL_GGUF_U32, 2);
  EXPECT_NE(open_err(w2.bytes()).find("duplicate"), std::string::npos);
  GgufWriter w3;
  w3.tensor("t", {4}, KRN_F32, 16);
  w3.tensor("t", {4}, KRN_F32, 16);
  EXPECT_NE(open_err(w3.bytes()).find("duplicate"), std::string::npos);
  GgufWriter w4;
  w4.tensor("t", {1ll << 40, 1ll << 30}, KRN_F32, 16); // size overflows
  EXPECT_NE(open_err(w4.bytes()).find("overflow"), std::string::npos);
  GgufWriter w5;
  w5.tensor("t", {1024}, KRN_F32, 16); // claims more data than the file has
  EXPECT_NE(open_err(w5.bytes()).find("past the end"), std::string::npos);
  GgufWriter w6; // unknown metadata value type
  w6.raw_kv("bad", 13, {0, 0, 0, 0});
  EXPECT_NE(open_err(w6.bytes()).find("unknown value type"), std::string::npos);
  GgufWriter w7; // arrays nested deeper than the reader accepts
  std::vector<uint8_t> v;
  for (int d = 0; d < 20; d++) {
    GgufWriter::put<uint32_t>(v, MDL_GGUF_ARR);
    GgufWriter::put<uint64_t>(v, 1);
  }
  GgufWriter::put<uint32_t>(v, MDL_GGUF_U8);
  GgufWriter::put<uint64_t>(v, 0);
  w7.raw_kv("deep", MDL_GGUF_ARR, v);
  EXPECT_NE(open_err(w7.bytes()).find("nested"), std::string::npos);
  GgufWriter w8; // array of strings with a huge count
  std::vector<uint8_t> v8;
  GgufWriter::put<uint32_t>(v8, MDL_GGUF_STR);
  GgufWriter::put<uint64_t>(v8, 1ull << 61);
  w8.raw_kv("strs", MDL_GGUF_ARR, v8);
  EXPECT_NE(open_err(w8.bytes()).find("past the end"), std::string::npos);
}

TEST(Gguf, MisalignedTensorOffsetRefused) {
  GgufWriter w;
  w.tensor("t", {4}, KRN_F32, 16);
  std::vector<uint8_t> b = w.bytes();
  // the offset field is the 8 bytes before the end of the (only) tensor info
  size_t info_end = 24 + 8 + 1 + 4 + 8 + 4 + 8;
  uint64_t off = 4;
  memcpy(&b[info_end - 8], &off, 8);
  EXPECT_NE(open_err(b).find("aligned"), std::string::npos);
}

TEST(Gguf, TruncatedAtEveryOffsetGivesError) {
  std::vector<uint8_t> b = sample().bytes();
  for (size_t n = 0; n < b.size(); n++) {
    // a fresh heap copy of exactly n bytes, so that ASan sees any read past the end
    std::vector<uint8_t> c(b.begin(), b.begin() + n);
    mdl_gguf *g = nullptr;
    char err[256] = {0};
    int rc = mdl_gguf_from_memory(n ? c.data() : nullptr, n, &g, err, sizeof err);
    // the file ends with the last tensor's data, so any cut loses bytes something needs
    EXPECT_LT(rc, 0) << "truncated at " << n;
    EXPECT_NE(err[0], 0) << "no message at " << n;
    mdl_gguf_close(g);
  }
}

TEST(Gguf, RandomBitFlipsNeverCrash) {
  std::vector<uint8_t> b = sample().bytes();
  std::mt19937 rng(12345);
  int ok = 0, bad = 0;
  for (int it = 0; it < 400; it++) {
    std::vector<uint8_t> c = b;
    int flips = 1 + (int)(rng() % 4);
    for (int k = 0; k < flips; k++) {
      size_t pos = rng() % c.size();
      c[pos] ^= (uint8_t)(1u << (rng() % 8));
    }
    mdl_gguf *g = nullptr;
    char err[256] = {0};
    int rc = mdl_gguf_from_memory(c.data(), c.size(), &g, err, sizeof err);
    if (rc == 0) {
      ok++;
      // everything the reader hands out must lie inside the buffer
      for (uint64_t i = 0; i < g->n_tensors; i++) {
        const mdl_gguf_tensor &t = g->tensors[i];
        ASSERT_GE((const uint8_t *)t.data, c.data());
        ASSERT_LE((const uint8_t *)t.data + t.nbytes, c.data() + c.size());
      }
      for (uint64_t i = 0; i < g->n_kv; i++) {
        const mdl_gguf_kv &kv = g->kv[i];
        mdl_str s;
        for (uint64_t j = 0; kv.type == MDL_GGUF_ARR && kv.arr_type == MDL_GGUF_STR && j < kv.arr_n; j++) {
          ASSERT_EQ(mdl_gguf_arr_str(&kv, j, &s), 0);
          ASSERT_LE((const uint8_t *)s.p + s.n, c.data() + c.size());
        }
      }
      mdl_gguf_close(g);
    } else {
      bad++;
      EXPECT_NE(err[0], 0);
    }
  }
  EXPECT_GT(bad, 0);
  EXPECT_GT(ok, 0);
}

TEST(Gguf, RealModelOpens) {
  const char *path = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_EQ(access(path, R_OK), 0) << "the real model is missing: " << path << " (run scripts/setup.sh)";
  mdl_gguf *g = nullptr;
  char err[256];
  ASSERT_EQ(mdl_gguf_open(path, &g, err, sizeof err), 0) << err;
  mdl_str s;
  ASSERT_EQ(mdl_gguf_get_str(g, "general.architecture", &s), 0);
  EXPECT_EQ(S(s), "llama");
  int64_t n;
  ASSERT_EQ(mdl_gguf_get_i64(g, "llama.block_count", &n), 0);
  EXPECT_EQ(n, 30);
  const mdl_gguf_tensor *t = mdl_gguf_tensor_find(g, "token_embd.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne[0], 576);
  EXPECT_EQ(t->ne[1], 49152);
  const mdl_gguf_kv *tok = mdl_gguf_find(g, "tokenizer.ggml.tokens");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->arr_n, 49152u);
  mdl_gguf_close(g);
}
