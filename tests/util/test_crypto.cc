// tests/util/test_crypto.cc: util/crypto.h against published vectors (SHA-256, HMAC, HKDF, base64), and sealing:
// round trips, and a changed, repeated, dropped or reordered message failing to open.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "util/crypto.h"

namespace {

std::string hex(const uint8_t *p, size_t n) {
  std::string s(2 * n + 1, 0);
  utl_hex(p, n, s.data());
  s.resize(2 * n);
  return s;
}

std::vector<uint8_t> unhex(const char *h) {
  std::vector<uint8_t> v;
  for (size_t i = 0; h[i] && h[i + 1]; i += 2) v.push_back((uint8_t)std::stoi(std::string(h + i, 2), nullptr, 16));
  return v;
}

TEST(Crypto, Sha256AndHmacVectors) {
  uint8_t d[32];
  utl_sha256("abc", 3, d);
  EXPECT_EQ(hex(d, 32), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // RFC 4231 test case 2, the message in two parts.
  const void *parts[2] = {"what do ya ", "want for nothing?"};
  size_t lens[2] = {11, 17};
  utl_hmac_sha256("Jefe", 4, parts, lens, 2, d);
  EXPECT_EQ(hex(d, 32), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // RFC 4231 test case 6: a 131-byte key (hashed first).
  std::vector<uint8_t> key(131, 0xaa);
  const char *m = "Test Using Larger Than Block-Size Key - Hash Key First";
  const void *p1[1] = {m};
  size_t l1[1] = {strlen(m)};
  utl_hmac_sha256(key.data(), key.size(), p1, l1, 1, d);
  EXPECT_EQ(hex(d, 32), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_TRUE(utl_ct_equal("abcd", "abcd", 4));
  EXPECT_FALSE(utl_ct_equal("abcd", "abce", 4));
}

TEST(Crypto, HkdfVector) { // RFC 5869 test case 1
  auto ikm = unhex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b");
  auto salt = unhex("000102030405060708090a0b0c");
  auto info = unhex("f0f1f2f3f4f5f6f7f8f9");
  uint8_t okm[42];
  ASSERT_EQ(utl_hkdf_sha256(ikm.data(), ikm.size(), salt.data(), salt.size(), info.data(), info.size(), okm, 42), 0);
  EXPECT_EQ(hex(okm, 42),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
}

TEST(Crypto, Base64RoundTripAndRefusals) {
  const char *vec[][2] = {{"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foobar", "Zm9vYmFy"}};
  for (auto &v : vec) {
    char *e = utl_base64_encode(v[0], strlen(v[0]));
    ASSERT_NE(e, nullptr);
    EXPECT_STREQ(e, v[1]);
    uint8_t *d = nullptr;
    size_t n = 99;
    ASSERT_EQ(utl_base64_decode(e, strlen(e), &d, &n), 0);
    EXPECT_EQ(n, strlen(v[0]));
    EXPECT_EQ(std::string((char *)d, n), v[0]);
    EXPECT_EQ(d[n], 0); // text reads as a C string
    free(d);
    free(e);
  }
  for (const char *bad : {"Zg=", "Z===", "Zm9v Zg==", " Zm9v", "Zm=v", "Zm9*", "=Zm9"}) {
    uint8_t *d = nullptr;
    size_t n = 0;
    EXPECT_EQ(utl_base64_decode(bad, strlen(bad), &d, &n), -1) << bad;
    EXPECT_EQ(d, nullptr);
  }
}

struct Pair {
  utl_seal *tx, *rx;
  Pair() {
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)i;
    tx = utl_seal_new(key, "c2l\0", 0);
    rx = utl_seal_new(key, "c2l\0", 1);
  }
  ~Pair() {
    utl_seal_free(tx);
    utl_seal_free(rx);
  }
};

// Seals msg with aad; returns ciphertext followed by the tag.
std::vector<uint8_t> seal(utl_seal *s, const std::string &aad, const std::string &msg) {
  std::vector<uint8_t> out(msg.size() + UTL_SEAL_TAG);
  EXPECT_EQ(utl_seal_begin(s, aad.data(), aad.size()), 0);
  EXPECT_EQ(utl_seal_update(s, msg.data(), msg.size(), out.data()), 0);
  EXPECT_EQ(utl_seal_end(s, out.data() + msg.size()), 0);
  return out;
}

int open_msg(utl_seal *s, const std::string &aad, std::vector<uint8_t> ct, std::string *msg) {
  size_t n = ct.size() - UTL_SEAL_TAG;
  std::string out(n, 0);
  if (utl_seal_begin(s, aad.data(), aad.size())) return -1;
  // In two pieces, in place: the opener takes a message as it arrives.
  if (utl_seal_update(s, ct.data(), n / 2, ct.data()) || utl_seal_update(s, ct.data() + n / 2, n - n / 2, ct.data() + n / 2))
    return -1;
  int rc = utl_seal_end(s, ct.data() + n);
  *msg = std::string((char *)ct.data(), n);
  return rc;
}

TEST(Seal, RoundTripsInOrder) {
  Pair p;
  for (int i = 0; i < 5; i++) {
    std::string m = "frame " + std::to_string(i) + std::string((size_t)i * 1000, 'x'), got;
    auto ct = seal(p.tx, "len", m);
    EXPECT_NE(std::string((char *)ct.data(), m.size()), m); // encrypted, not just signed
    ASSERT_EQ(open_msg(p.rx, "len", ct, &got), 0);
    EXPECT_EQ(got, m);
  }
  EXPECT_EQ(utl_seal_seq(p.tx), 5u);
  EXPECT_EQ(utl_seal_seq(p.rx), 5u);
}

TEST(Seal, ChangedRepeatedDroppedOrReorderedFailsToOpen) {
  std::string got;
  { // a flipped bit in the ciphertext, the tag or the additional data
    Pair p;
    auto ct = seal(p.tx, "aad", "hello world");
    ct[3] ^= 1;
    EXPECT_EQ(open_msg(p.rx, "aad", ct, &got), -1);
    Pair q;
    ct = seal(q.tx, "aad", "hello world");
    ct.back() ^= 0x80;
    EXPECT_EQ(open_msg(q.rx, "aad", ct, &got), -1);
    Pair r;
    ct = seal(r.tx, "aad", "hello world");
    EXPECT_EQ(open_msg(r.rx, "aae", ct, &got), -1);
  }
  { // a replayed message: the opener's sequence moved on
    Pair p;
    auto a = seal(p.tx, "", "first");
    ASSERT_EQ(open_msg(p.rx, "", a, &got), 0);
    EXPECT_EQ(open_msg(p.rx, "", a, &got), -1);
  }
  { // a dropped message, or two swapped
    Pair p;
    auto a = seal(p.tx, "", "first");
    auto b = seal(p.tx, "", "second");
    EXPECT_EQ(open_msg(p.rx, "", b, &got), -1);
    Pair q;
    a = seal(q.tx, "", "first");
    b = seal(q.tx, "", "second");
    (void)a;
    EXPECT_EQ(open_msg(q.rx, "", b, &got), -1);
  }
  { // the other direction's label, same key: a reflected message does not open
    uint8_t key[32] = {1};
    utl_seal *tx = utl_seal_new(key, "l2c\0", 0), *rx = utl_seal_new(key, "c2l\0", 1);
    auto a = seal(tx, "", "reflected");
    EXPECT_EQ(open_msg(rx, "", a, &got), -1);
    utl_seal_free(tx);
    utl_seal_free(rx);
  }
}

} // namespace
