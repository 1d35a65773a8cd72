// tests/models/gguf_writer.h: a small GGUF writer the models tests use to make tiny files of their own.
#ifndef DSERVE_TESTS_GGUF_WRITER_H
#define DSERVE_TESTS_GGUF_WRITER_H

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "models/gguf.h"
}

namespace dserve_test {

// GPT-2's printable stand-in for byte b (as byte-level BPE vocabularies spell it), as UTF-8.
inline std::string byte_char(int b) {
  auto keep = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255); };
  int cp = b;
  if (!keep(b)) {
    int k = 0;
    for (int x = 0; x < b; x++)
      if (!keep(x)) k++;
    cp = 256 + k;
  }
  std::string s;
  if (cp < 0x80) s += (char)cp;
  else {
    s += (char)(0xC0 | (cp >> 6));
    s += (char)(0x80 | (cp & 0x3F));
  }
  return s;
}

// A small GGUF writer: metadata values and tensors appended in order, bytes out.
struct GgufWriter {
  uint32_t version = 3;
  uint64_t alignment = 32;
  std::vector<uint8_t> kvs;
  uint64_t n_kv = 0;
  struct T {
    std::string name;
    std::vector<int64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
  };
  std::vector<T> tensors;

  template <class V> static void put(std::vector<uint8_t> &b, V v) {
    uint8_t tmp[sizeof(V)];
    memcpy(tmp, &v, sizeof(V));
    b.insert(b.end(), tmp, tmp + sizeof(V));
  }
  static void put_str(std::vector<uint8_t> &b, const std::string &s) {
    put<uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void key(const std::string &k, uint32_t type) {
    put_str(kvs, k);
    put<uint32_t>(kvs, type);
    n_kv++;
  }
  template <class V> void scalar(const std::string &k, uint32_t type, V v) {
    key(k, type);
    put<V>(kvs, v);
  }
  void str(const std::string &k, const std::string &v) {
    key(k, MDL_GGUF_STR);
    put_str(kvs, v);
  }
  template <class V> void arr(const std::string &k, uint32_t et, const std::vector<V> &v) {
    key(k, MDL_GGUF_ARR);
    put<uint32_t>(kvs, et);
    put<uint64_t>(kvs, v.size());
    for (auto x : v) put<V>(kvs, x);
  }
  void arr_str(const std::string &k, const std::vector<std::string> &v) {
    key(k, MDL_GGUF_ARR);
    put<uint32_t>(kvs, MDL_GGUF_STR);
    put<uint64_t>(kvs, v.size());
    for (auto &x : v) put_str(kvs, x);
  }
  void raw_kv(const std::string &k, uint32_t type, const std::vector<uint8_t> &valbytes) {
    key(k, type);
    kvs.insert(kvs.end(), valbytes.begin(), valbytes.end());
  }
  void tensor(const std::string &name, std::vector<int64_t> ne, uint32_t type, size_t nbytes) {
    T t{name, ne, type, std::vector<uint8_t>(nbytes)};
    for (size_t i = 0; i < nbytes; i++) t.data[i] = (uint8_t)(i * 7 + tensors.size());
    tensors.push_back(t);
  }
  // An F32 tensor's values by name (nullptr when absent), for tests' references.
  const float *f32(const std::string &name) const {
    for (auto &t : tensors)
      if (t.name == name) return reinterpret_cast<const float *>(t.data.data());
    return nullptr;
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> b;
    static const char magic[4] = {'G', 'G', 'U', 'F'};
    for (char ch : magic) b.push_back((uint8_t)ch);
    put<uint32_t>(b, version);
    put<uint64_t>(b, tensors.size());
    put<uint64_t>(b, n_kv);
    b.insert(b.end(), kvs.begin(), kvs.end());
    uint64_t off = 0;
    std::vector<uint64_t> offs;
    for (auto &t : tensors) {
      put_str(b, t.name);
      put<uint32_t>(b, (uint32_t)t.ne.size());
      for (auto d : t.ne) put<uint64_t>(b, (uint64_t)d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, off);
      offs.push_back(off);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (b.size() % alignment) b.push_back(0);
    size_t ds = b.size();
    for (size_t i = 0; i < tensors.size(); i++) {
      b.resize(ds + offs[i], 0);
      b.insert(b.end(), tensors[i].data.begin(), tensors[i].data.end());
    }
    return b;
  }
};

// GGUF bytes in a temporary file, removed with this (for the commands that read a path).
struct TempGguf {
  std::string path;
  explicit TempGguf(const std::vector<uint8_t> &b) {
    char tmpl[] = "/tmp/dserve_gguf_XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) return;
    path = tmpl;
    bool ok = write(fd, b.data(), b.size()) == (ssize_t)b.size();
    close(fd);
    if (!ok) path.clear();
  }
  ~TempGguf() {
    if (!path.empty()) unlink(path.c_str());
  }
};

} // namespace dserve_test
#endif
